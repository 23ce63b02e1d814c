package main

// The program as a process: its commands, flags and environment; start-up and its refusals; one server per database
// file; the commands beside a server (keys, backup, check); TLS, the access log and shutdown.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// exited is how a child process ended: exit status (-1 if killed), output, and how long it ran.
type exited struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// runChild runs cmd (see childCommand) and says how it ended; a child still running after 6 s is killed.
func runChild(cmd *exec.Cmd) exited {
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(cmd.Env, "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0") // a -race child exits at once
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return exited{code: -1, stderr: err.Error()}
	}
	defer time.AfterFunc(6*time.Second, func() { cmd.Process.Kill() }).Stop()
	cmd.Wait()
	return exited{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String(), time.Since(start)}
}

// wantRefused fails the test unless the child exited 1 within 5 s with one line on stderr that says want.
func (e exited) wantRefused(t *testing.T, what, want string) {
	t.Helper()
	msg := strings.TrimSpace(e.stderr)
	if e.code != 1 || e.took > 5*time.Second || strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
		t.Errorf("%s: got exit %d after %v with %q, want 1 within 5 s and one line saying %q",
			what, e.code, e.took.Round(time.Millisecond), msg, want)
	}
}

// writeMeanwhile sends creates to the server at url, one after another, until the stop it returns is called; stop
// says how long the slowest took, and the first that failed ("" if none did).
func writeMeanwhile(url, key string) (stop func() (slowest time.Duration, failed string)) {
	quit, done := make(chan struct{}), make(chan struct{})
	var slowest time.Duration
	var failed string
	go func() {
		defer close(done)
		for client := newTestClient(); ; {
			select {
			case <-quit:
				return
			default:
			}
			start := time.Now()
			r, err := callAPI(client, "POST", url+"/product-payment/create", key, createBody(nil))
			if slowest = max(slowest, time.Since(start)); (err != nil || r.status != 200) && failed == "" {
				failed = fmt.Sprintf("%s: got %d (%v), want 200", r.request, r.status, err)
			}
		}
	}()
	return func() (time.Duration, string) { close(quit); <-done; return slowest, failed }
}

// --- the command line ---

// keys create prints only the key; list never shows a secret; revoke is repeatable, not for unknown ids.
func TestKeysCommands(t *testing.T) {
	db := filepath.Join(t.TempDir(), "keys.db")
	out, err := runCLI(t, nil, "keys", "create", "-account", "acme", "-db", db)
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key := strings.TrimSuffix(out, "\n")
	if !regexp.MustCompile(`^pbk_[A-Za-z0-9_-]{43}$`).MatchString(key) || strings.Count(out, "\n") != 1 {
		t.Fatalf("got keys create output %q, want only a pbk_ key of 43 URL-safe characters", out)
	}
	list, err := runCLI(t, nil, "keys", "list", "-db", db)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	fields := strings.Split(lines[0], "\t")
	if err != nil || len(lines) != 1 || !strings.HasPrefix(fields[0], "key_") || fields[1] != "acme" ||
		fields[2] != "read-write" || !strings.Contains(lines[0], "revoked never") || strings.Contains(list, key[4:]) {
		t.Fatalf("got keys list %q (%v), want one line: id, acme, read-write, created, last used, revoked never; "+
			"no secret", list, err)
	}
	_, err = runCLI(t, nil, "keys", "revoke", "-db", db, fields[0])
	revoked, _ := runCLI(t, nil, "keys", "list", "-db", db)
	_, again := runCLI(t, nil, "keys", "revoke", "-db", db, fields[0])
	_, unknown := runCLI(t, nil, "keys", "revoke", "-db", db, "key_unknown")
	if list, _ = runCLI(t, nil, "keys", "list", "-db", db); err != nil || strings.Contains(revoked, "revoked never") ||
		again != nil || list != revoked || unknown == nil || exitStatus(unknown) != 1 {
		t.Errorf("keys revoke: got %v, then %q; again %v, then %q; an unknown id %v; want a revoked time, a no-op, "+
			"and exit status 1", err, revoked, again, list, unknown)
	}
}

