package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// --- the one test server, client and body builder every test uses ---

// testEnv is a real server on a real SQLite file, with one key for account "acme" and one for account "other".
type testEnv struct {
	t      testing.TB
	url    string
	store  *store
	dbPath string
	key    string // account acme
	keyID  string // id of key
	keyB   string // account other
}

// newTestServer serves a new database over a real HTTP server until the test ends; change edits its config (no rate
// limit by default).
func newTestServer(t testing.TB, change ...func(*config)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, dbPath: filepath.Join(t.TempDir(), "test.db")}
	var err error
	if e.store, err = openStore(e.dbPath); err != nil {
		t.Fatalf("openStore: %v", err)
	}
	e.key, e.keyID = e.mintKey("acme", false)
	e.keyB, _ = e.mintKey("other", false)
	cfg := config{providerName: "the service", metrics: true}
	for _, c := range change {
		c(&cfg)
	}
	e.url = serveStore(t, e.store, cfg)
	return e
}

// serveStore serves st until the test ends, then closes both, and returns the URL.
func serveStore(t testing.TB, st *store, cfg config) string {
	t.Helper()
	srv := httptest.NewServer(newServer(st, slog.New(slog.DiscardHandler), cfg))
	t.Cleanup(func() {
		srv.Close()
		if err := st.close(false); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return srv.URL
}

// mintKey creates a key for account and returns its secret and id.
func (e *testEnv) mintKey(account string, readOnly bool) (secret, id string) {
	e.t.Helper()
	secret, id, err := e.store.createKey(context.Background(), account, readOnly)
	if err != nil {
		e.t.Fatalf("createKey(%q): %v", account, err)
	}
	return secret, id
}

// response is what a test reads back from one request.
type response struct {
	status int
	header http.Header
	raw    []byte
	env    struct {
		IsSuccess bool              `json:"isSuccess"`
		Data      json.RawMessage   `json:"data"`
		Message   string            `json:"message"`
		Code      string            `json:"code"`
		Errors    map[string]string `json:"errors"`
	}
	request string // "METHOD path body", for failure messages
}

// dataString is the envelope's data as a string ("" if it is not one).
func (r response) dataString() string {
	var s string
	json.Unmarshal(r.env.Data, &s)
	return s
}

// do is callAPI on e's server, failing the test unless the answer is the envelope that openapi.json declares.
func (e *testEnv) do(method, path, key, body string, headers ...string) response {
	e.t.Helper()
	r, err := callAPI(http.DefaultClient, method, e.url+path, key, body, headers...)
	if err != nil {
		e.t.Fatalf("%s: %v", r.request, err)
	}
	return r
}

// callAPI sends one request, with key as X-API-KEY ("" for none) and headers as name, value pairs, and reads the
// envelope it is answered with; an answer that openapi.json does not declare is an error.
func callAPI(client *http.Client, method, url, key, body string, headers ...string) (response, error) {
	r := response{request: fmt.Sprintf("%s %s %.300s", method, url, body)} // the body cut for failure messages
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return r, err
	}
	// Without GetBody the transport never resends a request on its own (it would, with an Idempotency-Key).
	req.GetBody = nil
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.status, r.header = resp.StatusCode, resp.Header
	if r.raw, err = io.ReadAll(resp.Body); err != nil {
		return r, err
	}
	if err := json.Unmarshal(r.raw, &r.env); err != nil {
		return r, fmt.Errorf("body is not the envelope: %v: %s", err, r.raw)
	}
	return r, conformsToDocument(method, resp.Request.URL, r.status, r.header, r.raw)
}

// want checks status, isSuccess and code together.
func (r response) want(t testing.TB, status int, code string) {
	t.Helper()
	if r.status != status || r.env.IsSuccess != (status == 200) || r.env.Code != code {
		t.Fatalf("%s\ngot status %d isSuccess %v code %q, want %d %v %q\nbody: %s",
			r.request, r.status, r.env.IsSuccess, r.env.Code, status, status == 200, code, r.raw)
	}
}

// wantFields checks a 400 that names exactly the fields given, with data "".
func (r response) wantFields(t testing.TB, fields ...string) {
	t.Helper()
	r.want(t, 400, "invalid_request")
	got := slices.Sorted(maps.Keys(r.env.Errors))
	if !slices.Equal(got, slices.Sorted(slices.Values(fields))) || string(r.env.Data) != `""` {
		t.Errorf("%s\ngot errors %v data %s, want exactly %q, data \"\"", r.request, r.env.Errors, r.env.Data, fields)
	}
}

// dataOf decodes r's data as a T; it fails the test if the data is not one.
func dataOf[T any](t testing.TB, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.env.Data, &v); err != nil {
		t.Fatalf("%s: data: %v\n%s", r.request, err, r.raw)
	}
	return v
}

