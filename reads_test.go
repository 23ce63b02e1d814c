package main

// The reads: list, history, the change feed, metadata, read-only keys and metrics.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// listPageOf reads one list page through the API.
func (e *testEnv) listPageOf(key, query string) (ids []string, hasMore bool, next string) {
	e.t.Helper()
	r := e.do("GET", "/product-payment/list?"+query, key, "")
	r.want(e.t, 200, "")
	p := dataOf[page[buttonView, *string]](e.t, r)
	for _, it := range p.Items {
		ids = append(ids, it.ID)
	}
	if p.Next != nil {
		next = *p.Next
	}
	return ids, p.HasMore, next
}

// Paging newest first lists each of the account's buttons once, while others are created.
func TestListPagesSeeEachButtonOnceWhileOthersAreCreated(t *testing.T) {
	e := newTestServer(t)
	var existing []string
	for i := range 45 {
		existing = append(existing, e.create(e.key, createBody(m{"productName": fmt.Sprint("b", i)})))
	}
	e.create(e.keyB, createBody(nil))
	var wg sync.WaitGroup
	defer wg.Wait() // the goroutine ends before the server closes, even after a Fatal
	wg.Go(func() {
		for range 20 { // callAPI, not e.create: a goroutine may not end the test; the count below tells
			callAPI(http.DefaultClient, "POST", e.url+"/product-payment/create", e.key, createBody(nil))
		}
	})
	var seen []string
	for query, hasMore := "state=all&limit=7", true; hasMore; {
		var ids []string
		var next string
		ids, hasMore, next = e.listPageOf(e.key, query)
		if hasMore != (next != "") || hasMore && next != ids[len(ids)-1] {
			t.Fatalf("list?%s: got %v hasMore %v next %q, want next the last id, null on the last page",
				query, ids, hasMore, next)
		}
		seen, query = append(seen, ids...), "state=all&limit=7&after="+next
	}
	if wg.Wait(); e.countButtons() != 66 {
		t.Errorf("got %d buttons, want 66: 45 and 20 of acme's, made before and while paging, and 1 of other's",
			e.countButtons())
	}
	for i, id := range seen {
		if i > 0 && id >= seen[i-1] {
			t.Errorf("got %s after %s, want each id once, newest first", id, seen[i-1])
		}
		if b, err := e.stored("acme", id); err != nil || b.Account != "acme" {
			t.Errorf("listed %s, which is not acme's (%v)", id, err)
		}
	}
	if slices.Reverse(existing); len(seen) < 45 || !slices.Equal(seen[len(seen)-45:], existing) {
		t.Errorf("got %v, want it to end with the 45 buttons there before paging began, newest first", seen)
	}
}

// List filters by state, isLive and paymentMethod, goes on after an id, and names a refused parameter. -provider-name
// names the own processor for create and list alike; the default name is refused then.
func TestListQueries(t *testing.T) {
	e := newTestServer(t, func(c *config) { c.providerName = "Acme Pay" })
	live := e.create(e.key, createBody(m{"isLive": true}))
	connect := e.create(e.key, createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "1"}))
	gone := e.create(e.key, createBody(m{"paymentMethod": "Acme Pay"}))
	e.do("POST", "/product-payment/create", e.key, createBody(m{"paymentMethod": "the service"})).
		wantFields(t, "paymentMethod")
	e.do("DELETE", "/product-payment/delete/"+gone, e.key, "").want(t, 200, "")
	e.create(e.keyB, createBody(m{"isLive": true}))
	for query, want := range map[string][]string{
		"":                                      {connect, live},
		"state=deleted":                         {gone},
		"state=all":                             {gone, connect, live},
		"state=all&isLive=true":                 {live},
		"isLive=false":                          {connect},
		"state=all&paymentMethod=StripeConnect": {connect},
		"paymentMethod=Acme+Pay":                nil,
		"state=all&paymentMethod=Acme+Pay":      {gone},
		"state=all&limit=1&after=" + connect:    {live},
	} {
		if got, _, _ := e.listPageOf(e.key, query); !slices.Equal(got, want) {
			t.Errorf("list?%s: got %v, want %v", query, got, want)
		}
	}
	for query, param := range map[string]string{
		"limit=0": "limit", "limit=101": "limit", "limit=%2B5": "limit", "state=gone": "state", "isLive=yes": "isLive",
		"paymentMethod=stripe": "paymentMethod", "after=btn_nope": "after", "Limit=5": "Limit", "limit=5&limit=6": "limit",
		"limit=0&state=x&isLive": "state", "metadata%5Bbad+key%5D=x": "metadata[bad key]",
		"paymentMethod=the+service": "paymentMethod", "wait=1": "wait",
	} {
		if r := e.do("GET", "/product-payment/list?"+query, e.key, ""); r.status != 400 || r.env.Errors[param] == "" {
			t.Errorf("list?%s: got %d %v, want a 400 naming %q", query, r.status, r.env.Errors, param)
		}
	}
}