// PAYBUTTONS_<FLAG> stands in for a flag the command line does not give.
func TestEnvironmentFallbacks(t *testing.T) {
	dir := t.TempDir()
	fromEnv, fromFlag := filepath.Join(dir, "env.db"), filepath.Join(dir, "flag.db")
	env := map[string]string{"PAYBUTTONS_DB": fromEnv}
	for path, args := range map[string][]string{fromEnv: nil, fromFlag: {"-db", fromFlag}} { // a flag beats its variable
		_, err := runCLI(t, env, append([]string{"keys", "create", "-account", "a"}, args...)...)
		if _, statErr := os.Stat(path); err != nil || statErr != nil {
			t.Errorf("keys create %q with PAYBUTTONS_DB set: got %v, and %v for %s", args, err, statErr, path)
		}
	}
	for _, rate := range []string{"fast", "NaN", "Inf"} {
		_, err := runCLI(t, map[string]string{"PAYBUTTONS_RATE": rate}, "-db", fromFlag, "-addr", "192.0.2.1:1")
		if exitStatus(err) != 2 { // the address is not this machine's: a server that started would fail
			t.Errorf("PAYBUTTONS_RATE=%s: got %v, want a usage error", rate, err)
		}
	}
}

// Command-line mistakes are one-line errors: exit status 2 for usage, 1 for the rest.
func TestCommandLineErrors(t *testing.T) {
	dir := t.TempDir()
	notADB, k := filepath.Join(dir, "garbage.db"), filepath.Join(dir, "k.db")
	os.WriteFile(notADB, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	for _, tt := range []struct {
		name     string
		args     []string
		status   int
		contains string
	}{
		{"unknown flag", []string{"-bogus"}, 2, "bogus"},
		{"unknown command", []string{"frobnicate"}, 2, "frobnicate"},
		{"negative rate", []string{"-rate", "-1"}, 2, "-rate"},
		{"rate NaN", []string{"-rate", "NaN"}, 2, "-rate"},
		{"rate too small for a Retry-After", []string{"-rate", "0.00000000001"}, 2, "-rate"},
		{"burst 0", []string{"-burst", "0"}, 2, "-burst"},
		{"max-conns 0", []string{"-max-conns", "0"}, 2, "-max-conns"},
		{"port out of range", []string{"-addr", ":99999"}, 2, "-addr"},
		{"address without a port", []string{"-addr", "localhost"}, 2, "-addr"},
		{"check with an argument", []string{"check", "x"}, 2, "check"},
		{"check with a flag of keys create", []string{"check", "-account", "x"}, 2, "account"},
		{"backup without a destination", []string{"backup"}, 2, "DEST_FILE"},
		{"backup of no database", []string{"backup", "-db", filepath.Join(dir, "none.db"), "out.db"}, 1, "no database"},
		{"tls cert without key", []string{"-tls-cert", "c.pem"}, 2, "-tls-key"},
		{"keys without command", []string{"keys"}, 2, "create"},
		{"keys create without account", []string{"keys", "create", "-db", k}, 2, "-account"},
		{"account name with a space", []string{"keys", "create", "-account", "a b", "-db", k}, 2, "-account"},
		{"account name of 65 characters", []string{"keys", "create", "-account", strings.Repeat("a", 65), "-db", k},
			2, "-account"},
		{"missing directory", []string{"-db", filepath.Join(dir, "no", "such", "x.db")}, 1, "does not exist"},
		{"not a database", []string{"-db", notADB, "-addr", "192.0.2.1:1"}, 1, "not a SQLite database"},
		{"keys list without database", []string{"keys", "list", "-db", filepath.Join(dir, "none.db")}, 1, "no database"},
		{"bad address", []string{"-db", filepath.Join(dir, "p.db"), "-addr", "256.0.0.1:1"}, 1, ""},
	} {
		_, err := runCLI(t, nil, tt.args...)
		if err == nil || exitStatus(err) != tt.status || !strings.Contains(err.Error(), tt.contains) ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: args %q: got %v (status %d), want one line, status %d, mentioning %q",
				tt.name, tt.args, err, exitStatus(err), tt.status, tt.contains)
		}
	}
}