// omit, as a value in createBody's changes, leaves the field out.
type omit struct{}

// raw, as a value in createBody's changes, is sent as the JSON text it holds.
type raw string

func (r raw) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// createBody is a valid create body (Stripe, one time, 19.90 USD) with changes: omit{} drops a field, nil is null.
func createBody(changes map[string]any) string {
	body := map[string]any{"productName": "Pro plan", "description": "Monthly access", "amount": "19.90",
		"currency": "USD", "paymentMethod": "Stripe", "paymentType": "one_time", "isLive": false}
	for name, value := range changes {
		if _, ok := value.(omit); ok {
			delete(body, name)
		} else {
			body[name] = value
		}
	}
	text, _ := json.Marshal(body)
	return string(text)
}

// create makes a button for key and returns its id.
func (e *testEnv) create(key, body string) string {
	e.t.Helper()
	r := e.do("POST", "/product-payment/create", key, body)
	r.want(e.t, 200, "")
	return r.dataString()
}

// stored reads account's button id straight from the database, or errNotFound.
func (e *testEnv) stored(account, id string) (button, error) {
	return scanButton(e.store.reader.QueryRow(`SELECT `+selectButton+` FROM buttons WHERE account = ? AND id = ?`,
		account, id))
}

// mustStored is stored, failing the test on an error.
func (e *testEnv) mustStored(account, id string) button {
	e.t.Helper()
	b, err := e.stored(account, id)
	if err != nil {
		e.t.Fatalf("read back %s: %v", id, err)
	}
	return b
}

