package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAccessLogNamesTheKeyIDNeverTheKey(t *testing.T) {
	db := filepath.Join(t.TempDir(), "log.db")
	out, err := runCLI(t, nil, "keys", "create", "-account", "acme", "-db", db)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(out)
	list, _ := runCLI(t, nil, "keys", "list", "-db", db)
	keyID := strings.Fields(list)[0]

	srv := startRun(t, "-db", db, "-log-format", "json")
	req, _ := http.NewRequest("POST", srv.url+"/product-payment/create", strings.NewReader(createBody(nil)))
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("X-Request-Id", "trace-7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}

	logs := srv.stderr.String()
	if strings.Contains(logs, key) || strings.Contains(logs, key[4:]) {
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
		"bytes": float64(len(body)), "requestId": "trace-7", "keyId": keyID,
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

func TestLogLevelHidesAccessLines(t *testing.T) {
	// At warn the listening line is hidden too, so the port is chosen here.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"paybuttons", "-addr", addr, "-db", filepath.Join(t.TempDir(), "quiet.db"), "-log-level", "warn"},
			func(string) string { return "" }, io.Discard, stderr)
	}()
	var resp *http.Response
	for i := 0; i < 500; i++ {
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
	if logs := stderr.String(); resp.StatusCode != 200 || strings.Contains(logs, "msg=request") || strings.Contains(logs, "msg=listening") {
		t.Errorf("got status %d and info lines at -log-level warn:\n%s", resp.StatusCode, logs)
	}
}

func TestVersionCommand(t *testing.T) {
	out, err := runCLI(t, nil, "version")
	if err != nil || !strings.HasPrefix(out, "paybuttons ") || !strings.Contains(out, "go1.") {
		t.Errorf("got %q, %v, want paybuttons, the module version and the Go version", out, err)
	}
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key as PEM files
// and returns their paths and the certificate.
func selfSignedCert(t *testing.T) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "paybuttons test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(priv)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile, cert
}

func TestServesTLS(t *testing.T) {
	certFile, keyFile, cert := selfSignedCert(t)
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "tls.db"), "-tls-cert", certFile, "-tls-key", keyFile)
	if !strings.HasPrefix(srv.url, "https://") {
		t.Fatalf("got url %q, want https", srv.url)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := client.Get(srv.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Errorf("got status %d over %v, want 200 over TLS 1.2 or later", resp.StatusCode, resp.TLS)
	}
	// The server refuses versions older than TLS 1.2.
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MaxVersion: tls.VersionTLS11}}}
	if resp, err := old.Get(srv.url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("a TLS 1.1 client was served")
	}
}

func TestHealthz(t *testing.T) {
	e := newTestServer(t)
	r := e.do("GET", "/healthz", "", "")
	r.want(t, 200, "")
	// A database that no longer answers: its connections are closed.
	e.store.health.Close()
	r = e.do("GET", "/healthz", "", "")
	r.want(t, 503, "unavailable")
	if r.header.Get("Retry-After") == "" || r.env.Message != "the database does not answer" {
		t.Errorf("got Retry-After %q and message %q, want a Retry-After and the database does not answer", r.header.Get("Retry-After"), r.env.Message)
	}
}

func TestLogWriterHoldsInfoLinesAndFlushesWarnings(t *testing.T) {
	out := &syncBuffer{}
	w := &logBuffer{out: bufio.NewWriter(out)}
	logger := slog.New(flushOnWarn{slog.NewTextHandler(w, nil), w})
	logger.Info("request", "n", 1)
	if got := out.String(); got != "" {
		t.Errorf("an info line was written at once: %q", got)
	}
	logger.Warn("trouble")
	if got := out.String(); !strings.Contains(got, "msg=request") || !strings.Contains(got, "msg=trouble") {
		t.Errorf("after a warning got %q, want both lines written", got)
	}
	logger.Info("last")
	w.Flush()
	if got := out.String(); !strings.Contains(got, "msg=last") {
		t.Errorf("after Close got %q, want the last line written", got)
	}
}

func TestPanicIsA500ThatLogsTheStack(t *testing.T) {
	logs := &syncBuffer{}
	s := &server{log: slog.New(slog.NewTextHandler(logs, nil))}
	h := s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/anything", nil)
	req.Header.Set("X-Request-Id", "trace-500")
	h.ServeHTTP(rec, req)

	want := `{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`
	if rec.Code != 500 || rec.Body.String() != want {
		t.Errorf("got %d %s, want 500 %s", rec.Code, rec.Body, want)
	}
	got := logs.String()
	for _, part := range []string{"secret detail", "requestId=trace-500", "goroutine", "status=500"} {
		if !strings.Contains(got, part) {
			t.Errorf("the log lacks %q:\n%s", part, got)
		}
	}
}