// A '?' or '#' in -db is part of the file's name, never the start of SQLite parameters: serve makes and uses that one
// file, and no other.
func TestDatabasePathIsOnlyAPath(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("'?' cannot be part of a Windows file name")
	}
	t.Parallel()
	dir, name := t.TempDir(), "pay?mode=memory#x.db"
	startRun(t, "-db", filepath.Join(dir, name))
	if out, err := runCLI(t, nil, "keys", "list", "-db", filepath.Join(dir, name)); strings.Count(out, "\n") != 1 {
		t.Errorf("keys list on %q: got %q (%v), want the one key serve minted", name, out, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, entry := range entries {
		if !strings.HasPrefix(entry.Name(), name) {
			t.Errorf("got a file %q beside the database, want only %q and its -wal, -shm, -lock", entry.Name(), name)
		}
	}
}

// --- start-up and shutdown ---

// A start that cannot listen mints no key; the next, at -log-level warn, prints one but no info line.
func TestFailedStartMintsNoKeyAndWarnLevelHidesInfo(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, db := ln.Addr().String(), filepath.Join(t.TempDir(), "first.db")
	_, err = runCLI(t, nil, "-db", db, "-addr", addr)
	if list, _ := runCLI(t, nil, "keys", "list", "-db", db); err == nil || list != "" {
		t.Errorf("a start on a busy port: got %v, and keys %q; want an error and no key", err, list)
	}
	// At warn the listening line is hidden too, so the next start takes the port just freed.
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	quiet, done := &syncBuffer{}, make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"paybuttons", "-addr", addr, "-db", db, "-log-level", "warn"},
			func(string) string { return "" }, io.Discard, quiet)
	}()
	var r response
	waitFor(t, "the server to answer", func() bool {
		r, err = callAPI(http.DefaultClient, "GET", "http://"+addr+"/healthz", "", "")
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	logs := quiet.String()
	if r.status != 200 || strings.Contains(logs, "msg=request") || strings.Contains(logs, "msg=listening") ||
		!strings.Contains(logs, "pbk_") {
		t.Errorf("got status %d and, at -log-level warn, info lines or no key:\n%s", r.status, logs)
	}
}

// The JSON access line names route, status, size, request id and key id, never the key. A start on a file that has a
// key mints none (it would print a line that is not JSON), and once run returns, the port is closed.
func TestAccessLogNamesTheKeyIDNeverTheKey(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "log.db")
	key := mintKeyCLI(t, db, "acme")
	list, _ := runCLI(t, nil, "keys", "list", "-db", db)
	srv := startRun(t, "-db", db, "-log-format", "json")
	r, err := callAPI(http.DefaultClient, "POST", srv.url+"/product-payment/create", key, createBody(nil),
		"X-Request-Id", "trace-7")
	if stopErr := srv.stop(); err != nil || stopErr != nil {
		t.Fatalf("create, then stop: got %v, %v", err, stopErr)
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://")); err == nil {
		t.Error("the port still accepts connections after run returned")
	}
	logs := srv.stderr.String()
	if strings.Contains(logs, key[4:]) {
		t.Fatalf("the key appears in the logs:\n%s", logs)
	}
	var access map[string]any
	var messages []string
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("got a log line that is not JSON: %q", line)
		}
		if messages = append(messages, fmt.Sprint(entry["msg"])); entry["msg"] == "request" {
			access = entry
		}
	}
	for k, v := range map[string]any{"method": "POST", "route": "POST /product-payment/create", "status": 200.0,
		"bytes": float64(len(r.raw)), "requestId": "trace-7", "keyId": strings.Fields(list)[0]} {
		if access[k] != v {
			t.Errorf("access line %s: got %v, want %v", k, access[k], v)
		}
	}
	if got := strings.Join(messages, ","); got != "listening,request,shutting down,stopped" || access["duration"] == nil {
		t.Errorf("got log messages %s, the access line %v; want start-up, the request with a duration, shutdown",
			got, access)
	}
}