// count counts the rows a query selects, such as `SELECT count(*) FROM buttons`.
func (e *testEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.reader.QueryRow(query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (e *testEnv) countButtons() int { return e.count(`SELECT count(*) FROM buttons`) }

// exec runs a statement in a write of its own, failing the test on an error.
func (e *testEnv) exec(query string, args ...any) {
	e.t.Helper()
	if err := e.store.write(context.Background(), func(tx *writeTx) error {
		_, err := tx.exec(query, args...)
		return err
	}); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// getView reads a button through the API.
func (e *testEnv) getView(key, id string) map[string]any {
	e.t.Helper()
	r := e.do("GET", "/product-payment/get/"+id, key, "")
	r.want(e.t, 200, "")
	return dataOf[map[string]any](e.t, r)
}

// --- the seed's operations, end to end ---

// Delete and restore each move a button once, a version each; a deleted button is read, not updated.
func TestStateMachine(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	for i, s := range []struct {
		method, path, body string
		status             int
		code, state        string
		version            float64
	}{
		{"POST", "/product-payment/restore/", "", 409, "wrong_state", "active", 1},
		{"DELETE", "/product-payment/delete/", "", 200, "", "deleted", 2},
		{"DELETE", "/product-payment/delete/", "", 409, "wrong_state", "deleted", 2},
		{"POST", "/product-payment/update/", `{"amount":"5.00"}`, 409, "wrong_state", "deleted", 2},
		{"POST", "/product-payment/restore/", "", 200, "", "active", 3},
		{"POST", "/product-payment/update/", `{"amount":"5.00"}`, 200, "", "active", 4},
	} {
		r := e.do(s.method, s.path+id, e.key, s.body)
		r.want(t, s.status, s.code)
		if v := e.getView(e.key, id); v["state"] != s.state || v["version"] != s.version ||
			(s.state == "deleted") == (v["deletedAt"] == nil) {
			t.Fatalf("step %d %s: got %v, want state %q version %v", i, r.request, v, s.state, s.version)
		}
	}
}

// Every refusal has its status and code and changes nothing; another account's button is not found; every answer
// carries the usual headers.
func TestStatusCodesAndHeaders(t *testing.T) {
	e := newTestServer(t)
	id, otherID := e.create(e.key, createBody(nil)), e.create(e.keyB, createBody(nil))
	before, create, body := e.mustStored("acme", id), "/product-payment/create", createBody(nil)
	for _, tt := range []struct {
		name, method, path, key, body string
		headers                       []string
		status                        int
		code                          string
	}{
		{"missing key", "GET", "/product-payment/get/" + id, "", "", nil, 401, "unauthorized"},
		{"unknown key", "GET", "/product-payment/get/" + id, "pbk_nope", "", nil, 401, "unauthorized"},
		{"unknown id", "GET", "/product-payment/get/btn_01JD0000000000000000000000", e.key, "", nil, 404, "not_found"},
		{"malformed id", "GET", "/product-payment/get/42", e.key, "", nil, 404, "not_found"},
		{"other account: get", "GET", "/product-payment/get/" + id, e.keyB, "", nil, 404, "not_found"},
		{"other account: history", "GET", "/product-payment/history/" + id, e.keyB, "", nil, 404, "not_found"},
		{"other account: update", "POST", "/product-payment/update/" + id, e.keyB, `{"amount":"1"}`, nil, 404, "not_found"},
		{"other account: delete", "DELETE", "/product-payment/delete/" + id, e.keyB, "", nil, 404, "not_found"},
		{"other account: restore", "POST", "/product-payment/restore/" + id, e.keyB, "", nil, 404, "not_found"},
		{"other account's button", "GET", "/product-payment/get/" + otherID, e.key, "", nil, 404, "not_found"},
		{"unknown path", "GET", "/nope", e.key, "", nil, 404, "not_found"},
		{"dot-dot path is not redirected", "GET", "/product-payment/get/../create", e.key, "", nil, 404, "not_found"},
		{"double slash is not redirected", "GET", "/product-payment//get/" + id, e.key, "", nil, 404, "not_found"},
		{"encoded dot segment", "GET", "/product-payment/get/%2e%2e/x", e.key, "", nil, 404, "not_found"},
		{"trailing slash", "POST", create + "/", e.key, body, nil, 404, "not_found"},
		{"wrong method", "GET", create, e.key, "", nil, 405, "method_not_allowed"},
		{"PUT", "PUT", create, e.key, "", nil, 405, "method_not_allowed"},
		{"OPTIONS", "OPTIONS", create, "", "", nil, 405, "method_not_allowed"},
		{"not JSON", "POST", create, e.key, body, []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"charset", "POST", create, e.key, body, []string{"Content-Type", "application/json; charset=utf-8"}, 200, ""},
		{"a +json type", "POST", create, e.key, body, []string{"Content-Type", "application/vnd.paybuttons+json"}, 200, ""},
		{"too large", "POST", create, e.key, strings.Repeat("x", 70_000), nil, 413, "payload_too_large"},
		{"auth before body", "POST", create, "", "{", nil, 401, "unauthorized"},
		{"bidi control", "POST", create, e.key, createBody(m{"productName": "\u202egnp.exe"}), nil, 400, "invalid_request"},
		{"refused update", "POST", "/product-payment/update/" + id, e.key, `{"currency":"JPY"}`, nil, 400, "invalid_request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := e.countButtons()
			r := e.do(tt.method, tt.path, tt.key, tt.body, tt.headers...)
			r.want(t, tt.status, tt.code)
			if n := e.countButtons(); (tt.status == 200) != (n == before+1) {
				t.Errorf("%s: got %d buttons after it, had %d", r.request, n, before)
			}
			if tt.status == 405 && r.header.Get("Allow") != "POST" {
				t.Errorf("got Allow %q, want POST", r.header.Get("Allow"))
			}
			for header, want := range map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store",
				"X-Content-Type-Options": "nosniff"} {
				if got := r.header.Get(header); got != want {
					t.Errorf("%s: got %s %q, want %q", r.request, header, got, want)
				}
			}
			if !strings.HasPrefix(r.header.Get("X-Request-Id"), "req_") {
				t.Errorf("%s: got X-Request-Id %q, want a new req_ id", r.request, r.header.Get("X-Request-Id"))
			}
		})
	}
	if after := e.mustStored("acme", id); !reflect.DeepEqual(after, before) {
		t.Errorf("got %+v, want acme's button unchanged: %+v", after, before)
	}
	e.mustStored("other", otherID) // stored for the account whose key created it
	// The caller's X-Request-Id is echoed when it is sane, else replaced by a new one.
	for sent, want := range map[string]string{"trace-42": "trace-42", "bad id\u00e9": "req_"} {
		got := e.do("GET", "/nope", "", "", "X-Request-Id", sent).header.Get("X-Request-Id")
		if got != want && (want != "req_" || !strings.HasPrefix(got, want)) {
			t.Errorf("sent X-Request-Id %q: got %q, want %q", sent, got, want)
		}
	}
}

// Each key has its own token bucket; past it a request is refused with a Retry-After and does nothing.
func TestRateLimit(t *testing.T) {
	e := newTestServer(t, func(c *config) { c.rate, c.burst = 0.001, 2 })
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	r := e.do("POST", "/product-payment/create", e.key, createBody(nil))
	r.want(t, 429, "rate_limited")
	// 1/0.001 s is 1000 s; never negative, never zero.
	if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 999 || secs > 1000 {
		t.Errorf("got Retry-After %q on a 429, want about 1000 whole seconds", r.header.Get("Retry-After"))
	}
	if n := e.countButtons(); n != 0 {
		t.Errorf("got %d buttons after a 429, want 0", n)
	}
	e.do("GET", "/product-payment/get/x", e.keyB, "").want(t, 404, "not_found") // each key has its own bucket
}

// A key revoked by another process is refused on its next request on every path, as an unknown key is, even right
// after it was used; the account's other keys work on.
func TestRevokedKeyStopsOnTheNextRequest(t *testing.T) {
	e := newTestServer(t)
	key, keyID := e.mintKey("acme", false)
	id := e.create(key, createBody(nil))
	e.do("DELETE", "/product-payment/delete/"+id, key, "", "Idempotency-Key", "k").want(t, 200, "")
	before := e.mustStored("acme", id)
	if _, err := runCLI(t, nil, "keys", "revoke", "-db", e.dbPath, keyID); err != nil { // a store of its own
		t.Fatalf("keys revoke: %v", err)
	}
	unknown := e.do("GET", "/product-payment/get/"+id, "pbk_unknown", "")
	for _, req := range [][]string{{"GET", "get/" + id, ""}, {"GET", "list", ""}, {"GET", "history/" + id, ""},
		{"GET", "changes", ""}, {"DELETE", "delete/" + id, "", "Idempotency-Key", "k"}, // a replay
		{"POST", "restore/" + id, ""}, {"POST", "update/" + id, `{"productName":""}`}, {"POST", "create", createBody(nil)}} {
		r := e.do(req[0], "/product-payment/"+req[1], key, req[2], req[3:]...)
		if r.want(t, 401, "unauthorized"); r.env.Message != unknown.env.Message {
			t.Errorf("%s: got %q, want %q as for an unknown key", r.request, r.env.Message, unknown.env.Message)
		}
	}
	if after := e.mustStored("acme", id); !reflect.DeepEqual(after, before) || e.countButtons() != 1 {
		t.Errorf("got %+v and %d buttons after the revoked key's requests, want %+v and 1", after, e.countButtons(), before)
	}
	e.getView(e.key, id) // the account's other key
}

// A handler's panic is a 500 with the generic envelope; the log has the cause and the stack.
func TestPanicIsA500ThatLogsTheStack(t *testing.T) {
	logs := &syncBuffer{}
	s := &server{log: slog.New(slog.NewTextHandler(logs, nil)), metrics: metrics{routes: map[string]*routeMetrics{}}}
	h := s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") }))
	rec, req := httptest.NewRecorder(), httptest.NewRequest("GET", "/anything", nil)
	req.Header.Set("X-Request-Id", "trace-500")
	h.ServeHTTP(rec, req)
	want := `{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`
	if rec.Code != 500 || rec.Body.String() != want {
		t.Errorf("got %d %s, want 500 %s", rec.Code, rec.Body, want)
	}
	for _, part := range []string{"secret detail", "requestId=trace-500", "goroutine", "status=500"} {
		if !strings.Contains(logs.String(), part) {
			t.Errorf("the log lacks %q:\n%s", part, logs)
		}
	}
}

// --- the whole program, run in this process ---

// runCLI runs the program with args and env, returning stdout and the error.
func runCLI(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout bytes.Buffer
	err := run(context.Background(), append([]string{"paybuttons"}, args...),
		func(name string) string { return env[name] }, &stdout, io.Discard)
	return stdout.String(), err
}

// syncBuffer is a bytes.Buffer safe to read while run writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// running is run(...) serving in the background.
type running struct {
	url    string
	stderr *syncBuffer
	stop   func() error // cancels run's context and returns what run returned
}

// startRun runs the program with "serve" args on 127.0.0.1 and a free port, and waits until it listens. It is stopped
// when the test ends if stop was not called before.
func startRun(t testing.TB, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := &running{stderr: &syncBuffer{}, stop: sync.OnceValue(func() error {
		cancel()
		return <-done
	})}
	go func() {
		done <- run(ctx, append([]string{"paybuttons", "-addr", "127.0.0.1:0", "-rate", "0"}, args...),
			func(string) string { return "" }, io.Discard, r.stderr)
	}()
	t.Cleanup(func() { r.stop() })
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if r.url = listeningURL(r.stderr.String()); r.url != "" {
			return r
		}
		select {
		case err := <-done:
			done <- err // for stop
			t.Fatalf("run returned early: %v\n%s", err, r.stderr)
		default:
		}
	}
	t.Fatalf("run did not say where it listens:\n%s", r.stderr)
	return nil
}

// listeningURL finds the address of the "listening" log line, text or JSON.
func listeningURL(logs string) string {
	for _, line := range strings.Split(logs, "\n") {
		if _, after, ok := strings.Cut(line, "url="); ok && strings.Contains(line, "listening") {
			return strings.Fields(after)[0]
		}
		var entry struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" {
			return entry.URL
		}
	}
	return ""
}

// mintedKey is the first-start key run printed on a line of its own, or "".
func (r *running) mintedKey() string {
	for _, line := range strings.Split(r.stderr.String(), "\n") {
		if strings.HasPrefix(line, "pbk_") {
			return line
		}
	}
	return ""
}
