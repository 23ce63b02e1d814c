package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// testEnv is a real server on a real SQLite file, with a key for account "acme" and one for "other".
type testEnv struct {
	t          testing.TB
	url, db    string
	store      *store
	key, keyID string // of account acme
	otherKey   string // of account other
}

// newTestServer serves a new database file until the test ends; change edits the config (no rate limit).
func newTestServer(t testing.TB, change ...func(*config)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, db: filepath.Join(t.TempDir(), "test.db")}
	st, err := openStore(e.db)
	require(t, err == nil, "openStore: %v", err)
	e.store = st
	e.key, e.keyID = e.mintKey("acme", false)
	e.otherKey, _ = e.mintKey("other", false)
	cfg := config{providerName: "the service"}
	for _, c := range change {
		c(&cfg)
	}
	srv := httptest.NewServer(newServer(st, slog.New(slog.DiscardHandler), cfg))
	e.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		err := st.close()
		expect(t, err == nil, "close store: %v", err)
	})
	return e
}

// mintKey creates a key for account and returns its secret and id.
func (e *testEnv) mintKey(account string, readOnly bool) (secret, id string) {
	e.t.Helper()
	secret, id, err := e.store.createKey(context.Background(), account, readOnly)
	require(e.t, err == nil, "createKey(%q): %v", account, err)
	return secret, id
}

// response is what a test reads back from one request.
type response struct {
	request string // "METHOD url body", for failure messages
	status  int
	header  http.Header
	raw     []byte
	env     struct {
		IsSuccess     bool
		Data          json.RawMessage
		Message, Code string
		Errors        map[string]string
	}
}

// dataString is the envelope's data as a string, "" if it is none.
func (r response) dataString() string {
	var s string
	json.Unmarshal(r.env.Data, &s)
	return s
}

// do sends a request with key as X-API-KEY ("" for none) and headers as name, value pairs. It fails
// the test unless the answer is an envelope that openapi.json declares for it.
func (e *testEnv) do(method, path, key, body string, headers ...string) response {
	e.t.Helper()
	r, err := callAPI(http.DefaultClient, method, e.url+path, key, body, headers...)
	require(e.t, err == nil, "%s: %v", r.request, err)
	return r
}

// callAPI is do for any client and URL; an answer that openapi.json does not declare is an error.
func callAPI(client *http.Client, method, url, key, body string, headers ...string) (response, error) {
	r := response{request: fmt.Sprintf("%s %s %.300s", method, url, body)}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return r, err
	}
	req.GetBody = nil // the transport must never send a request twice by itself
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
	r.raw, err = io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(r.raw, &r.env); err != nil && !bytes.Equal(r.raw, openAPIDocument) {
		return r, fmt.Errorf("the body is not the envelope: %v: %s", err, r.raw)
	}
	return r, conformsToDocument(method, resp.Request.URL, r.status, r.header, r.raw)
}

// want checks status, isSuccess and code together.
func (r response) want(t testing.TB, status int, code string) {
	t.Helper()
	require(t, r.status == status && r.env.IsSuccess == (status == 200) && r.env.Code == code,
		"%s\ngot %d, isSuccess %v, code %q; want %d %q\n%s", r.request, r.status, r.env.IsSuccess, r.env.Code,
		status, code, r.raw)
}

// wantFields checks a 400 that names exactly fields.
func (r response) wantFields(t testing.TB, fields ...string) {
	t.Helper()
	r.want(t, 400, "invalid_request")
	got, want := slices.Sorted(maps.Keys(r.env.Errors)), slices.Sorted(slices.Values(fields))
	expect(t, slices.Equal(got, want), "%s\ngot errors %v, want exactly %q", r.request, r.env.Errors, fields)
}