// -tls-cert and -tls-key serve HTTPS, never older than TLS 1.2.
func TestServesTLS(t *testing.T) {
	t.Parallel()
	ts := httptest.NewTLSServer(http.NotFoundHandler()) // for a certificate of 127.0.0.1 and a client that trusts it
	defer ts.Close()
	keyDER, err := x509.MarshalPKCS8PrivateKey(ts.TLS.Certificates[0].PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	srv := startRun(t, "-db", filepath.Join(dir, "tls.db"), "-tls-cert", certFile, "-tls-key", keyFile)
	if !strings.HasPrefix(srv.url, "https://") {
		t.Fatalf("got url %q, want https", srv.url)
	}
	resp, err := ts.Client().Get(srv.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Errorf("got status %d over %v, want 200 over TLS 1.2 or later", resp.StatusCode, resp.TLS)
	}
	old := ts.Client().Transport.(*http.Transport).Clone()
	// A client offers TLS 1.1 only if told: Go's own floor is 1.2.
	old.TLSClientConfig.MinVersion, old.TLSClientConfig.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if resp, err := (&http.Client{Transport: old}).Get(srv.url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("a TLS 1.1 client was served")
	}
}

// SIGTERM while a client does not read its large answer: after Shutdown's 10 s its connection is cut off, a warning
// says so, and the process exits 0 with the database closed cleanly.
func TestSIGTERMExits0WhenAClientDoesNotRead(t *testing.T) {
	longTests(t) // shutdown waits 10 s for the client
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGTERM")
	}
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "term.db")
	key := mintKeyCLI(t, dbPath, "acme")
	child, client := startChild(t, dbPath), newTestClient()
	created, _ := callAPI(client, "POST", child.url+"/product-payment/create", key, createBody(nil))
	for version := range 100 { // each changes 50 values of 1 KB: the history page of 100 versions is 10 MB
		values := map[string]string{}
		for i := range 50 {
			values[fmt.Sprint("k", i)] = strings.Repeat(string(rune('à'+version%2)), 500)
		}
		body, _ := json.Marshal(map[string]any{"metadata": values})
		if r, err := callAPI(client, "POST", child.url+"/product-payment/update/"+created.dataString(), key,
			string(body)); err != nil || r.status != 200 {
			t.Fatalf("%s: got %d (%v), want 200", r.request, r.status, err)
		}
	}
	conn := dialRaw(t, child.addr)
	conn.Conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET /product-payment/history/%s HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n\r\n",
		created.dataString(), key)
	// Its first byte says the server is writing the answer, far larger than the buffers between: its write blocks.
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	child.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-child.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20 s after SIGTERM:\n%s", child.log)
	}
	logs := child.log.String()
	if code, took := child.cmd.ProcessState.ExitCode(), time.Since(start); code != 0 || took < 9*time.Second ||
		!regexp.MustCompile(`level=WARN msg="cut off the connections`).MatchString(logs) {
		t.Errorf("got exit status %d after %v, want 0 after 10 s, and a warning that a connection was cut off:\n%s",
			code, took, logs)
	}
	if out, err := runCLI(t, nil, "check", "-db", dbPath); out != "ok\n" || err != nil {
		t.Errorf("check after SIGTERM: got %q (%v), want ok", out, err)
	}
}

// --- one server per database file ---

// One server per database file, whatever name reaches it: a second serve on the same path, through a symlink, through
// a hard link, or after the lock file was removed exits 1 within 5 s with one line, and the first serves on. A file
// with two names is refused with no server running; after a kill -9 the next server starts.
func TestOneServerPerDatabaseFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath, symlink, hardLink := filepath.Join(dir, "one.db"), filepath.Join(dir, "sym.db"), filepath.Join(dir, "hard.db")
	key := mintKeyCLI(t, dbPath, "acme")
	first, client := startChild(t, dbPath), newTestClient()
	refused := func(name, path, want string) {
		t.Helper()
		runChild(childCommand("serve", "-db", path, "-addr", "127.0.0.1:0")).wantRefused(t, name, want)
		if r, err := callAPI(client, "POST", first.url+"/product-payment/create", key, createBody(nil)); err != nil ||
			r.status != 200 {
			t.Errorf("the first server after a second serve on %s: got %d (%v), want 200", name, r.status, err)
		}
	}
	refused("the same path", dbPath, "is in use by another server")
	if err := os.Symlink(dbPath, symlink); err != nil {
		t.Fatal(err)
	}
	refused("a symlink", symlink, "is in use by another server")
	if err := os.Link(dbPath, hardLink); err != nil {
		t.Fatal(err)
	}
	refused("a hard link", hardLink, "has 2 hard links")
	os.Remove(hardLink)
	if err := os.Remove(dbPath + "-lock"); err != nil {
		t.Fatal(err)
	}
	refused("the path, its lock file removed", dbPath, "is in use by another server")
	first.kill(t)
	if err := os.Link(dbPath, hardLink); err != nil {
		t.Fatal(err)
	}
	runChild(childCommand("serve", "-db", dbPath, "-addr", "127.0.0.1:0")).wantRefused(t,
		"serve on a file with two names, no server running", "has 2 hard links")
	os.Remove(hardLink)
	startChild(t, dbPath) // fails the test unless it listens
}