// An unindexed filter examines at most maxScan rows a page, so its cost does not grow with the account.
func TestFilteredListExaminesAtMostMaxScanRows(t *testing.T) {
	e := newTestServer(t)
	match := e.create(e.key, createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "1",
		"metadata": m{"team": "web"}}))
	// maxScan + 200 buttons that match no filter, newer than the match: "btn_7..." sorts after any id made today.
	e.exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO buttons (id, account, `+buttonFields+`, created_key_id, created_request_id, change_seq)
		SELECT printf('btn_7%025d', i), 'acme', 'W', NULL, 100, 'USD', NULL, 'Stripe', 'one_time', 0, NULL, NULL,
			'active', 1, '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', NULL, 'k', 'r', i FROM n`, maxScan+200)
	nth := func(n int) string { return fmt.Sprintf("btn_7%025d", maxScan+201-n) } // the nth newest
	for _, filter := range []string{"paymentMethod=StripeConnect", "isLive=true&state=all", "metadata%5Bteam%5D=web"} {
		got, hasMore, next := e.listPageOf(e.key, filter)
		if len(got) != 0 || !hasMore || next != nth(maxScan) {
			t.Errorf("list?%s: got %v hasMore %v next %s, want an empty page that goes on after the %dth newest, %s",
				filter, got, hasMore, next, maxScan, nth(maxScan))
		}
		if filter != "isLive=true&state=all" {
			if got, hasMore, _ := e.listPageOf(e.key, filter+"&after="+next); !slices.Equal(got, []string{match}) || hasMore {
				t.Errorf("list?%s after %s: got %v hasMore %v, want the one match and the end", filter, next, got, hasMore)
			}
		}
	}
	if got, _, _ := e.listPageOf(e.key, "limit=2"); !slices.Equal(got, []string{nth(1), nth(2)}) {
		t.Errorf("unfiltered list: got %v, want the newest two %v", got, []string{nth(1), nth(2)})
	}
}

// Metadata is set on create, merged key by key on update, and shown in history as an entry a key. A metadata[KEY]
// filter keeps the account's buttons whose metadata has exactly that value; several must all match. list takes at most
// 50, as many as a button may hold, and caches no statement whose text depends on them: lists with 1 to 50 filters
// leave the statement cache as it was (issue 16, item 7).
func TestMetadata(t *testing.T) {
	e := newTestServer(t)
	keys, filters := m{}, []string{}
	for i := range 51 {
		keys[fmt.Sprint("k", i)] = "v"
		filters = append(filters, fmt.Sprintf("metadata%%5Bk%d%%5D=v", i))
	}
	delete(keys, "k50")
	id := e.create(e.key, createBody(m{"metadata": m{"orderRef": "A-17", "team": "web", "gone": ""}}))
	// Update merges: a string sets, null or "" removes, keys not named stay; "gone" was never stored.
	for _, body := range []string{`{"metadata":{"team":null,"orderRef":"A-18","campaign":"x"}}`,
		`{"metadata":{"campaign":""},"productName":"Renamed"}`, `{"metadata":null,"productName":"Again"}`} {
		e.do("POST", "/product-payment/update/"+id, e.key, body).want(t, 200, "")
	}
	if b := e.mustStored("acme", id); !maps.Equal(b.Metadata, metadata{"orderRef": "A-18"}) || b.Version != 4 {
		t.Errorf("after the merges got %v version %d, want only orderRef A-18, version 4", b.Metadata, b.Version)
	}
	fifty, _ := json.Marshal(m{"metadata": keys})
	e.do("POST", "/product-payment/update/"+id, e.key, string(fifty)).wantFields(t, "metadata") // 51 with orderRef
	// History shows each metadata key that changed as an entry of its own.
	h := e.do("GET", "/product-payment/history/"+id+"?after=1&limit=1", e.key, "")
	h.want(t, 200, "")
	want := map[string]change{"metadata.team": {"web", nil}, "metadata.orderRef": {"A-17", "A-18"},
		"metadata.campaign": {nil, "x"}}
	if got := dataOf[page[historyItem, *int64]](t, h).Items; len(got) != 1 || !reflect.DeepEqual(got[0].Changes, want) {
		t.Errorf("history of the merge: got %s, want one entry per changed key", h.env.Data)
	}
	e.create(e.keyB, createBody(m{"metadata": keys}))
	all := e.create(e.key, createBody(m{"metadata": keys}))
	one := e.create(e.key, createBody(m{"metadata": m{"k0": "v", "k1": "w"}}))
	e.listPageOf(e.key, filters[0]) // prepares the statements every list runs, once
	cached := func() (n int) {
		e.store.reads.cache.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	before := cached()
	for n := 1; n <= 50; n++ {
		want := []string{all}
		if n == 1 {
			want = []string{one, all}
		}
		if got, _, _ := e.listPageOf(e.key, strings.Join(filters[:n], "&")); !slices.Equal(got, want) {
			t.Errorf("list with %d metadata filters: got %v, want %v", n, got, want)
		}
	}
	if after := cached(); after > before {
		t.Errorf("got %d statements cached after lists with 1 to 50 filters, want %d as before", after, before)
	}
	e.do("GET", "/product-payment/list?"+strings.Join(filters, "&"), e.key, "").wantFields(t, "metadata")
}

// History holds an entry per change, with its key, request id and changed fields, none for a refusal; pages hold the
// same entries, each once. after is bounded, so that next never overflows (issue 16, item 8).
func TestHistory(t *testing.T) {
	e := newTestServer(t)
	r := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "10.00"}), "X-Request-Id", "req-create")
	r.want(t, 200, "")
	id := r.dataString()
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"12.00","description":null}`,
		"X-Request-Id", "req-update").want(t, 200, "")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"-1"}`).want(t, 400, "invalid_request")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"13.00"}`, "If-Match", `"1"`).
		want(t, 412, "precondition_failed")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 409, "wrong_state")
	e.do("POST", "/product-payment/restore/"+id, e.key, "").want(t, 200, "")
	h := e.do("GET", "/product-payment/history/"+id, e.key, "")
	h.want(t, 200, "")
	items := dataOf[page[historyItem, *int64]](t, h).Items
	var actions []string
	for i, it := range items {
		actions = append(actions, it.Action)
		if it.KeyID != e.keyID || it.At.IsZero() || it.RequestID == "" || it.Version != int64(i+1) {
			t.Errorf("%s entry: got keyId %q at %v requestId %q version %d, want %q, both set and version %d",
				it.Action, it.KeyID, it.At, it.RequestID, it.Version, e.keyID, i+1)
		}
	}
	if want := []string{"create", "update", "delete", "restore"}; !slices.Equal(actions, want) {
		t.Fatalf("got actions %v, want %v (refused changes write nothing)\n%s", actions, want, h.raw)
	}
	create, update := items[0], items[1]
	if c := create.Changes["amount"]; c.From != nil || c.To != "10.00" || len(create.Changes) != 8 ||
		create.RequestID != "req-create" {
		t.Errorf("create: got changes %+v request %q, want null -> 10.00 for amount and each of the 7 other fields "+
			"set (not billingInterval, fee or metadata), req-create", create.Changes, create.RequestID)
	}
	if len(update.Changes) != 2 || update.Changes["amount"] != (change{"10.00", "12.00"}) ||
		update.Changes["description"] != (change{"Monthly access", nil}) || update.RequestID != "req-update" {
		t.Errorf("update: got changes %+v request %q, want amount 10.00 -> 12.00 and description cleared only, "+
			"req-update", update.Changes, update.RequestID)
	}
	for i, want := range []change{{"active", "deleted"}, {"deleted", "active"}} { // delete, restore
		if got := items[i+2].Changes; len(got) != 1 || got["state"] != want {
			t.Errorf("%s: got changes %+v, want state %v only", items[i+2].Action, got, want)
		}
	}
	var paged []historyItem // pages of 3: versions 1 to 3, then 4
	for pages, after := 1, "0"; after != ""; pages++ {
		r := e.do("GET", "/product-payment/history/"+id+"?limit=3&after="+after, e.key, "")
		r.want(t, 200, "")
		p := dataOf[page[historyItem, *int64]](t, r)
		if paged, after = append(paged, p.Items...), ""; p.Next != nil {
			after = strconv.FormatInt(*p.Next, 10)
		}
		if p.HasMore != (p.Next != nil) || pages > 2 {
			t.Fatalf("%s: got hasMore %v next %v, want next the last version, on 2 pages", r.request, p.HasMore, p.Next)
		}
	}
	if !reflect.DeepEqual(paged, items) {
		t.Errorf("pages of 3: got %+v, want the history as one page has it: %+v", paged, items)
	}
	r = e.do("GET", "/product-payment/history/"+id+"?after=9007199254740991", e.key, "") // 2^53-1, the largest
	if r.want(t, 200, ""); string(r.env.Data) != `{"items":[],"hasMore":false,"next":null}` {
		t.Errorf("%s: got %s, want no items and next null", r.request, r.env.Data)
	}
	for query, fields := range map[string][]string{"limit=101&after=x": {"limit", "after"}, "wait=1": {"wait"},
		"after=9007199254740992": {"after"}, "after=9223372036854775807": {"after"}, "after=-1": {"after"}} {
		e.do("GET", "/product-payment/history/"+id+"?"+query, e.key, "").wantFields(t, fields...)
	}
}

