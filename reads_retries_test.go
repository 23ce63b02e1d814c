package main

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// backup under writes makes a sound copy of one moment, that serves; it never overwrites a file.
func TestBackupWhileWriting(t *testing.T) {
	e := newTestServer(t)
	before := e.create(e.key, createBody(nil))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				e.create(e.key, createBody(nil))
			}
		}
	})
	dest := filepath.Join(t.TempDir(), "copy.db")
	out, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest)
	close(stop)
	wg.Wait()
	if err != nil || !strings.Contains(out, dest) {
		t.Fatalf("backup: got %q, %v", out, err)
	}
	if _, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second backup to the same file: got %v, want a refusal", err)
	}
	copied, err := openStore(dest)
	if err != nil {
		t.Fatalf("open the copy: %v", err)
	}
	defer copied.close(false)
	var check string
	if err := copied.reader.QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check on the copy: %q, %v", check, err)
	}
	// Every button in the copy has its full history: the copy is one moment.
	all, _, err := copied.listButtons(context.Background(), "acme", listFilter{Limit: 1 << 30, State: "all"})
	if err != nil || len(all) == 0 {
		t.Fatalf("list the copy: got %d buttons, %v", len(all), err)
	}
	for _, b := range all {
		entries, more, err := copied.buttonHistory(context.Background(), "acme", b.ID, 0, 100)
		if err != nil || int64(len(entries)) != b.Version || more != nil || !reflect.DeepEqual(entries[len(entries)-1].After, b) {
			t.Errorf("button %s at version %d: got %d history entries (%v), want one a version ending in the button",
				b.ID, b.Version, len(entries), err)
		}
	}
	// The copy serves: the key and the button made before the backup are there.
	restored := &testEnv{t: t, url: serveStore(t, copied, config{providerName: "the service"}), store: copied}
	if v := restored.getView(e.key, before); v["id"] != before {
		t.Errorf("got %v from the restored server, want button %s", v["id"], before)
	}
	restored.create(e.key, createBody(nil))
}