// Two processes opening a new database file at once both migrate it: two keys create, or serve and keys create.
func TestConcurrentFirstStartsBothSucceed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for round := range 10 {
		path := filepath.Join(dir, fmt.Sprint("keys", round, ".db"))
		var ran [2]exited
		var wg sync.WaitGroup
		for i := range ran {
			wg.Go(func() { ran[i] = runChild(childCommand("keys", "create", "-account", "acme", "-db", path)) })
		}
		wg.Wait()
		list, _ := runCLI(t, nil, "keys", "list", "-db", path)
		if ran[0].code != 0 || ran[1].code != 0 || strings.Count(list, "\tacme\t") != 2 {
			t.Errorf("round %d: two keys create at once: got exit %d %q and %d %q, keys %q; want 0, 0 and two keys",
				round, ran[0].code, ran[0].stderr, ran[1].code, ran[1].stderr, list)
		}
	}
	for round := range 3 {
		path := filepath.Join(dir, fmt.Sprint("serve", round, ".db"))
		created := make(chan exited, 1)
		go func() { created <- runChild(childCommand("keys", "create", "-account", "acme", "-db", path)) }()
		server := startChild(t, path) // fails the test unless it listens
		c := <-created
		r, err := callAPI(http.DefaultClient, "GET", server.url+"/product-payment/list", strings.TrimSpace(c.stdout), "")
		if c.code != 0 || err != nil || r.status != 200 {
			t.Errorf("round %d: serve and keys create at once: got exit %d %q, and %d (%v) with its key; want 0, 200",
				round, c.code, c.stderr, r.status, err)
		}
	}
}

// keys create and keys revoke exit 0 at once while another process holds a read transaction (as Litestream does)
// and a server writes: they never checkpoint a database a server holds, and the server's writes are not stalled.
func TestKeysCommandsBesideAReaderAndAServer(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "beside.db")
	key := mintKeyCLI(t, dbPath, "acme")
	server, client := startChild(t, dbPath), newTestClient()
	reader, _ := sql.Open("sqlite", dbPath)
	defer reader.Close()
	tx, _ := reader.Begin()
	defer tx.Rollback()
	if err := tx.QueryRow(`SELECT count(*) FROM api_keys`).Scan(new(int)); err != nil { // the snapshot held from here
		t.Fatal(err)
	}
	stop := writeMeanwhile(server.url, key)
	created := runChild(childCommand("keys", "create", "-account", "acme", "-db", dbPath))
	newKey, keyID := strings.TrimSpace(created.stdout), regexp.MustCompile(`key_\w+`).FindString(created.stderr)
	authenticated, _ := callAPI(client, "GET", server.url+"/product-payment/list", newKey, "")
	revoked := runChild(childCommand("keys", "revoke", "-db", dbPath, keyID))
	refused, _ := callAPI(client, "GET", server.url+"/product-payment/list", newKey, "")
	slowest, failed := stop()
	for name, ran := range map[string]exited{"keys create": created, "keys revoke": revoked} {
		if ran.code != 0 || ran.took > 500*time.Millisecond {
			t.Errorf("%s beside a reader: got exit %d after %v (%q), want 0 well under a second",
				name, ran.code, ran.took, ran.stderr)
		}
	}
	if authenticated.status != 200 || refused.status != 401 {
		t.Errorf("the new key on the server: got %d after keys create, %d after keys revoke, want 200, 401",
			authenticated.status, refused.status)
	}
	if failed != "" || slowest > 500*time.Millisecond {
		t.Errorf("the server's creates while keys ran: got the slowest after %v, and %q; want each under 500 ms",
			slowest, failed)
	}
}

