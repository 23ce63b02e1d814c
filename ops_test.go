package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The JSON access line names route, status, size, request id and key id, never the key.
func TestAccessLogNamesTheKeyIDNeverTheKey(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "log.db")
	key := mintKeyCLI(t, db, "acme")
	list, _ := runCLI(t, nil, "keys", "list", "-db", db)
	keyID := strings.Fields(list)[0]
	srv := startRun(t, "-db", db, "-log-format", "json")
	r, err := callAPI(http.DefaultClient, "POST", srv.url+"/product-payment/create", key, createBody(nil),
		"X-Request-Id", "trace-7")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.stop(); err != nil {
		t.Fatal(err)
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
		messages = append(messages, entry["msg"].(string))
		if entry["msg"] == "request" {
			access = entry
		}
	}
	want := map[string]any{
		"method": "POST", "route": "POST /product-payment/create", "status": float64(200),
		"bytes": float64(len(r.raw)), "requestId": "trace-7", "keyId": keyID,
	}
	for k, v := range want {
		if access[k] != v {
			t.Errorf("access line %s: got %v, want %v", k, access[k], v)
		}
	}
	if _, ok := access["duration"]; !ok {
		t.Error("access line has no duration")
	}
	if got := strings.Join(messages, ","); got != "listening,request,shutting down,stopped" {
		t.Errorf("got log messages %s, want start-up, the request, shutdown", got)
	}
}

// A start that cannot listen mints no key; the next, at -log-level warn, prints one but no info line.
func TestFailedStartMintsNoKeyAndWarnLevelHidesInfo(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, db := ln.Addr().String(), filepath.Join(t.TempDir(), "first.db")
	var stderr syncBuffer
	err = run(context.Background(), []string{"paybuttons", "-db", db, "-addr", addr}, func(string) string { return "" },
		io.Discard, &stderr)
	if err == nil || strings.Contains(stderr.String(), "pbk_") {
		t.Errorf("a start on a busy port: got %v and %q, want an error and no key", err, stderr.String())
	}
	// At warn the listening line is hidden too, so the next start takes the port just freed.
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	quiet, done := &syncBuffer{}, make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"paybuttons", "-addr", addr, "-db", db, "-log-level", "warn"},
			func(string) string { return "" }, io.Discard, quiet)
	}()
	var resp *http.Response
	for range 500 {
		if resp, err = http.Get("http://" + addr + "/healthz"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the server never answered: %v", err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	logs := quiet.String()
	if resp.StatusCode != 200 || strings.Contains(logs, "msg=request") || strings.Contains(logs, "msg=listening") ||
		!strings.Contains(logs, "pbk_") {
		t.Errorf("got status %d and, at -log-level warn, info lines or no key:\n%s", resp.StatusCode, logs)
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

// /healthz answers 200, and 503 with a Retry-After once the database does not answer.
func TestHealthz(t *testing.T) {
	e := newTestServer(t)
	e.do("GET", "/healthz", "", "").want(t, 200, "")
	e.store.health.Close() // its connections closed: the database no longer answers
	r := e.do("GET", "/healthz", "", "")
	wantUnavailable(t, r)
	if r.env.Message != "the database does not answer or refuses writes" {
		t.Errorf("got message %q, want the database does not answer or refuses writes", r.env.Message)
	}
}

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
	if err != nil {
		t.Fatalf("keys list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")
	fields := strings.Split(lines[0], "\t")
	if len(lines) != 1 || !strings.HasPrefix(fields[0], "key_") || fields[1] != "acme" || fields[2] != "read-write" ||
		!strings.Contains(lines[0], "revoked never") || strings.Contains(list, key[4:]) {
		t.Fatalf("got keys list %q, want one line: id, acme, read-write, created, last used, revoked never; no secret", list)
	}

	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, fields[0]); err != nil {
		t.Fatalf("keys revoke: %v", err)
	}
	list, _ = runCLI(t, nil, "keys", "list", "-db", db)
	if strings.Contains(list, "revoked never") {
		t.Errorf("got %q after revoke, want a revoked time", list)
	}
	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, fields[0]); err != nil {
		t.Errorf("revoking a revoked key: got %v, want a no-op", err)
	}
	if again, _ := runCLI(t, nil, "keys", "list", "-db", db); again != list {
		t.Errorf("revoking a revoked key changed the list: got %q, want %q", again, list)
	}
	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, "key_unknown"); err == nil || exitStatus(err) != 1 {
		t.Errorf("revoking an unknown key: got %v (status %d), want an error with status 1", err, exitStatus(err))
	}
}