// feed reads one page of the change feed.
func (e *testEnv) feed(key, query string) (ids []string, seqs []int64, hasMore bool, next int64) {
	e.t.Helper()
	r := e.do("GET", "/product-payment/changes?"+query, key, "")
	r.want(e.t, 200, "")
	p := dataOf[page[buttonView, int64]](e.t, r)
	for _, it := range p.Items {
		ids, seqs = append(ids, it.ID), append(seqs, it.ChangeSeq)
	}
	return ids, seqs, p.HasMore, p.Next
}

// The change feed lists an account's buttons once each, in the order they last changed, in pages.
func TestChangeFeed(t *testing.T) {
	e := newTestServer(t)
	a1 := e.create(e.key, createBody(m{"metadata": m{"team": "web"}}))
	b1 := e.create(e.keyB, createBody(nil)) // interleaved with another account's changes
	a2 := e.create(e.key, createBody(nil))
	e.do("POST", "/product-payment/update/"+a1, e.key, `{"amount":"1.00"}`).want(t, 200, "")
	e.do("POST", "/product-payment/update/"+b1, e.keyB, `{"amount":"1.00"}`).want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+a1, e.key, "").want(t, 200, "")
	ids, seqs, hasMore, next := e.feed(e.key, "")
	if !slices.Equal(ids, []string{a2, a1}) || hasMore || next != seqs[1] || !slices.IsSorted(seqs) {
		t.Fatalf("since=0: got %v %v hasMore %v next %d, want a2, then a1 once", ids, seqs, hasMore, next)
	}
	if v := e.getView(e.key, a1); v["state"] != "deleted" || int64(v["changeSeq"].(float64)) != seqs[1] {
		t.Errorf("get shows %v %v, want the deleted button at changeSeq %d", v["state"], v["changeSeq"], seqs[1])
	}
	if got, _, more, n := e.feed(e.key, "since=0&limit=1"); !slices.Equal(got, []string{a2}) || !more || n != seqs[0] {
		t.Errorf("limit=1: got %v hasMore %v next %d", got, more, n)
	}
	if ids, _, _, n := e.feed(e.key, fmt.Sprint("since=", next)); len(ids) != 0 || n != next {
		t.Errorf("since=next: got %v next %d, want nothing and next %d again", ids, n, next)
	}
	if ids, _, _, _ := e.feed(e.keyB, ""); !slices.Equal(ids, []string{b1}) {
		t.Errorf("the other account's feed: got %v, want only its own %s", ids, b1)
	}
	// since is bounded, so that no sum overflows (issue 16, item 8)
	if ids, _, _, n := e.feed(e.key, "since=9007199254740991"); len(ids) != 0 || n != 1<<53-1 {
		t.Errorf("since=2^53-1: got %v next %d, want nothing and next 2^53-1", ids, n)
	}
	e.do("GET", "/product-payment/changes?since=-1&limit=0&wait=61", e.key, "").wantFields(t, "since", "limit", "wait")
	e.do("GET", "/product-payment/changes?since=9223372036854775807", e.key, "").wantFields(t, "since")
}