// --- the database file's commands: backup and check ---

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
	runChild(childCommand("serve", "-db", foreign, "-addr", "127.0.0.1:0")).wantRefused(t,
		"serve on another program's file", "not a paybuttons database")
	_, err := runCLI(t, nil, "keys", "create", "-account", "a", "-db", foreign)
	if err == nil || !strings.Contains(err.Error(), "not a paybuttons database") {
		t.Errorf("keys create on another program's file: got %v, want a refusal", err)
	}
	var mode string // refused before the writer's pragmas could switch it to WAL
	db, _ := sql.Open("sqlite", foreign)
	if db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); db.Close() != nil || mode != "delete" {
		t.Errorf("another program's file after the refusals: got journal_mode %q, want delete, as it was", mode)
	}
	litestream := file("litestream.db", `CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)`)
	earlier := file("earlier.db", migrations[0]+";"+migrations[1]+"; PRAGMA user_version = 2")
	for _, adopted := range []string{litestream, earlier} {
		if _, err := runCLI(t, nil, "keys", "create", "-account", "a", "-db", adopted); err != nil {
			t.Errorf("keys create on %s, which has Litestream's table only or an earlier schema: %v", adopted, err)
		}
	}
	db, _ = sql.Open("sqlite", earlier)
	var owner int
	if db.QueryRow(`PRAGMA application_id`).Scan(&owner); db.Close() != nil || owner != applicationID {
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

// backup under writes makes a sound copy of one moment, that serves; it never overwrites a file.
func TestBackupWhileWriting(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	before := e.create(e.key, createBody(nil))
	stop := writeMeanwhile(e.url, e.key)
	dest := filepath.Join(t.TempDir(), "copy.db")
	out, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest)
	if _, failed := stop(); failed != "" {
		t.Errorf("during the backup, %s", failed)
	}
	if err != nil || !strings.Contains(out, dest) {
		t.Fatalf("backup: got %q, %v", out, err)
	}
	_, err = runCLI(t, nil, "backup", "-db", e.dbPath, dest)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second backup to the same file: got %v, want a refusal", err)
	}
	// The copy is of one moment: sound, and its change counter where its newest change is.
	if out, err := runCLI(t, nil, "check", "-db", dest); out != "ok\n" || err != nil {
		t.Errorf("check of the copy: got %q (%v), want ok", out, err)
	}
	copied := &testEnv{t: t, store: openTestStore(t, dest)} // TestChangeFeedSurvivesARestoredBackup serves a copy
	if n := copied.count(`SELECT count(*) FROM buttons WHERE change_seq = (SELECT last FROM change_counter)`); n != 1 {
		t.Errorf("got %d buttons in the copy at its change counter, want 1", n)
	}
	copied.mustStored("acme", before)
}

// A backup killed halfway leaves nothing at its destination, and the next one succeeds.
func TestKilledBackupLeavesNoHalfFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src.db")
	mintKeyCLI(t, src, "acme")
	db, _ := sql.Open("sqlite", "file:"+src+"?_pragma=synchronous(OFF)")
	_, err := db.Exec(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 7)
		INSERT INTO idempotency_keys SELECT 'acme', i, x'00', 200, zeroblob(1000000), '2099', 0 FROM n`) // 8 MB
	if db.Close(); err != nil {
		t.Fatal(err)
	}
	var dest string
	for attempt := 0; ; attempt++ { // until a kill lands while the copy is under way
		dest = filepath.Join(dir, fmt.Sprint("copy", attempt, ".db"))
		cmd := childCommand("backup", "-db", src, dest)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if found, _ := filepath.Glob(dest + "*"); len(found) > 0 || time.Now().After(deadline) {
				break // the copy is under way, to dest or beside it
			}
		}
		cmd.Process.Kill()
		if cmd.Wait(); cmd.ProcessState.ExitCode() == -1 {
			break
		} else if attempt == 4 {
			t.Fatalf("5 backups ended (%v) before the kill: the test could not kill one halfway", cmd.ProcessState)
		}
	}
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("a killed backup left a file at its destination")
	}
	if _, err := runCLI(t, nil, "backup", "-db", src, dest); err != nil {
		t.Errorf("the next backup: %v", err)
	}
}
