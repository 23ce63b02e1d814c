package main

// What an attacker and a careless operator found (the hardening issue), each
// reproduced with real processes and files.

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With its -wal file removed a server would lose every write acknowledged after: writes and /healthz
// answer 503, an ERROR line says to stop with SIGTERM, whose checkpoint saves what was written.
func TestRemovedWALRefusesWritesAndSIGTERMSavesThem(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "wal.db")
	key := mintKeyCLI(t, dbPath, "acme")
	child := startChild(t, dbPath)
	client := newTestClient()
	saved, err := callAPI(client, "POST", child.url+"/product-payment/create", key, createBody(nil))
	if err != nil || saved.status != 200 {
		t.Fatalf("create: got %v (%v)", saved.status, err)
	}
	if err := os.Remove(dbPath + "-wal"); err != nil {
		t.Fatal(err)
	}
	r, err := callAPI(client, "POST", child.url+"/product-payment/create", key, createBody(nil))
	if err != nil || r.status != 503 || r.env.Code != "unavailable" {
		t.Errorf("create after the WAL was removed: got %v %s (%v), want 503", r.status, r.raw, err)
	}
	if r, err := callAPI(client, "GET", child.url+"/healthz", "", ""); err != nil || r.status != 503 {
		t.Errorf("healthz after the WAL was removed: got %v (%v), want 503", r.status, err)
	}
	child.cmd.Process.Signal(syscall.SIGTERM)
	<-child.done
	if logs := child.log.String(); !regexp.MustCompile(`level=ERROR .*Stop the server with SIGTERM`).MatchString(logs) {
		t.Errorf("got logs without an ERROR line saying to stop with SIGTERM:\n%s", logs)
	}
	get := startChild(t, dbPath).url + "/product-payment/get/" + saved.dataString()
	if r, err := callAPI(client, "GET", get, key, ""); err != nil || r.status != 200 {
		t.Errorf("the create answered before the WAL went, after SIGTERM and a restart: got %v (%v)", r.status, err)
	}
}

// Failed authentication is limited per client address: past a burst of 100, a request without a valid key
// gets 429 at once; a valid key keeps working from that address at once. Connections past
// -max-conns are closed at once.
func TestFailedAuthenticationAndConnectionsAreLimited(t *testing.T) {
	e := newTestServer(t)
	var r response
	var start time.Time
	failed := -1
	for r.status = 401; failed < 200 && r.status == 401; failed++ {
		start = time.Now()
		r = e.do("GET", "/product-payment/list", fmt.Sprint("pbk_wrong", failed), "")
	}
	if took := time.Since(start); failed < 100 || r.status != 429 || r.header.Get("Retry-After") != "1" || took > 500*time.Millisecond {
		t.Errorf("unknown keys: got %d 401s, then %d with Retry-After %q after %v; want 100 or more, then 429 at once",
			failed, r.status, r.header.Get("Retry-After"), took)
	}
	start = time.Now()
	e.do("GET", "/product-payment/list", e.key, "").want(t, 200, "") // the same address, a valid key
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("a valid key from the limited address took %v, want it answered without waiting", took)
	}

	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "conns.db"), "-max-conns", "2")
	addr := strings.TrimPrefix(srv.url, "http://")
	var open []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, c)
	}
	open[2].SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := open[2].Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("a third connection with -max-conns 2: got %d bytes, %v, want it closed at once", n, err)
	}
	open[0].Close()
	time.Sleep(100 * time.Millisecond) // the server sees the close
	if resp, err := http.Get(srv.url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("after a connection closed: got %v (%v), want a new one served", resp, err)
	}
}

// A SQLite file not ours is refused, Litestream's or an earlier paybuttons' adopted; check tells integrity_check.
func TestForeignAndDamagedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, schema string) string {
		path := filepath.Join(dir, name)
		db, _ := sql.Open("sqlite", path)
		defer db.Close()
		if _, err := db.Exec(schema); err != nil {
			t.Fatal(err)
		}
		return path
	}
	foreign := file("foreign.db", `CREATE TABLE notes (body TEXT)`)
	_, err := runCLI(t, nil, "keys", "create", "-account", "a", "-db", foreign)
	if err == nil || !strings.Contains(err.Error(), "not a paybuttons database") {
		t.Errorf("keys create on another program's file: got %v, want a refusal", err)
	}
	if out, err := runCLI(t, nil, "-db", foreign, "-addr", "127.0.0.1:0"); err == nil || exitStatus(err) != 1 {
		t.Errorf("serve on another program's file: got %q %v, want exit status 1", out, err)
	}
	litestream := file("litestream.db", `CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)`)
	earlier := file("earlier.db", migrations[0]+";"+migrations[1]+"; PRAGMA user_version = 2")
	for _, adopted := range []string{litestream, earlier} {
		if _, err := runCLI(t, nil, "keys", "create", "-account", "a", "-db", adopted); err != nil {
			t.Errorf("keys create on %s, which has Litestream's table only or an earlier schema: %v", adopted, err)
		}
	}
	var owner int
	db, _ := sql.Open("sqlite", earlier)
	db.QueryRow(`PRAGMA application_id`).Scan(&owner)
	db.Close()
	if owner != applicationID {
		t.Errorf("the earlier file after migrating: got application_id %#x, want %#x", owner, applicationID)
	}

	if out, err := runCLI(t, nil, "check", "-db", earlier); out != "ok\n" || err != nil {
		t.Errorf("check of a sound file: got %q %v, want ok", out, err)
	}
	data, _ := os.ReadFile(earlier)
	for i := 4096; i < 4096+512; i++ { // page 2's header and cells: a table's root
		data[i] ^= 0x5a
	}
	os.WriteFile(earlier, data, 0o600)
	if out, err := runCLI(t, nil, "check", "-db", earlier); out == "ok\n" || err == nil || exitStatus(err) != 1 {
		t.Errorf("check of a damaged file: got %q %v, want what is wrong and exit status 1", out, err)
	}
}

// healthz reads every table it serves from: one gone is a 503.
func TestHealthzReadsEveryTable(t *testing.T) {
	for _, table := range []string{"api_keys", "buttons", "button_history", "idempotency_keys", "change_counter"} {
		e := newTestServer(t)
		e.do("GET", "/healthz", "", "").want(t, 200, "")
		db, _ := sql.Open("sqlite", e.dbPath)
		if _, err := db.Exec("DROP TABLE " + table); err != nil {
			t.Fatal(err)
		}
		db.Close()
		e.do("GET", "/healthz", "", "").want(t, 503, "unavailable")
	}
}

// A backup killed halfway leaves nothing at its destination.
func TestKilledBackupLeavesNoHalfFile(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	err := e.store.write(context.Background(), func(tx *writeTx) error { // 20 MB to copy
		_, err := tx.exec(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 19999)
			INSERT INTO idempotency_keys SELECT 'acme', i, x'00', 200, randomblob(1000), '2099', 0 FROM n`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "copy.db")
	cmd := childCommand("backup", "-db", e.dbPath, dest)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for found, _ := filepath.Glob(dest + "*"); len(found) == 0; found, _ = filepath.Glob(dest + "*") {
		time.Sleep(time.Millisecond) // until the copy is under way, to dest or beside it
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("a killed backup left a file at its destination")
	}
	if _, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest); err != nil {
		t.Errorf("the next backup: %v", err)
	}
}
