package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// longTests says whether to run the load and many-cycle tests: CI sets
// PAYBUTTONS_LONG_TESTS=1; a plain go test skips them.
func longTests(t testing.TB) {
	t.Helper()
	if os.Getenv("PAYBUTTONS_LONG_TESTS") == "" {
		t.Skip("a long test: set PAYBUTTONS_LONG_TESTS=1 to run it")
	}
}

func openTestStore(t *testing.T) *store {
	t.Helper()
	st, err := openStore(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	t.Cleanup(func() { st.close(false) })
	return st
}

// holdWriter keeps the writer busy until the returned release is called, so
// that the writes sent meanwhile wait, and are then committed in one batch.
func holdWriter(st *store) (release func()) {
	held, done := make(chan struct{}), make(chan struct{})
	go st.write(context.Background(), func(*writeTx) error {
		close(held)
		<-done
		return nil
	})
	<-held
	return func() { close(done) }
}

// A fault in one write of a batch rolls back the writes before it, and every caller gets the fault.
func TestBatchFailsAsAUnit(t *testing.T) {
	st := openTestStore(t)
	boom := errors.New("boom")
	release := holdWriter(st)
	results := make([]error, 10)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i] = st.write(context.Background(), func(tx *writeTx) error {
				_, err := tx.exec(`INSERT INTO api_keys (id, account, secret_hash, created_at) VALUES (?, 'a', ?, 'now')`,
					fmt.Sprint("key_", i), []byte(fmt.Sprint(i)))
				if err == nil && i == 7 {
					err = boom
				}
				return err
			})
		})
	}
	time.Sleep(100 * time.Millisecond) // the writes queue behind the held writer; the checks do not depend on it
	release()
	wg.Wait()
	for i, err := range results {
		if !errors.Is(err, boom) {
			t.Errorf("write %d: got %v, want the batch's fault", i, err)
		}
	}
	var n int
	st.reader.QueryRow(`SELECT count(*) FROM api_keys`).Scan(&n)
	if n != 0 {
		t.Errorf("got %d rows after the failed batch, want none", n)
	}
}

// Button ids are well-formed and grow with time; validButtonID refuses any other shape.
func TestButtonIDsAreValidAndIncreasing(t *testing.T) {
	var g idGenerator
	prev := ""
	for range 10000 {
		id := g.next()
		if !validButtonID(id) || id <= prev {
			t.Fatalf("got %q after %q, want a valid id greater than the last", id, prev)
		}
		prev = id
	}
	for _, bad := range []string{"", "btn_", "btn_01JD00000000000000000000", "btn_01JD000000000000000000000U",
		"btn_81JD0000000000000000000000", "BTN_01JD0000000000000000000000", "btn_01jd0000000000000000000000"} {
		if validButtonID(bad) {
			t.Errorf("validButtonID(%q) = true, want false", bad)
		}
	}
}

// Under steady writes with reads beside them the WAL keeps starting over, not growing with every write.
func TestWALStaysSmallUnderReadsAndWrites(t *testing.T) {
	longTests(t) // a checkpointer on another connection once let it reach 250 MB in 12 s
	st := openTestStore(t)
	_, keyID, _ := st.createKey(context.Background(), "acme", false) // a write's key must be live
	who := actor{Account: "acme", KeyID: keyID, RequestID: "req_x"}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					st.listButtons(context.Background(), "acme", listFilter{Limit: 5, State: "all"})
				}
			}
		})
	}
	var writers sync.WaitGroup
	for w := range 16 {
		writers.Go(func() {
			for i := range 1250 {
				b := button{ProductName: fmt.Sprint("w", w, "-", i), AmountMinor: 100, Currency: "USD",
					PaymentMethod: "Stripe", PaymentType: "one_time", Description: "a description of some length"}
				if _, err := st.createButton(context.Background(), who, b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	info, err := os.Stat(st.path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// The writer checkpoints at 4000 pages (16 MB); a checkpoint that readers
	// keep from finishing lets it pass that for a while (25 MB seen); a WAL
	// that never starts over passes 80 MB here.
	if info.Size() > 48<<20 {
		t.Errorf("got a WAL of %d MB after 20,000 creates, want it to stay near 16 MB", info.Size()>>20)
	}
	t.Logf("WAL after 20,000 creates: %.1f MB", float64(info.Size())/(1<<20))
}

// A key's last use is written in the background, at most once a minute, so that reads do not each cost a write.
func TestLastUsedIsWrittenOnceAMinute(t *testing.T) {
	t.Parallel()
	st := openTestStore(t)
	secret, id, err := st.createKey(context.Background(), "acme", false)
	if err != nil {
		t.Fatal(err)
	}
	// use authenticates with the key and returns last_used_at once it is no longer was, or after 300 ms.
	use := func(was string) string {
		if _, _, err := st.authenticate(context.Background(), secret, ""); err != nil {
			t.Fatal(err)
		}
		var v sql.NullString
		for range 30 {
			if st.reader.QueryRow(`SELECT last_used_at FROM api_keys WHERE id = ?`, id).Scan(&v); v.String != was {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return v.String
	}
	first := use("")
	if first == "" {
		t.Fatal("got no last_used_at after a use, want one")
	}
	time.Sleep(5 * time.Millisecond)
	if again := use(first); again != first {
		t.Errorf("a second use within the minute wrote last_used_at again: got %s, want %s", again, first)
	}
}

// Closing a store closes every connection it opened, prepared statements' too: SQLite then removes the WAL.
func TestCloseLeavesNoConnectionOpen(t *testing.T) {
	// One left open made a server started after a crash trust the dead one's WAL index and lose its last
	// committed transaction (the crash test found it).
	path := filepath.Join(t.TempDir(), "close.db")
	st, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.createKey(context.Background(), "acme", false); err != nil {
		t.Fatal(err)
	}
	if keys, err := st.listKeys(context.Background()); err != nil || len(keys) != 1 {
		t.Fatalf("listKeys: got %v, %v", keys, err)
	}
	if err := st.close(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %s-wal after close (%v), want it removed with the last connection", path, err)
	}
}
