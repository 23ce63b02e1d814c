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
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// testEnv is a real server on a real SQLite file, with a key for account "acme" and one for account "other".
type testEnv struct {
	t          testing.TB
	url, db    string
	store      *store
	key, keyID string // of account acme
	otherKey   string // of account other
}

// newTestServer serves a new database file over HTTP until the test ends; change edits the config (by default
// no rate limit).
func newTestServer(t testing.TB, change ...func(*config)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, db: filepath.Join(t.TempDir(), "test.db")}
	var err error
	if e.store, err = openStore(e.db); err != nil {
		t.Fatalf("openStore: %v", err)
	}
	e.key, e.keyID = e.mintKey("acme", false)
	e.otherKey, _ = e.mintKey("other", false)
	cfg := config{providerName: "the service"}
	for _, c := range change {
		c(&cfg)
	}
	srv := httptest.NewServer(newServer(e.store, slog.New(slog.DiscardHandler), cfg))
	t.Cleanup(func() {
		srv.Close()
		if err := e.store.close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	e.url = srv.URL
	return e
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
	request string // "METHOD url body", for failure messages
	status  int
	header  http.Header
	raw     []byte
	env     struct {
		IsSuccess bool              `json:"isSuccess"`
		Data      json.RawMessage   `json:"data"`
		Message   string            `json:"message"`
		Code      string            `json:"code"`
		Errors    map[string]string `json:"errors"`
	}
}

// dataString is the envelope's data as a string, "" if it is none.
func (r response) dataString() string {
	var s string
	json.Unmarshal(r.env.Data, &s)
	return s
}

// do sends a request to e's server, with key as X-API-KEY ("" for none) and headers as name, value pairs. It fails
// the test unless the answer is an envelope that openapi.json declares for it.
func (e *testEnv) do(method, path, key, body string, headers ...string) response {
	e.t.Helper()
	r, err := callAPI(http.DefaultClient, method, e.url+path, key, body, headers...)
	if err != nil {
		e.t.Fatalf("%s: %v", r.request, err)
	}
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
	if r.raw, err = io.ReadAll(resp.Body); err != nil {
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
	if r.status != status || r.env.IsSuccess != (status == 200) || r.env.Code != code {
		t.Fatalf("%s\ngot %d, isSuccess %v, code %q; want %d %v %q\n%s",
			r.request, r.status, r.env.IsSuccess, r.env.Code, status, status == 200, code, r.raw)
	}
}

// wantFields checks a 400 that names exactly fields.
func (r response) wantFields(t testing.TB, fields ...string) {
	t.Helper()
	r.want(t, 400, "invalid_request")
	if got := slices.Sorted(maps.Keys(r.env.Errors)); !slices.Equal(got, slices.Sorted(slices.Values(fields))) {
		t.Errorf("%s\ngot errors %v, want exactly %q", r.request, r.env.Errors, fields)
	}
}

// m is a JSON object to build bodies with.
type m = map[string]any

// createBody is a valid create body (19.90 USD, one time, Stripe) with changes; a nil value leaves a field out.
func createBody(changes m) string {
	body := m{"productName": "Pro plan", "description": "Monthly access", "amount": "19.90", "currency": "USD",
		"paymentMethod": "Stripe", "paymentType": "one_time", "isLive": false}
	for name, value := range changes {
		if body[name] = value; value == nil {
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
	if err != nil {
		e.t.Fatalf("read back %s: %v", id, err)
	}
	return b
}

// count runs a query that counts, such as `SELECT count(*) FROM buttons`.
func (e *testEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.reader.QueryRow(query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// view reads a button through get.
func (e *testEnv) view(key, id string) map[string]any {
	e.t.Helper()
	r := e.do("GET", "/product-payment/get/"+id, key, "")
	r.want(e.t, 200, "")
	var v map[string]any
	json.Unmarshal(r.env.Data, &v)
	return v
}

// runCLI runs the program in this process with args and env, and returns its stdout, its stderr and its error.
func runCLI(t testing.TB, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"paybuttons"}, args...),
		func(name string) string { return env[name] }, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// --- the operations, end to end ---

// Delete and restore move a button between its states, a version each; a deleted button is read, not updated.
func TestStateMachine(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	for i, s := range []struct {
		method, path, body, code, state string
		status, version                 int
	}{
		{"POST", "restore/", "", "wrong_state", "active", 409, 1},
		{"DELETE", "delete/", "", "", "deleted", 200, 2},
		{"DELETE", "delete/", "", "wrong_state", "deleted", 409, 2},
		{"POST", "update/", `{"amount":"5.00"}`, "wrong_state", "deleted", 409, 2},
		{"POST", "restore/", "", "", "active", 200, 3},
		{"POST", "update/", `{"amount":"5.00"}`, "", "active", 200, 4},
		{"POST", "update/", `{"amount":"5"}`, "", "active", 200, 4}, // unchanged: no new version
	} {
		r := e.do(s.method, "/product-payment/"+s.path+id, e.key, s.body)
		r.want(t, s.status, s.code)
		v := e.view(e.key, id)
		if v["state"] != s.state || v["version"] != float64(s.version) || (s.state == "deleted") == (v["deletedAt"] == nil) {
			t.Fatalf("step %d, %s: got %v, want state %s, version %d", i, r.request, v, s.state, s.version)
		}
		if s.status == 200 && (r.header.Get("ETag") != fmt.Sprintf(`"%d"`, s.version) || r.dataString() != id) {
			t.Errorf("%s: got ETag %q data %q, want \"%d\" and the id", r.request, r.header.Get("ETag"), r.dataString(), s.version)
		}
	}
	if n := e.count(`SELECT count(*) FROM history WHERE button_id = ?`, id); n != 4 {
		t.Errorf("got %d history rows, want 4: the unchanged update writes none", n)
	}
}

// Every refusal has its status and code and stores nothing; another account's button does not exist; every answer
// carries the usual headers.
func TestStatusCodesAndHeaders(t *testing.T) {
	e := newTestServer(t)
	id, otherID := e.create(e.key, createBody(nil)), e.create(e.otherKey, createBody(nil))
	before, create, body := e.stored("acme", id), "/product-payment/create", createBody(nil)
	for _, tt := range []struct {
		name, method, path, key, body string
		headers                       []string
		status                        int
		code                          string
	}{
		{"no key", "GET", "/product-payment/get/" + id, "", "", nil, 401, "unauthorized"},
		{"unknown key", "GET", "/product-payment/get/" + id, "pbk_nope", "", nil, 401, "unauthorized"},
		{"key before body", "POST", create, "", "{", nil, 401, "unauthorized"},
		{"unknown id", "GET", "/product-payment/get/btn_01JD0000000000000000000000", e.key, "", nil, 404, "not_found"},
		{"malformed id", "GET", "/product-payment/get/42", e.key, "", nil, 404, "not_found"},
		{"other account: get", "GET", "/product-payment/get/" + otherID, e.key, "", nil, 404, "not_found"},
		{"other account: history", "GET", "/product-payment/history/" + id, e.otherKey, "", nil, 404, "not_found"},
		{"other account: update", "POST", "/product-payment/update/" + id, e.otherKey, `{"amount":"1"}`, nil, 404, "not_found"},
		{"other account: delete", "DELETE", "/product-payment/delete/" + id, e.otherKey, "", nil, 404, "not_found"},
		{"other account: restore", "POST", "/product-payment/restore/" + id, e.otherKey, "", nil, 404, "not_found"},
		{"unknown path", "GET", "/nope", e.key, "", nil, 404, "not_found"},
		{"removed: change feed", "GET", "/product-payment/changes", e.key, "", nil, 404, "not_found"},
		{"removed: metrics", "GET", "/metrics", "", "", nil, 404, "not_found"},
		{"dot-dot, not redirected", "GET", "/product-payment/get/../create", e.key, "", nil, 404, "not_found"},
		{"double slash", "GET", "/product-payment//get/" + id, e.key, "", nil, 404, "not_found"},
		{"encoded dot segment", "GET", "/product-payment/get/%2e%2e/x", e.key, "", nil, 404, "not_found"},
		{"trailing slash", "POST", create + "/", e.key, body, nil, 404, "not_found"},
		{"wrong method", "GET", create, e.key, "", nil, 405, "method_not_allowed"},
		{"OPTIONS", "OPTIONS", create, "", "", nil, 405, "method_not_allowed"},
		{"not JSON", "POST", create, e.key, body, []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"charset", "POST", create, e.key, body, []string{"Content-Type", "application/json; charset=utf-8"}, 200, ""},
		{"+json", "POST", create, e.key, body, []string{"Content-Type", "application/vnd.x+json"}, 200, ""},
		{"too large", "POST", create, e.key, strings.Repeat(" ", 64<<10) + body, nil, 413, "payload_too_large"},
		{"bad If-Match", "DELETE", "/product-payment/delete/" + id, e.key, "", []string{"If-Match", `"01"`}, 400, "invalid_request"},
		{"stale If-Match", "DELETE", "/product-payment/delete/" + id, e.key, "", []string{"If-Match", `"2"`}, 412, "precondition_failed"},
		{"update that does not fit", "POST", "/product-payment/update/" + id, e.key, `{"currency":"JPY"}`, nil, 400, "invalid_request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			buttons := e.count(`SELECT count(*) FROM buttons`)
			r := e.do(tt.method, tt.path, tt.key, tt.body, tt.headers...)
			r.want(t, tt.status, tt.code)
			if n := e.count(`SELECT count(*) FROM buttons`); (tt.status == 200) != (n == buttons+1) {
				t.Errorf("%s: got %d buttons after it, had %d", r.request, n, buttons)
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
		})
	}
	if after := e.stored("acme", id); !reflect.DeepEqual(after, before) {
		t.Errorf("got %+v, want acme's button unchanged: %+v", after, before)
	}
	for sent, want := range map[string]string{"trace-42": "trace-42", "bad id\u00e9": "req_", "": "req_"} {
		if got := e.do("GET", "/nope", "", "", "X-Request-Id", sent).header.Get("X-Request-Id"); !strings.HasPrefix(got, want) {
			t.Errorf("sent X-Request-Id %q: got %q, want %q", sent, got, want)
		}
	}
}

// A refusal names at most 20 problems, each name cut to 40 characters, and says how many more there were.
func TestRefusalsAreBounded(t *testing.T) {
	e := newTestServer(t)
	body := m{"a" + strings.Repeat("x", 99): 1}
	for i := range 24 {
		body[fmt.Sprint("unknown", i)] = i
	}
	text, _ := json.Marshal(body)
	r := e.do("POST", "/product-payment/create", e.key, string(text))
	r.want(t, 400, "invalid_request")
	if len(r.env.Errors) != 20 || r.env.Errors["a"+strings.Repeat("x", 38)+"…"] == "" ||
		!strings.HasPrefix(r.env.Message, "31 fields are invalid: ") || !strings.HasSuffix(r.env.Message, " and 11 more") {
		t.Errorf("got %d errors, message %q; want 20, the long name cut, and \"31 fields ... and 11 more\"\n%v",
			len(r.env.Errors), r.env.Message, r.env.Errors)
	}
}

// Each key has its own token bucket; past it a request is refused with Retry-After and does nothing.
func TestRateLimit(t *testing.T) {
	e := newTestServer(t, func(c *config) { c.rate, c.burst = 0.001, 2 })
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	r := e.do("POST", "/product-payment/create", e.key, createBody(nil))
	r.want(t, 429, "rate_limited")
	if r.header.Get("Retry-After") != "1000" || e.count(`SELECT count(*) FROM buttons`) != 0 {
		t.Errorf("got Retry-After %q and %d buttons, want 1000 (1/0.001 s) and 0", r.header.Get("Retry-After"),
			e.count(`SELECT count(*) FROM buttons`))
	}
	spare, _ := e.mintKey("acme", false) // a bucket per key, not per account
	e.do("GET", "/product-payment/get/x", spare, "").want(t, 404, "not_found")
}

// A read-only key reads and is refused every write before its body is read; a revoked key, by another process
// too, is refused at its next request like an unknown one, while the account's other keys work on.
func TestReadOnlyAndRevokedKeys(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	readOnly, _ := e.mintKey("acme", true)
	spare, spareID := e.mintKey("acme", false)
	e.view(readOnly, id)
	for _, req := range [][]string{{"POST", "create", "{"}, {"POST", "update/" + id, `{"amount":"1"}`},
		{"DELETE", "delete/" + id, ""}, {"POST", "restore/" + id, ""}} {
		e.do(req[0], "/product-payment/"+req[1], readOnly, req[2], "Idempotency-Key", "ro").want(t, 403, "forbidden")
	}
	if _, _, err := runCLI(t, nil, "keys", "revoke", "-db", e.db, spareID); err != nil {
		t.Fatalf("keys revoke: %v", err)
	}
	unknown := e.do("GET", "/product-payment/get/"+id, "pbk_unknown", "")
	for _, path := range []string{"get/" + id, "list", "history/" + id} {
		r := e.do("GET", "/product-payment/"+path, spare, "")
		if r.want(t, 401, "unauthorized"); r.env.Message != unknown.env.Message {
			t.Errorf("%s: got %q, want %q as for an unknown key", r.request, r.env.Message, unknown.env.Message)
		}
	}
	if v := e.view(e.key, id); v["version"] != 1.0 || e.count(`SELECT count(*) FROM idempotency_keys`) != 0 {
		t.Errorf("got %v and stored answers, want version 1 and none kept for a 403", v)
	}
}

// list pages newest first and filters; every query parameter is checked, and ones never built are refused.
func TestList(t *testing.T) {
	e := newTestServer(t)
	var ids []string
	for i := range 5 {
		method := []string{"Stripe", "the service"}[i%2]
		ids = append(ids, e.create(e.key, createBody(m{"paymentMethod": method, "isLive": i < 2})))
	}
	e.do("DELETE", "/product-payment/delete/"+ids[4], e.key, "").want(t, 200, "")
	e.create(e.otherKey, createBody(nil))
	list := func(query string) (got []string, next any) {
		t.Helper()
		r := e.do("GET", "/product-payment/list?"+query, e.key, "")
		r.want(t, 200, "")
		var data struct {
			Items   []struct{ ID string }
			HasMore bool
			Next    any
		}
		json.Unmarshal(r.env.Data, &data)
		for _, item := range data.Items {
			got = append(got, item.ID)
		}
		if data.HasMore != (data.Next != nil) {
			t.Errorf("%s: hasMore %v with next %v", r.request, data.HasMore, data.Next)
		}
		return got, data.Next
	}
	for query, want := range map[string][]string{
		"":                            {ids[3], ids[2], ids[1], ids[0]},
		"limit=2&after=" + ids[3]:     {ids[2], ids[1]},
		"state=deleted":               {ids[4]},
		"state=all&isLive=true":       {ids[1], ids[0]},
		"paymentMethod=the%20service": {ids[3], ids[1]},
	} {
		if got, _ := list(query); !slices.Equal(got, want) {
			t.Errorf("list?%s: got %v, want %v", query, got, want)
		}
	}
	if got, next := list("limit=3"); len(got) != 3 || next != ids[1] {
		t.Errorf("list?limit=3: got %v next %v, want 3 items and next %s", got, next, ids[1])
	}
	for query, field := range map[string]string{"limit=0": "limit", "limit=101": "limit", "limit=+5": "limit",
		"after=btn_x": "after", "state=gone": "state", "isLive=1": "isLive", "paymentMethod=stripe": "paymentMethod",
		"metadata%5Bteam%5D=web": "metadata[team]", "since=0": "since", "limit=1&limit=2": "limit", "%zz": "query"} {
		e.do("GET", "/product-payment/list?"+query, e.key, "").wantFields(t, field)
	}
}

// history pages a button's changes, oldest first, with their author and what changed as get shows it.
func TestHistory(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(m{"metadata": m{"orderRef": "A-17"}}))
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"24.9","description":null,"metadata":{"orderRef":null,"team":"web"}}`,
		"X-Request-Id", "trace-7").want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 200, "")
	r := e.do("GET", "/product-payment/history/"+id+"?limit=2", e.key, "")
	r.want(t, 200, "")
	var page struct {
		Items   []map[string]any
		HasMore bool
		Next    any
	}
	json.Unmarshal(r.env.Data, &page)
	update := m{"version": 2.0, "action": "update", "keyId": e.keyID, "requestId": "trace-7", "at": page.Items[1]["at"],
		"changes": m{"amount": m{"from": "19.90", "to": "24.90"}, "description": m{"from": "Monthly access", "to": nil},
			"metadata.orderRef": m{"from": "A-17", "to": nil}, "metadata.team": m{"from": nil, "to": "web"}}}
	created := page.Items[0]["changes"].(map[string]any)
	if len(page.Items) != 2 || !page.HasMore || page.Next != 2.0 || !reflect.DeepEqual(page.Items[1], update) ||
		created["amount"].(map[string]any)["to"] != "19.90" || len(created) != 9 {
		t.Errorf("history?limit=2: got %s\nwant the create (9 fields set) and %v, hasMore, next 2", r.env.Data, update)
	}
	r = e.do("GET", "/product-payment/history/"+id+"?after=2", e.key, "")
	r.want(t, 200, "")
	json.Unmarshal(r.env.Data, &page)
	if len(page.Items) != 1 || page.HasMore || page.Next != nil ||
		!reflect.DeepEqual(page.Items[0]["changes"], map[string]any{"state": m{"from": "active", "to": "deleted"}}) {
		t.Errorf("history?after=2: got %s, want the delete alone, and the end", r.env.Data)
	}
	for query, field := range map[string]string{"after=-1": "after", "after=9007199254740992": "after",
		"limit=0": "limit", "wait=1": "wait"} {
		e.do("GET", "/product-payment/history/"+id+"?"+query, e.key, "").wantFields(t, field)
	}
}

// An Idempotency-Key replays the first answer byte for byte, refusals included; another request with it is a 422,
// the key of another account is another key, and what is answered before the operation runs is not kept.
func TestIdempotencyKeys(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	for i, req := range []struct{ method, path, body, ifMatch, code string }{
		{"POST", "create", createBody(nil), "", ""},
		{"POST", "create", `{"productName":""}`, "", "invalid_request"},
		{"DELETE", "delete/" + id, "", `"1"`, ""},
		{"DELETE", "delete/" + id, "", `"1"`, "precondition_failed"},
		{"POST", "restore/btn_01JD0000000000000000000000", "", "", "not_found"},
	} {
		headers := []string{"Idempotency-Key", fmt.Sprint("key-", i), "If-Match", req.ifMatch}
		first := e.do(req.method, "/product-payment/"+req.path, e.key, req.body, headers...)
		again := e.do(req.method, "/product-payment/"+req.path, e.key, req.body, headers...)
		if first.env.Code != req.code || again.header.Get("Idempotent-Replayed") != "true" ||
			first.header.Get("Idempotent-Replayed") != "" || again.status != first.status ||
			!bytes.Equal(again.raw, first.raw) || again.header.Get("ETag") != first.header.Get("ETag") {
			t.Errorf("%s twice: got %d %s (ETag %q), then %d %s (ETag %q, replayed %q); want code %q replayed",
				first.request, first.status, first.raw, first.header.Get("ETag"), again.status, again.raw,
				again.header.Get("ETag"), again.header.Get("Idempotent-Replayed"), req.code)
		}
	}
	body := createBody(nil)
	e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "1"}), "Idempotency-Key", "key-0").
		want(t, 422, "idempotency_mismatch")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "", "Idempotency-Key", "key-2", "If-Match", `"2"`).
		want(t, 422, "idempotency_mismatch") // If-Match is part of the request
	e.do("POST", "/product-payment/create", e.otherKey, body, "Idempotency-Key", "key-0").want(t, 200, "")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct", "Content-Type", "text/plain").
		want(t, 415, "unsupported_media_type")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct").want(t, 200, "")
	if kept, buttons := e.count(`SELECT count(*) FROM idempotency_keys`), e.count(`SELECT count(*) FROM buttons`); kept != 7 || buttons != 4 {
		t.Errorf("got %d kept answers and %d buttons, want 7 (key-0..4, other's key-0, ct) and 4", kept, buttons)
	}
	for _, key := range []string{"", strings.Repeat("k", 256), "tab\tin"} {
		e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", key).wantFields(t, "Idempotency-Key")
	}
	// After 24 hours an answer is gone: the key runs its request afresh.
	e.store.writer.Exec(`UPDATE idempotency_keys SET created_at = ? WHERE key = 'key-0'`, stamp(time.Now().Add(-25*time.Hour)))
	if r := e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "key-0"); r.header.Get("Idempotent-Replayed") != "" ||
		e.count(`SELECT count(*) FROM buttons`) != 5 {
		t.Errorf("an expired key: got %s (replayed %q), want a new button", r.raw, r.header.Get("Idempotent-Replayed"))
	}
}

// While a write with an Idempotency-Key runs, the same key is answered 409 and the write goes on to its answer.
func TestIdempotencyKeyInFlight(t *testing.T) {
	e := newTestServer(t)
	e.do("GET", "/product-payment/list", e.key, "").want(t, 200, "") // the key's last use, noted now, not in the test
	lock, err := sql.Open("sqlite", sqliteURI(e.db, "_pragma=busy_timeout(5000)&_txlock=immediate"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	held, err := lock.Begin() // the write lock: the first create waits for it, holding its key
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan response, 1)
	go func() {
		r, _ := callAPI(http.DefaultClient, "POST", e.url+"/product-payment/create", e.key, createBody(nil),
			"Idempotency-Key", "once")
		first <- r
	}()
	for deadline := time.Now().Add(5 * time.Second); e.store.writer.Stats().InUse == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first create never began its write")
		}
	}
	e.do("POST", "/product-payment/create", e.key, createBody(nil), "Idempotency-Key", "once").
		want(t, 409, "idempotency_in_flight")
	held.Rollback()
	if r := <-first; r.status != 200 || e.count(`SELECT count(*) FROM buttons`) != 1 {
		t.Errorf("the first create: got %d %s and %d buttons, want 200 and 1", r.status, r.raw, e.count(`SELECT count(*) FROM buttons`))
	}
}

// /healthz answers 200 while the database answers a read, 503 with Retry-After when it does not.
func TestHealthz(t *testing.T) {
	e := newTestServer(t)
	e.do("GET", "/healthz", "", "").want(t, 200, "")
	e.store.reader.Close()
	r := e.do("GET", "/healthz", "", "")
	if r.want(t, 503, "unavailable"); r.header.Get("Retry-After") != "1" {
		t.Errorf("got Retry-After %q, want 1", r.header.Get("Retry-After"))
	}
}

// A panic is a 500 with the generic envelope; the log has the cause and the request id.
func TestPanicIsA500(t *testing.T) {
	var logs bytes.Buffer
	s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
	rec, req := httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("X-Request-Id", "trace-500")
	s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") })).ServeHTTP(rec, req)
	if rec.Code != 500 || !bytes.Equal(rec.Body.Bytes(), internalError) ||
		!strings.Contains(logs.String(), `msg=panic requestId=trace-500 panic="secret detail"`) {
		t.Errorf("got %d %s, log %s; want 500 %s, and the panic logged with the request id", rec.Code, rec.Body,
			logs.String(), internalError)
	}
}
