package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A refusal has its status and code and changes nothing; a write's ETag is its button's version.
func TestRefusals(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	id, otherID, deleted := e.create(e.key, createBody(nil)), e.create(e.otherKey, createBody(nil)),
		e.create(e.key, createBody(nil))
	e.do("DELETE", "/product-payment/delete/"+deleted, e.key, "").want(t, 200, "")
	readOnly, _, _ := e.store.createKey(context.Background(), "acme", true)
	before, body := e.stored("acme", id), createBody(nil)
	p, create := "/product-payment/", "/product-payment/create"
	for _, c := range []struct {
		method, path, key, body, header string // header: "Name: value", or ""
		status                          int
		code                            string
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
		{"DELETE", p + "delete/" + otherID, e.key, "", "", 404, "not_found"},
		{"POST", p + "update/" + id, e.otherKey, `{"amount":"1"}`, "", 404, "not_found"},
		{"POST", p + "restore/" + id, e.key, "", "", 409, "wrong_state"}, // it is active
		{"DELETE", p + "delete/" + deleted, e.key, "", "", 409, "wrong_state"},
		{"POST", p + "update/" + deleted, e.key, `{"amount":"1"}`, "", 409, "wrong_state"},
		{"POST", p + "update/" + id, e.key, `{"ApplicationFeePercentage":"2"}`, "", 400, "invalid_request"},
		{"GET", "/nope", e.key, "", "", 404, "not_found"},
		{"GET", p + "history/" + id, e.key, "", "", 404, "not_found"}, // removed
		{"GET", p + "get/../create", e.key, "", "", 404, "not_found"}, // never redirected
		{"GET", p + "get/%2e%2e/x", e.key, "", "", 404, "not_found"},
		{"POST", create + "/", e.key, body, "", 404, "not_found"},
		{"GET", create, e.key, "", "", 405, "method_not_allowed"},
		{"OPTIONS", create, "", "", "", 405, "method_not_allowed"},
		{"POST", create, e.key, body, "Content-Type: text/plain", 415, "unsupported_media_type"},
		{"POST", create, e.key, body, "Content-Type: application/xml", 415, "unsupported_media_type"},
		{"POST", create, e.key, strings.Repeat(" ", 64<<10) + body, "", 413, "payload_too_large"},
		{"POST", create, e.key, body, "Content-Type: application/json; charset=utf-8", 200, ""},
		{"POST", create, e.key, body, "Content-Type: application/vnd.x+json", 200, ""},
		{"GET", p + "get/" + id, e.key, "", "Idempotency-Key: k", 200, ""}, // refused on writes only
		{"POST", create, e.key, body, "Idempotency-Key: k", 400, "invalid_request"},
		{"POST", create, e.key, body, "Idempotency-Key: ", 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", "Idempotency-Key: k", 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: "01"`, 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: "0"`, 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: 1`, 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: 1"`, 400, "invalid_request"},
		{"DELETE", p + "delete/" + id, e.key, "", `If-Match: "2"`, 412, "precondition_failed"},
		{"POST", p + "restore/" + deleted, e.key, "", `If-Match: *`, 200, ""},
	} {
		buttons := e.buttons()
		r := e.do(c.method, c.path, c.key, c.body, strings.Split(c.header, ": ")...)
		r.want(t, c.status, c.code)
		n, created := e.buttons(), c.path == create && c.status == 200
		expect(t, created == (n == buttons+1), "%s: got %d buttons, had %d", r.request, n, buttons)
		h := r.header
		expect(t, h.Get("Cache-Control") == "no-store" && h.Get("X-Content-Type-Options") == "nosniff" &&
			(h.Get("ETag") != "") == (c.status == 200), "%s: got headers %v", r.request, h)
		if strings.HasPrefix(c.header, "Idempotency-Key") && c.status == 400 {
			r.wantFields(t, "Idempotency-Key")
		}
	}
	after, restored := e.stored("acme", id), e.stored("acme", deleted)
	expect(t, reflect.DeepEqual(after, before), "got %s, want acme's button unchanged", jsonOf(after))
	expect(t, restored.State == "active" && restored.DeletedAt == nil, "restored: got %s", jsonOf(restored))
	// A 400 names at most 20 problems, each name cut to 40 characters, and says how many more there were.
	many := m{"a" + strings.Repeat("é", 40): 1, "b" + strings.Repeat("x", 39): 1, "applicationFeePercentage": "1"}
	for i := range 23 {
		many[fmt.Sprint("unknown", i)] = i
	}
	r := e.do("POST", create, e.key, jsonOf(many))
	r.want(t, 400, "invalid_request")
	errs, suggestion := r.env.Errors, `unknown name; did you mean "ApplicationFeePercentage"?`
	expect(t, len(errs) == 20 && errs["a"+strings.Repeat("é", 38)+"…"] != "" &&
		errs["b"+strings.Repeat("x", 39)] != "" && errs["applicationFeePercentage"] == suggestion &&
		strings.HasSuffix(r.env.Message, " and 12 more"), "32 problems: got %s", r.raw)
}

// Every answer has its request id: the caller's when it is sane. GET routes answer HEAD. A read writes
// nothing, and never answers 429. The access log names the request, the key and the button.
func TestHeadersAndLog(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	get := "/product-payment/get/" + id
	requestIDs := map[string]bool{"trace-7:x_y.z": true, "a=b": false, strings.Repeat("x", 129): false}
	for sent, sane := range requestIDs {
		got := e.do("GET", "/healthz", "", "", "X-Request-Id", sent).header.Get("X-Request-Id")
		expect(t, (got == sent) == sane && strings.HasPrefix(got, "req_") != sane, "%q: got %q", sent, got)
	}
	allow := e.do("POST", "/healthz", "", "").header.Get("Allow")
	expect(t, allow == "GET, HEAD", "POST /healthz: got Allow %q, want GET, HEAD", allow)
	head := e.do("HEAD", get, e.key, "")
	expect(t, head.status == 200 && head.header.Get("ETag") == `"1"` && len(head.raw) == 0,
		"HEAD: got %d %v %q, want 200, ETag \"1\", no body", head.status, head.header, head.raw)
	wal, err := os.ReadFile(e.db + "-wal")
	for range 120 {
		e.do("GET", get, e.key, "", "X-Request-Id", "trace-8").want(t, 200, "")
	}
	walAfter, err2 := os.ReadFile(e.db + "-wal")
	expect(t, cmp.Or(err, err2) == nil && bytes.Equal(wal, walAfter), "the gets changed the WAL (%v)",
		cmp.Or(err, err2))
	line := fmt.Sprintf(`status=200 duration=\S+ requestId=trace-8 keyId=%s buttonId=%s\n`, e.keyID, id)
	expect(t, regexp.MustCompile(line).MatchString(e.logged()), "no log line %s in\n%s", line, e.logged())
}

// list pages newest first and filters; each query parameter is checked. While buttons are made, pages
// never skip or repeat one.
func TestList(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	var ids []string
	for i := range 5 {
		method := []string{"Stripe", "the service"}[i%2]
		ids = append(ids, e.create(e.key, createBody(m{"paymentMethod": method, "isLive": i < 2})))
		time.Sleep(time.Millisecond) // ids sort by millisecond
	}
	e.do("DELETE", "/product-payment/delete/"+ids[4], e.key, "").want(t, 200, "")
	deleted := e.stored("acme", ids[4])
	expect(t, deleted.UpdatedAt > deleted.CreatedAt && deleted.Version == 2, "got %s", jsonOf(deleted))
	e.create(e.otherKey, createBody(nil))
	for _, c := range []struct {
		query string
		want  []string
		next  string // the last id when more follow, else ""
	}{
		{"", []string{ids[3], ids[2], ids[1], ids[0]}, ""},
		{"limit=4", []string{ids[3], ids[2], ids[1], ids[0]}, ""},
		{"limit=3", []string{ids[3], ids[2], ids[1]}, ids[1]},
		{"limit=2&after=" + ids[3], []string{ids[2], ids[1]}, ids[1]},
		{"state=deleted", []string{ids[4]}, ""},
		{"state=all&isLive=true", []string{ids[1], ids[0]}, ""},
		{"paymentMethod=the%20service", []string{ids[3], ids[1]}, ""},
		{"state=all&isLive=false&paymentMethod=Stripe", []string{ids[4], ids[2]}, ""},
	} {
		got, next := e.page(c.query)
		expect(t, slices.Equal(got, c.want) && next == c.next, "list?%s: got %v, next %q; want %v, %q",
			c.query, got, next, c.want, c.next)
	}
	for query, field := range map[string]string{"limit=0": "limit", "limit=101": "limit",
		"limit=%2B5": "limit", "limit=1&limit=2": "limit", "after=btn_x": "after", "after=btn_00": "after",
		"state=gone": "state", "isLive=1": "isLive", "paymentMethod=stripe": "paymentMethod", "%zz": "query",
		"since=0": "since", "after=" + strings.Repeat("0", 26): "after", // no btn_
		"after=btn_" + strings.Repeat("0", 25) + "1": "after"} { // decodes, but is not what encoding gives
		e.do("GET", "/product-payment/list?"+query, e.key, "").wantFields(t, field)
	}
	existing := map[string]int{}
	for range 20 {
		existing[e.create(e.key, createBody(nil))] = 0
	}
	first, _ := e.page("")
	expect(t, len(first) == 20, "list: got %d buttons, want 20 by default", len(first))
	stop, done := make(chan bool, 1), make(chan bool)
	go func() {
		defer close(done)
		for len(stop) == 0 {
			callAPI(http.DefaultClient, "POST", e.url+"/product-payment/create", e.key, createBody(nil))
		}
	}()
	for after, more := "", true; more; more = after != "" {
		var ids []string
		ids, after = e.page("limit=3&after=" + after)
		for _, id := range ids {
			existing[id]++
		}
	}
	stop <- true
	<-done
	for id, n := range existing {
		expect(t, n == 1, "the pages gave %s, made before they began, %d times; want once", id, n)
	}
}

// page lists with query and returns the ids and the next cursor ("" for none).
func (e *testEnv) page(query string) (ids []string, next string) {
	e.t.Helper()
	r := e.do("GET", "/product-payment/list?"+query, e.key, "")
	r.want(e.t, 200, "")
	var page struct {
		Items   []button
		HasMore bool
		Next    string // "" for null
	}
	json.Unmarshal(r.env.Data, &page)
	require(e.t, page.HasMore == (page.Next != ""), "list?%s: got %s, want next when hasMore", query, r.raw)
	for _, b := range page.Items {
		ids = append(ids, b.ID)
	}
	return ids, page.Next
}

// Every set of filters a list may send is a search of an index that ends in id: no scan, no sort.
func TestListUsesAnIndex(t *testing.T) {
	e, yes := newTestServer(t), true
	for _, state := range []string{"active", "deleted", "all"} {
		for _, isLive := range []*bool{nil, &yes} {
			for _, method := range []string{"", "Stripe"} {
				q := listQuery{Limit: 20, After: "btn_1", State: state, IsLive: isLive, PaymentMethod: method}
				query, args := q.sql("acme")
				rows, err := e.store.reader.Query("EXPLAIN QUERY PLAN "+query, args...)
				plan, err := collect(rows, err, func(r *sql.Rows) (step string, err error) {
					return step, r.Scan(new(int), new(int), new(int), &step)
				})
				search := `^\[SEARCH buttons USING (PRIMARY KEY|INDEX \w+) \(account=\?` +
					strings.Repeat(` AND \w+=\?`, len(args)-3) + ` AND id<\?\)\]$`
				expect(t, err == nil && regexp.MustCompile(search).MatchString(fmt.Sprint(plan)),
					"%+v: got plan %q (%v), want one search with every filter", q, plan, err)
			}
		}
	}
}

// Ids begin with the millisecond they were made in, then 80 random bits: none is the one before plus one.
func TestIDs(t *testing.T) {
	var last [16]byte
	first, random := uint64(time.Now().UnixMilli()), map[uint16]bool{}
	for range 5000 {
		id := newButtonID()
		raw, _ := crockford.DecodeString(strings.TrimPrefix(id, "btn_"))
		ms := binary.BigEndian.Uint64(raw) >> 16
		require(t, validButtonID(id) && ms >= first && ms <= uint64(time.Now().UnixMilli()), "got %s", id)
		low, lastLow := binary.BigEndian.Uint64(raw[8:]), binary.BigEndian.Uint64(last[8:])
		expect(t, low != lastLow+1 && low != lastLow, "got %s after %x: derived from it", id, last)
		random[binary.BigEndian.Uint16(raw[6:])] = true
		last = [16]byte(raw)
	}
	expect(t, len(random) > 1, "bits 48 to 63 of every id: got %v, want random bits", random)
}

// A write waits at most 5 s behind another process's lock: then 503 with Retry-After, nothing stored
// then or later. Reads go on meanwhile; a client that hangs up is no ERROR; the lock gone, writes go on.
func TestWriteWaitsAtMostFiveSeconds(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	require(t, e.store.writeWait == 5*time.Second, "a write waits %v, want 5 s", e.store.writeWait)
	e.store.writeWait = time.Second // the test waits 1 s, not 5

	other, _ := sql.Open("sqlite", sqliteURI(e.db, "_txlock=immediate")) // as another process
	defer other.Close()
	lock, err := other.Begin()
	require(t, err == nil, "take the write lock: %v", err)
	defer lock.Rollback()
	start, create := time.Now(), "/product-payment/create"
	var wg sync.WaitGroup
	for range 3 { // one waits for the lock, two behind it for the writer connection
		wg.Go(func() {
			r, err := callAPI(http.DefaultClient, "POST", e.url+create, e.key, createBody(nil))
			took := time.Since(start)
			expect(t, err == nil && r.status == 503 && r.env.Code == "unavailable" &&
				r.header.Get("Retry-After") == "1" && took >= time.Second && took < 2*time.Second,
				"behind the lock: got %s %v (%v) after %v; want 503 unavailable, Retry-After: 1 after 1 s",
				r.raw, r.header, err, took)
		})
	}
	ctx, hangUp := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+create, strings.NewReader(createBody(nil)))
	req.Header.Set("X-API-KEY", e.key)
	wg.Go(func() { http.DefaultClient.Do(req) })
	for range 20 {
		e.do("GET", "/product-payment/list", e.key, "").want(t, 200, "")
	}
	awaitTrue(func() bool { return e.store.writer.Stats().WaitCount >= 3 })
	hangUp()
	wg.Wait()
	lock.Rollback()
	expect(t, e.buttons() == 0, "got %d buttons after the lock went, want none", e.buttons())
	start = time.Now()
	e.create(e.key, createBody(nil))
	expect(t, time.Since(start) < time.Second, "the first create after the lock took %v", time.Since(start))
	log := e.logged()
	expect(t, strings.Count(log, "level=ERROR") == 3 && strings.Count(log, "status=499") == 1,
		"got log\n%s\nwant three ERRORs for the 503s, and the hang-up as status=499 alone", log)
}

// The file is WAL with synchronous=FULL. A full disk is a 503 that keeps nothing; a fault is a 500 that
// logs its cause with the request id and sends none; so is a panic. /healthz is 503 without a database.
func TestFaults(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	mode, synchronous := "", 0
	e.store.reader.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
	e.store.writer.QueryRow(`PRAGMA synchronous`).Scan(&synchronous)
	expect(t, mode == "wal" && synchronous == 2, "got %s, synchronous %d; want wal, 2", mode, synchronous)
	id := e.create(e.key, createBody(nil))
	e.store.writer.Exec(`PRAGMA max_page_count = 1`) // SQLite keeps what the file has: the disk is full
	big := createBody(m{"description": strings.Repeat("x", 900)})
	r := e.do("POST", "/product-payment/create", e.key, big)
	for i := 0; i < 100 && r.status == 200; i++ {
		r = e.do("POST", "/product-payment/create", e.key, big)
	}
	r.want(t, 503, "unavailable")
	buttons := e.buttons()
	r = e.do("POST", "/product-payment/update/"+id, e.key, `{"description":"`+strings.Repeat("y", 4000)+`"}`)
	r.want(t, 503, "unavailable")
	expect(t, r.env.Message == "the disk is full; retry later" && r.header.Get("Retry-After") == "1" &&
		e.buttons() == buttons && e.stored("acme", id).Version == 1, "a write on a full disk: got %s, "+
		"%v, %d buttons (had %d); want it refused, nothing kept", r.raw, r.header, e.buttons(), buttons)
	e.store.writer.Exec(`PRAGMA max_page_count = 1000000`)
	e.create(e.key, createBody(nil))
	execSQL(e.db, `ALTER TABLE buttons RENAME TO gone`) // a bug: the server's SQL names no such table
	r = e.do("POST", "/product-payment/create", e.key, createBody(nil), "X-Request-Id", "trace-500")
	execSQL(e.db, `ALTER TABLE gone RENAME TO buttons`)
	expect(t, bytes.Equal(r.raw, internalError), "a fault: got %d %s", r.status, r.raw)
	fault := `level=ERROR msg="request failed" requestId=trace-500 status=500 err=.*no such table`
	expect(t, regexp.MustCompile(fault).MatchString(e.logged()), "got log\n%s\nwant %s", e.logged(), fault)
	e.store.reader.Close()
	r = e.do("GET", "/healthz", "", "")
	r.want(t, 503, "unavailable")
	logged := "requestId=" + r.header.Get("X-Request-Id") + " status=503" // a new id, which the log names
	expect(t, r.header.Get("Retry-After") == "1" && strings.Contains(e.logged(), logged),
		"/healthz without a database: got %v, want Retry-After and a log line %s", r.header, logged)
	var logs bytes.Buffer
	s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
	rec, req := httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("X-Request-Id", "trace-panic")
	s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") })).
		ServeHTTP(rec, req)
	expect(t, rec.Code == 500 && bytes.Equal(rec.Body.Bytes(), internalError), "a panic: got %d %s", rec.Code,
		rec.Body)
	expect(t, strings.Contains(logs.String(), `msg=panic requestId=trace-panic panic="secret detail"`),
		"got log %s, want the panic with the request id", logs.String())
}