// A client's next from before a restore misses no later change: after a backup is restored the way the README says,
// every new change sorts after all those handed out before (issue 16, item 2). The restored server keeps the backup's
// buttons and keys.
func TestChangeFeedSurvivesARestoredBackup(t *testing.T) {
	e := newTestServer(t)
	kept := e.create(e.key, createBody(nil))
	backup := filepath.Join(t.TempDir(), "backup.db")
	if _, err := runCLI(t, nil, "backup", "-db", e.dbPath, backup); err != nil {
		t.Fatalf("backup: %v", err)
	}
	for range 5 { // changes the client saw, which the restore forgets
		e.create(e.key, createBody(nil))
	}
	_, _, _, next := e.feed(e.key, "")
	want := e.mustStored("acme", kept)
	// The README's restore: stop the server, put the copy in place of the database, remove the -wal and -shm, start.
	err := e.store.close(true)
	os.Remove(e.dbPath + "-wal")
	os.Remove(e.dbPath + "-shm")
	if err = errors.Join(err, os.Rename(backup, e.dbPath)); err == nil {
		e.store, err = openStore(e.dbPath)
	}
	if err != nil {
		t.Fatalf("stop, restore and start: %v", err)
	}
	e.url = serveStore(t, e.store, config{providerName: "the service"})
	if got := e.mustStored("acme", kept); !reflect.DeepEqual(got, want) || e.countButtons() != 1 {
		t.Fatalf("after the restore got %+v and %d buttons, want only %+v", got, e.countButtons(), want)
	}
	e.do("POST", "/product-payment/update/"+kept, e.key, `{"amount":"1.00"}`).want(t, 200, "")
	made := e.create(e.key, createBody(nil))
	if ids, _, _, _ := e.feed(e.key, fmt.Sprint("since=", next)); !slices.Equal(ids, []string{kept, made}) {
		t.Errorf("changes?since=%d after the restore: got %v, want the two changes made since, %s and %s",
			next, ids, kept, made)
	}
}