// expect fails the test, which goes on, unless ok; the message says what was got and what was wanted.
func expect(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

// require is expect for a check the rest of the test needs: it stops the test.
func require(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

type m = map[string]any

// createBody is a valid create body (19.90 USD, one time, Stripe) with changes; nil leaves a field out.
func createBody(changes m) string {
	body := m{"productName": "Pro plan", "description": "Monthly access", "amount": "19.90",
		"currency": "USD", "paymentMethod": "Stripe", "paymentType": "one_time", "isLive": false}
	for name, value := range changes {
		body[name] = value
		if value == nil {
			delete(body, name)
		}
	}
	text, _ := json.Marshal(body)
	return string(text)
}

// create makes a button with key and returns its id.
func (e *testEnv) create(key, body string) string {
	e.t.Helper()
	r := e.do("POST", "/product-payment/create", key, body)
	r.want(e.t, 200, "")
	return r.dataString()
}

// stored reads account's button id from the database, or fails the test.
func (e *testEnv) stored(account, id string) button {
	e.t.Helper()
	b, err := e.store.get(context.Background(), account, id)
	require(e.t, err == nil, "read back %s: %v", id, err)
	return b
}

// count runs a query that counts, such as `SELECT count(*) FROM history`.
func (e *testEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	err := e.store.reader.QueryRow(query, args...).Scan(&n)
	require(e.t, err == nil, "%s: %v", query, err)
	return n
}

func (e *testEnv) buttons() int { return e.count(`SELECT count(*) FROM buttons`) }

// holdWriteLock takes the write lock until the test ends; no key's last use is written meanwhile.
func (e *testEnv) holdWriteLock() *sql.Tx {
	e.t.Helper()
	e.store.writer.Exec(`UPDATE api_keys SET last_used_at = ?`, now())
	db, _ := sql.Open("sqlite", sqliteURI(e.db, "_pragma=busy_timeout(5000)&_txlock=immediate"))
	tx, err := db.Begin()
	require(e.t, err == nil, "take the write lock: %v", err)
	e.t.Cleanup(func() { tx.Rollback(); db.Close() })
	return tx
}

// runCLI runs the program in this process with args and env; it returns stdout, stderr and the error.
func runCLI(t testing.TB, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"paybuttons"}, args...),
		func(name string) string { return env[name] }, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// awaitTrue polls cond until it holds, and returns false if it does not within 20 s.
func awaitTrue(cond func() bool) bool {
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func longTests() bool { return os.Getenv("PAYBUTTONS_LONG_TESTS") == "1" }

// A refusal has its status and code, changes nothing and names 20 problems at most; usual headers on all.
func TestStatusCodesAndHeaders(t *testing.T) {
	e := newTestServer(t)
	id, otherID, deleted := e.create(e.key, createBody(nil)), e.create(e.otherKey, createBody(nil)),
		e.create(e.key, createBody(nil))
	e.do("DELETE", "/product-payment/delete/"+deleted, e.key, "").want(t, 200, "")
	readOnly, _ := e.mintKey("acme", true)
	before, body := e.stored("acme", id), createBody(nil)
	p, create := "/product-payment/", "/product-payment/create"
	for _, c := range []struct {
		method, path, key, body string
		header                  string // "Name: value", or ""
		status                  int
		code                    string
	}{
		{"GET", p + "get/" + id, "", "", "", 401, "unauthorized"},
		{"GET", p + "get/" + id, "pbk_nope", "", "", 401, "unauthorized"},
		{"POST", create, "", "{", "", 401, "unauthorized"}, // the key is checked before the body
		{"GET", p + "get/" + id, readOnly, "", "", 200, ""},
		{"POST", create, readOnly, "{", "", 403, "forbidden"}, // before the body too
		{"POST", p + "update/" + id, readOnly, `{"amount":"1"}`, "", 403, "forbidden"},
		{"DELETE", p + "delete/" + id, readOnly, "", "", 403, "forbidden"},
		{"POST", p + "restore/" + deleted, readOnly, "", "", 403, "forbidden"},
		{"GET", p + "get/btn_01JD0000000000000000000000", e.key, "", "", 404, "not_found"},
		{"GET", p + "get/42", e.key, "", "", 404, "not_found"},
		{"GET", p + "get/" + otherID, e.key, "", "", 404, "not_found"}, // another account's
		{"GET", p + "history/" + id, e.otherKey, "", "", 404, "not_found"},
		{"POST", p + "update/" + id, e.otherKey, `{"amount":"1"}`, "", 404, "not_found"},
		{"DELETE", p + "delete/" + id, e.otherKey, "", "", 404, "not_found"},
		{"POST", p + "restore/" + id, e.key, "", "", 409, "wrong_state"}, // it is active
		{"DELETE", p + "delete/" + deleted, e.key, "", "", 409, "wrong_state"},
		{"POST", p + "update/" + deleted, e.key, `{"amount":"1"}`, "", 409, "wrong_state"},
		{"GET", "/nope", e.key, "", "", 404, "not_found"},
		{"GET", p + "changes", e.key, "", "", 404, "not_found"},       // removed: the change feed
		{"GET", "/metrics", "", "", "", 404, "not_found"},             // removed
		{"GET", p + "get/../create", e.key, "", "", 404, "not_found"}, // never redirected
		{"GET", p + "get/%2e%2e/x", e.key, "", "", 404, "not_found"},
		{"POST", create + "/", e.key, body, "", 404, "not_found"},
		{"GET", create, e.key, "", "", 405, "method_not_allowed"},
		{"OPTIONS", create, "", "", "", 405, "method_not_allowed"},
		{"POST", create, e.key, body, "Content-Type: text/plain", 415, "unsupported_media_type"},
		{"POST", create, e.key, body, "Content-Type: application/json; charset=utf-8", 200, ""},
		{"POST", create, e.key, body, "Content-Type: application/vnd.x+json", 200, ""},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: "01"`, 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: "2"`, 412, "precondition_failed"},
	} {
		var headers []string
		if name, value, ok := strings.Cut(c.header, ": "); ok {
			headers = []string{name, value}
		}
		buttons := e.buttons()
		r := e.do(c.method, c.path, c.key, c.body, headers...)
		r.want(t, c.status, c.code)
		n, created := e.buttons(), c.path == create && c.status == 200
		expect(t, created == (n == buttons+1), "%s: got %d buttons, had %d", r.request, n, buttons)
		h := r.header
		expect(t, h.Get("Cache-Control") == "no-store" && h.Get("X-Content-Type-Options") == "nosniff",
			"%s: got headers %v, want no-store and nosniff", r.request, h)
	}
	after := e.stored("acme", id)
	expect(t, reflect.DeepEqual(after, before), "got %s, want acme's button unchanged", jsonOf(after))
	// A refusal names at most 20 problems, each cut to 40 characters: no answer grows with the request.
	many := m{"a" + strings.Repeat("x", 99): 1}
	for i := range 24 {
		many[fmt.Sprint("unknown", i)] = i
	}
	text, _ := json.Marshal(many)
	r := e.do("POST", "/product-payment/create", e.key, string(text))
	r.want(t, 400, "invalid_request")
	_, cut := r.env.Errors["a"+strings.Repeat("x", 38)+"…"]
	expect(t, len(r.env.Errors) == 20 && cut, "got errors %v, want 20, the long name cut to 40", r.env.Errors)
	msg := r.env.Message
	expect(t, strings.HasPrefix(msg, "31 fields are invalid: ") && strings.HasSuffix(msg, " and 11 more"),
		"got message %q, want \"31 fields are invalid: ... and 11 more\"", msg)
}

// Each key has its own token bucket; past it a request is refused with Retry-After and does nothing.
func TestRateLimit(t *testing.T) {
	e := newTestServer(t, func(c *config) { c.rate, c.burst = 0.001, 2 })
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	r := e.do("POST", "/product-payment/create", e.key, createBody(nil))
	r.want(t, 429, "rate_limited")
	expect(t, r.header.Get("Retry-After") == "1000", "got %v, want Retry-After: 1000 (1/0.001 s)", r.header)
	expect(t, e.buttons() == 0, "got %d buttons, want none", e.buttons())
	spare, _ := e.mintKey("acme", false) // a bucket per key, not per account
	e.do("GET", "/product-payment/get/x", spare, "").want(t, 404, "not_found")
}

// Ids made in one millisecond still grow, so a list is newest first however fast buttons come.
func TestIDsOnlyGrow(t *testing.T) {
	e, last := newTestServer(t), ""
	for range 1000 {
		id := e.store.newButtonID()
		require(t, validButtonID(id) && id > last, "got %s after %s, want a greater, valid id", id, last)
		last = id
	}
}

// list pages newest first and filters; each query parameter is checked, and removed ones are refused.
func TestList(t *testing.T) {
	e := newTestServer(t)
	var ids []string
	for i := range 5 {
		method := []string{"Stripe", "the service"}[i%2]
		ids = append(ids, e.create(e.key, createBody(m{"paymentMethod": method, "isLive": i < 2})))
	}
	e.do("DELETE", "/product-payment/delete/"+ids[4], e.key, "").want(t, 200, "")
	e.create(e.otherKey, createBody(nil))
	for _, c := range []struct {
		query string
		want  []string
		next  string // the last id when more follow, else ""
	}{
		{"", []string{ids[3], ids[2], ids[1], ids[0]}, ""},
		{"limit=3", []string{ids[3], ids[2], ids[1]}, ids[1]},
		{"limit=2&after=" + ids[3], []string{ids[2], ids[1]}, ids[1]},
		{"state=deleted", []string{ids[4]}, ""},
		{"state=all&isLive=true", []string{ids[1], ids[0]}, ""},
		{"paymentMethod=the%20service", []string{ids[3], ids[1]}, ""},
	} {
		r := e.do("GET", "/product-payment/list?"+c.query, e.key, "")
		r.want(t, 200, "")
		var page struct {
			Items   []struct{ ID string }
			HasMore bool
			Next    string
		}
		json.Unmarshal(r.env.Data, &page)
		var got []string
		for _, b := range page.Items {
			got = append(got, b.ID)
		}
		expect(t, slices.Equal(got, c.want) && page.HasMore == (c.next != "") && page.Next == c.next,
			"list?%s: got %s, want %v and next %q", c.query, r.env.Data, c.want, c.next)
	}
	for query, field := range map[string]string{"limit=0": "limit", "limit=101": "limit", "limit=+5": "limit",
		"limit=1&limit=2": "limit", "after=btn_x": "after", "state=gone": "state", "isLive=1": "isLive",
		"paymentMethod=stripe": "paymentMethod", "%zz": "query",
		"metadata%5Bteam%5D=web": "metadata[team]", "since=0": "since"} { // the last two: removed
		e.do("GET", "/product-payment/list?"+query, e.key, "").wantFields(t, field)
	}
}

// history pages a button's changes, oldest first, each with its author and what it changed.
func TestHistory(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(m{"metadata": m{"orderRef": "A-17"}}))
	update := `{"amount":"24.9","description":null,"metadata":{"orderRef":null,"team":"web"}}`
	e.do("POST", "/product-payment/update/"+id, e.key, update, "X-Request-Id", "trace-7").want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 200, "")
	var page struct {
		Items   []map[string]any
		HasMore bool
		Next    any
	}
	r := e.do("GET", "/product-payment/history/"+id+"?limit=2", e.key, "")
	r.want(t, 200, "")
	json.Unmarshal(r.env.Data, &page)
	require(t, len(page.Items) == 2 && page.HasMore && page.Next == 2.0,
		"history?limit=2: got %s, want 2 items, hasMore and next 2", r.env.Data)
	want := m{"version": 2.0, "action": "update", "keyId": e.keyID, "requestId": "trace-7",
		"at": page.Items[1]["at"], "changes": m{"amount": m{"from": "19.90", "to": "24.90"},
			"description":       m{"from": "Monthly access", "to": nil},
			"metadata.orderRef": m{"from": "A-17", "to": nil}, "metadata.team": m{"from": nil, "to": "web"}}}
	expect(t, reflect.DeepEqual(page.Items[1], want), "the update: got %v\nwant %v", page.Items[1], want)
	r = e.do("GET", "/product-payment/history/"+id+"?after=2", e.key, "")
	r.want(t, 200, "")
	json.Unmarshal(r.env.Data, &page)
	deleted := m{"state": m{"from": "active", "to": "deleted"}}
	expect(t, len(page.Items) == 1 && !page.HasMore && reflect.DeepEqual(page.Items[0]["changes"], deleted),
		"history?after=2: got %s, want the delete alone, and the end", r.env.Data)
	for query, field := range map[string]string{"after=-1": "after", "after=9007199254740992": "after",
		"limit=0": "limit", "wait=1": "wait"} {
		e.do("GET", "/product-payment/history/"+id+"?"+query, e.key, "").wantFields(t, field)
	}
}