// PAYBUTTONS_<FLAG> stands in for a flag the command line does not give.
func TestEnvironmentFallbacks(t *testing.T) {
	dir := t.TempDir()
	fromEnv, fromFlag := filepath.Join(dir, "env.db"), filepath.Join(dir, "flag.db")
	env := map[string]string{"PAYBUTTONS_DB": fromEnv}
	if _, err := runCLI(t, env, "keys", "create", "-account", "a"); err != nil {
		t.Fatalf("keys create with PAYBUTTONS_DB: %v", err)
	}
	if _, err := os.Stat(fromEnv); err != nil {
		t.Errorf("PAYBUTTONS_DB was not used: %v", err)
	}
	if _, err := runCLI(t, env, "keys", "create", "-account", "a", "-db", fromFlag); err != nil {
		t.Fatalf("keys create with -db: %v", err)
	}
	if _, err := os.Stat(fromFlag); err != nil {
		t.Errorf("-db did not beat PAYBUTTONS_DB: %v", err)
	}
	for _, rate := range []string{"fast", "NaN", "Inf"} {
		if _, err := runCLI(t, map[string]string{"PAYBUTTONS_RATE": rate}, "-db", fromFlag); exitStatus(err) != 2 {
			t.Errorf("PAYBUTTONS_RATE=%s: got %v, want a usage error", rate, err)
		}
	}
}

// Command-line mistakes are one-line errors: exit status 2 for usage, 1 for the rest.
func TestCommandLineErrors(t *testing.T) {
	dir := t.TempDir()
	notADB := filepath.Join(dir, "garbage.db")
	os.WriteFile(notADB, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	tests := []struct {
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
		{"check with an argument", []string{"check", "x"}, 2, "check"},
		{"backup without a destination", []string{"backup"}, 2, "DEST_FILE"},
		{"backup of no database", []string{"backup", "-db", filepath.Join(dir, "none.db"), filepath.Join(dir, "out.db")}, 1, "no database"},
		{"tls cert without key", []string{"-tls-cert", "c.pem"}, 2, "-tls-key"},
		{"keys without command", []string{"keys"}, 2, "create"},
		{"keys create without account", []string{"keys", "create", "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"account name with a space", []string{"keys", "create", "-account", "a b", "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"account name of 65 characters", []string{"keys", "create", "-account", strings.Repeat("a", 65), "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"missing directory", []string{"-db", filepath.Join(dir, "no", "such", "x.db")}, 1, "does not exist"},
		{"not a database", []string{"-db", notADB, "-addr", "127.0.0.1:0"}, 1, "not a SQLite database"},
		{"keys list without database", []string{"keys", "list", "-db", filepath.Join(dir, "none.db")}, 1, "no database"},
		{"busy port", []string{"-db", filepath.Join(dir, "p.db"), "-addr", "256.0.0.1:1"}, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runCLI(t, nil, tt.args...)
			if err == nil || exitStatus(err) != tt.status || !strings.Contains(err.Error(), tt.contains) {
				t.Errorf("args %q: got %v (status %d), want status %d mentioning %q", tt.args, err, exitStatus(err), tt.status, tt.contains)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("args %q: got a multi-line error %q, want one line", tt.args, err)
			}
		})
	}
}

// OPTIONS * is answered with the envelope and the usual headers, like any path.
func TestOptionsStarIsEnveloped(t *testing.T) {
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "options.db")) // the real http.Server, not httptest's
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	var env struct{ Code string }
	if json.Unmarshal(body, &env); resp.StatusCode != 404 || env.Code != "not_found" || resp.Header.Get("X-Request-Id") == "" {
		t.Errorf("OPTIONS *: got %d %s, want the 404 envelope with the usual headers", resp.StatusCode, body)
	}
}