// A read-only key reads everything and is refused every write, before the body or the id is looked at.
func TestReadOnlyKey(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	out, err := runCLI(t, nil, "keys", "create", "-account", "acme", "-read-only", "-db", e.dbPath)
	reader := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(reader, "pbk_") {
		t.Fatalf("keys create -read-only: got %q (%v), want the key", reader, err)
	}
	list, _ := runCLI(t, nil, "keys", "list", "-db", e.dbPath)
	if strings.Count(list, "\tread-only\t") != 1 || strings.Count(list, "\tread-write\t") != 2 {
		t.Errorf("keys list: got %q, want one read-only key and two read-write", list)
	}
	for _, path := range []string{"get/" + id, "list", "history/" + id, "changes"} {
		e.do("GET", "/product-payment/"+path, reader, "").want(t, 200, "")
	}
	// Refused before the body is read or the id looked up: a broken body or an unknown id is a 403 too.
	for _, op := range []struct{ method, path, body string }{
		{"POST", "create", createBody(nil)},
		{"POST", "create", strings.Repeat("x", 70_000)},
		{"POST", "update/" + id, `{"amount":"1.00"}`},
		{"DELETE", "delete/" + id, ""},
		{"POST", "restore/btn_01JD0000000000000000000000", ""},
	} {
		e.do(op.method, "/product-payment/"+op.path, reader, op.body, "Idempotency-Key", "ro-"+op.path).
			want(t, 403, "forbidden")
	}
	if b, n := e.mustStored("acme", id), e.count(`SELECT count(*) FROM idempotency_keys`); b.Version != 1 ||
		e.countButtons() != 1 || n != 0 {
		t.Errorf("got version %d, %d buttons and %d answers kept after the read-only key's writes, want 1, 1, 0",
			b.Version, e.countButtons(), n)
	}
}