// An Idempotency-Key replays the first answer (refusals too) byte for byte for 24 h; ETag is the version.
func TestIdempotencyKeys(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	for i, req := range []struct{ method, path, body, ifMatch, code, etag string }{
		{"POST", "create", createBody(nil), "", "", `"1"`},
		{"POST", "create", `{"productName":""}`, "", "invalid_request", ""},
		{"DELETE", "delete/" + id, "", `"1"`, "", `"2"`},
		{"DELETE", "delete/" + id, "", `"1"`, "precondition_failed", ""},
		{"POST", "restore/btn_01JD0000000000000000000000", "", "", "not_found", ""},
	} {
		headers := []string{"Idempotency-Key", fmt.Sprint("key-", i), "If-Match", req.ifMatch}
		first := e.do(req.method, "/product-payment/"+req.path, e.key, req.body, headers...)
		again := e.do(req.method, "/product-payment/"+req.path, e.key, req.body, headers...)
		expect(t, first.env.Code == req.code && first.header.Get("ETag") == req.etag &&
			first.header.Get("Idempotent-Replayed") == "", "%s: got %s, %v; want code %q, ETag %s",
			first.request, first.raw, first.header, req.code, req.etag)
		expect(t, again.header.Get("Idempotent-Replayed") == "true" && again.status == first.status &&
			bytes.Equal(again.raw, first.raw) && again.header.Get("ETag") == req.etag,
			"%s again: got %d %s, %v; want %d %s, replayed", again.request, again.status, again.raw,
			again.header, first.status, first.raw)
	}
	body, create := createBody(nil), "/product-payment/create"
	e.do("POST", create, e.key, createBody(m{"amount": "1"}), "Idempotency-Key", "key-0").
		want(t, 422, "idempotency_mismatch")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "", "Idempotency-Key", "key-2", "If-Match", `"2"`).
		want(t, 422, "idempotency_mismatch") // If-Match is part of the request
	e.do("POST", create, e.otherKey, body, "Idempotency-Key", "key-0").want(t, 200, "") // another account's
	e.do("POST", create, e.key, body, "Idempotency-Key", "ct", "Content-Type", "text/plain").
		want(t, 415, "unsupported_media_type")
	e.do("POST", create, e.key, body, "Idempotency-Key", "ct").want(t, 200, "") // the 415 was not kept
	for _, key := range []string{"", strings.Repeat("k", 256), "tab\tin"} {
		e.do("POST", create, e.key, body, "Idempotency-Key", key).wantFields(t, "Idempotency-Key")
	}
	old := stamp(time.Now().Add(-25 * time.Hour))
	e.store.writer.Exec(`UPDATE idempotency_keys SET created_at = ? WHERE key = 'key-0'`, old)
	buttons := e.buttons()
	r := e.do("POST", create, e.key, body, "Idempotency-Key", "key-0")
	expect(t, r.header.Get("Idempotent-Replayed") == "" && e.buttons() == buttons+1,
		"a key 25 h old: got %s, %v; want a new button", r.raw, r.header)
}

