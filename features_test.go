package main

// Contract section 9: metadata, read-only keys, the change feed, paged
// history, one server per database file, metrics.

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second server on the same file refuses to start while the first serves on; keys and backup
// work beside it; after a kill -9 the next server starts without anything to clean up.
func TestOneServerPerDatabaseFile(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "one.db")
	key := mintKeyCLI(t, dbPath, "acme")
	first := startChild(t, dbPath)
	second := childCommand("serve", "-db", dbPath, "-addr", "127.0.0.1:0")
	var stderr strings.Builder
	second.Stderr = &stderr
	start := time.Now()
	second.Run()
	took, code, msg := time.Since(start), second.ProcessState.ExitCode(), strings.TrimSpace(stderr.String())
	if code != 1 || took > 5*time.Second || strings.Contains(msg, "\n") ||
		!strings.Contains(msg, "in use by another server") {
		t.Errorf("second serve: got exit %d after %v with %q, want 1 within 5 s and one line", code, took, msg)
	}
	r, err := callAPI(newTestClient(), "POST", first.url+"/product-payment/create", key, createBody(nil))
	if err != nil || r.status != 200 {
		t.Errorf("the first server after the refusal: got %v (%v), want it serving", r.status, err)
	}
	mintKeyCLI(t, dbPath, "beside")
	if _, err := runCLI(t, nil, "backup", "-db", dbPath, filepath.Join(t.TempDir(), "copy.db")); err != nil {
		t.Errorf("backup beside a running server: %v", err)
	}
	first.kill(t)
	startChild(t, dbPath) // fails the test unless it listens
}