var metricLine = regexp.MustCompile(`^(?:# (?:HELP|TYPE) .+|([a-z_]+(?:\{.*\})?) ([0-9.e+-]+))$`)

// /metrics counts requests by route pattern and code, and database commits, without naming an account, key or id.
func TestMetrics(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	e.getView(e.key, id)
	e.do("GET", "/nope", "", "")
	r, err := callAPI(http.DefaultClient, "GET", e.url+"/metrics", "", "") // err: the text is not the envelope
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: got %d %s (%v), want 200 text/plain", r.status, r.header.Get("Content-Type"), err)
	}
	series := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSuffix(string(r.raw), "\n"), "\n") {
		match := metricLine.FindStringSubmatch(line)
		if match == nil {
			t.Fatalf("not a metric line: %q", line)
		}
		series[match[1]], _ = strconv.ParseFloat(match[2], 64)
		if _, route, _ := strings.Cut(line, `route="`); route != "" && !strings.Contains(route, " /") &&
			!strings.HasPrefix(route, `unmatched"`) {
			t.Errorf("a route label is not a pattern: %q", line)
		}
		for _, secret := range []string{"acme", e.keyID, id, e.key} {
			if strings.Contains(line, secret) {
				t.Errorf("a label holds an account, key or id: %q", line)
			}
		}
	}
	for name, want := range map[string]float64{
		`paybuttons_http_requests_total{route="POST /product-payment/create",code="200"}`:                  1,
		`paybuttons_http_requests_total{route="GET /product-payment/get/{id}",code="200"}`:                 1,
		`paybuttons_http_requests_total{route="unmatched",code="404"}`:                                     1,
		`paybuttons_http_request_duration_seconds_count{route="GET /product-payment/get/{id}"}`:            1,
		`paybuttons_http_request_duration_seconds_bucket{route="GET /product-payment/get/{id}",le="+Inf"}`: 1,
	} {
		if series[name] != want {
			t.Errorf("%s: got %v, want %v", name, series[name], want)
		}
	}
	commits := series["paybuttons_db_commits_total"]
	if writes := series["paybuttons_db_writes_total"]; commits < 3 || writes < commits ||
		series["paybuttons_db_size_bytes"] <= 0 {
		t.Errorf("got db series %v, want commits (the keys and the create), as many writes or more, and a size", series)
	}
}