// A write waiting for the lock holds its key (409); past busy_timeout it is a 503 whose retry runs.
func TestWriteWaitingForTheLock(t *testing.T) {
	e := newTestServer(t)
	held, path, body := e.holdWriteLock(), "/product-payment/create", createBody(nil)
	var last response
	done := make(chan error, 1)
	send := func() {
		var err error
		last, err = callAPI(http.DefaultClient, "POST", e.url+path, e.key, body, "Idempotency-Key", "once")
		done <- err
	}
	go send()
	began := awaitTrue(func() bool { return e.store.writer.Stats().InUse > 0 })
	require(t, began, "the first create did not begin its write within 20 s")
	e.do("POST", path, e.key, body, "Idempotency-Key", "once").want(t, 409, "idempotency_in_flight")
	if longTests() { // the lock held on past busy_timeout (5 s)
		err := <-done
		require(t, err == nil, "the first create: %v", err)
		last.want(t, 503, "unavailable")
		n := e.buttons() + e.count(`SELECT count(*) FROM idempotency_keys`)
		expect(t, last.header.Get("Retry-After") == "1" && n == 0, "got %v, %d buttons and answers kept; "+
			"want Retry-After: 1, none", last.header, n)
		go send() // the retry, which runs afresh once the lock is free
	}
	held.Rollback()
	err := <-done
	require(t, err == nil, "the create: %v", err)
	last.want(t, 200, "")
	expect(t, last.header.Get("Idempotent-Replayed") == "" && e.buttons() == 1, "got %s, %v; want a new "+
		"button, not replayed", last.raw, last.header)
}

// The file is WAL and writes synchronous=FULL; /healthz answers 503 when the database does not answer,
// and a panic is a 500 that logs its cause with the request id, never sent.
func TestHealthAndFailures(t *testing.T) {
	e := newTestServer(t)
	mode, synchronous := "", 0
	e.store.reader.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
	e.store.writer.QueryRow(`PRAGMA synchronous`).Scan(&synchronous)
	expect(t, mode == "wal" && synchronous == 2, "got journal_mode %q, the writer's synchronous %d; want "+
		"wal (reads never wait for the writer) and 2 (FULL)", mode, synchronous)
	e.do("GET", "/healthz", "", "").want(t, 200, "")
	e.store.reader.Close()
	r := e.do("GET", "/healthz", "", "")
	r.want(t, 503, "unavailable")
	expect(t, r.header.Get("Retry-After") == "1", "got headers %v, want Retry-After: 1", r.header)
	var logs bytes.Buffer
	s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
	rec, req := httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("X-Request-Id", "trace-500")
	s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") })).
		ServeHTTP(rec, req)
	expect(t, rec.Code == 500 && bytes.Equal(rec.Body.Bytes(), internalError), "got %d %s, want 500 %s",
		rec.Code, rec.Body, internalError)
	expect(t, strings.Contains(logs.String(), `msg=panic requestId=trace-500 panic="secret detail"`),
		"got log %s, want the panic with the request id", logs.String())
}
