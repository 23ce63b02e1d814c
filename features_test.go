package main

// Contract section 9: metadata, read-only keys, the change feed, paged
// history, one server per database file, metrics.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Metadata is set on create, merged key by key on update, in history a key an entry, and filters lists.
func TestMetadata(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(map[string]any{
		"metadata": map[string]any{"orderRef": "A-17", "team": "web", "gone": ""}}))
	// Update merges: a string sets, null or "" removes, keys not named stay; "gone" was never stored.
	for _, body := range []string{`{"metadata":{"team":null,"orderRef":"A-18","campaign":"x"}}`,
		`{"metadata":{"campaign":""},"productName":"Renamed"}`, `{"metadata":null,"productName":"Again"}`} {
		e.do("POST", "/product-payment/update/"+id, e.key, body).want(t, 200, "")
	}
	if b := e.mustStored("acme", id); !maps.Equal(b.Metadata, metadata{"orderRef": "A-18"}) || b.Version != 4 {
		t.Errorf("after the merges got %v version %d, want only orderRef A-18, version 4", b.Metadata, b.Version)
	}
	many := map[string]any{}
	for i := range 50 {
		many[fmt.Sprint("k", i)] = "v"
	}
	body, _ := json.Marshal(map[string]any{"metadata": many})
	e.do("POST", "/product-payment/update/"+id, e.key, string(body)).wantFields(t, "metadata") // 51 with orderRef
	// History shows each metadata key that changed as an entry of its own.
	h := e.do("GET", "/product-payment/history/"+id+"?after=1&limit=1", e.key, "")
	h.want(t, 200, "")
	want := map[string]change{"metadata.team": {"web", nil}, "metadata.orderRef": {"A-17", "A-18"},
		"metadata.campaign": {nil, "x"}}
	if got := dataOf[page[historyItem, *int64]](t, h).Items; len(got) != 1 || !reflect.DeepEqual(got[0].Changes, want) {
		t.Errorf("history of the merge: got %s, want one entry per changed key", h.env.Data)
	}
	// A list filter keeps buttons whose metadata has exactly that value; several must all match.
	both := e.create(e.key, createBody(map[string]any{"metadata": map[string]any{"orderRef": "A-18", "team": "web"}}))
	e.create(e.keyB, createBody(map[string]any{"metadata": map[string]any{"orderRef": "A-18"}}))
	for query, want := range map[string][]string{
		"metadata%5BorderRef%5D=A-18":                          {both, id},
		"metadata%5BorderRef%5D=A-18&metadata%5Bteam%5D=web":   {both},
		"metadata%5BorderRef%5D=A-18&metadata%5Bteam%5D=other": nil,
	} {
		if got, _, _ := e.listPageOf(e.key, query); !slices.Equal(got, want) {
			t.Errorf("list?%s: got %v, want %v", query, got, want)
		}
	}
	e.do("GET", "/product-payment/list?metadata%5Bbad+key%5D=x", e.key, "").wantFields(t, "metadata[bad key]")
}

// A read-only key reads everything and is refused every write, before the body or the id is looked at.
func TestReadOnlyKey(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	var stdout, stderr syncBuffer
	err := run(context.Background(), []string{"paybuttons", "keys", "create", "-account", "acme", "-read-only",
		"-db", e.dbPath}, func(string) string { return "" }, &stdout, &stderr)
	reader := strings.TrimSpace(stdout.String())
	if err != nil || !strings.HasPrefix(reader, "pbk_") || !strings.Contains(stderr.String(), "key_") {
		t.Fatalf("keys create -read-only: got %q, %q (%v), want the key, then its id", reader, stderr.String(), err)
	}
	list, _ := runCLI(t, nil, "keys", "list", "-db", e.dbPath)
	if strings.Count(list, "\tread-only\t") != 1 || strings.Count(list, "\tread-write\t") != 2 {
		t.Errorf("keys list: got %q, want one read-only key and two read-write", list)
	}
	for _, path := range []string{"get/" + id, "list", "history/" + id, "changes"} {
		e.do("GET", "/product-payment/"+path, reader, "").want(t, 200, "")
	}
	before := e.mustStored("acme", id)
	// Refused before the body is read or the id looked up: a broken body or an unknown id is a 403 too.
	for _, op := range []struct{ method, path, body string }{
		{"POST", "/product-payment/create", createBody(nil)},
		{"POST", "/product-payment/create", strings.Repeat("x", 70_000)},
		{"POST", "/product-payment/update/" + id, `{"amount":"1.00"}`},
		{"DELETE", "/product-payment/delete/" + id, ""},
		{"POST", "/product-payment/restore/btn_01JD0000000000000000000000", ""},
	} {
		e.do(op.method, op.path, reader, op.body, "Idempotency-Key", "ro-"+op.method+op.path).want(t, 403, "forbidden")
	}
	if after := e.mustStored("acme", id); after.Version != before.Version || e.countButtons() != 1 {
		t.Errorf("a read-only key changed something: version %d, %d buttons", after.Version, e.countButtons())
	}
	if n := e.storedAnswers("acme"); n != 0 {
		t.Errorf("got %d answers kept for the read-only key's Idempotency-Keys, want none", n)
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

// The change feed lists an account's buttons once each, in the order they last changed, in pages;
// a restart keeps buttons, keys and the sequence.
func TestChangeFeed(t *testing.T) {
	e := newTestServer(t)
	a1 := e.create(e.key, createBody(map[string]any{"metadata": map[string]any{"team": "web"}}))
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
	e.do("GET", "/product-payment/changes?since=-1&limit=0&wait=61", e.key, "").wantFields(t, "since", "limit", "wait")
	// A restart keeps every button as it was, every key, and the sequence where it was.
	want := e.mustStored("acme", a1)
	if err := e.store.close(false); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	e.store, e.url = st, serveStore(t, st, config{providerName: "the service"})
	if got := e.mustStored("acme", a1); !reflect.DeepEqual(got, want) {
		t.Errorf("after a restart got %+v, want %+v", got, want)
	}
	a3 := e.create(e.key, createBody(nil))
	if ids, seqs, _, _ := e.feed(e.key, fmt.Sprint("since=", next)); !slices.Equal(ids, []string{a3}) || seqs[0] <= next {
		t.Errorf("after a restart: got %v %v, want only %s, past %d", ids, seqs, a3, next)
	}
}

// History pages hold each version once, in order, with the changes from the version before.
func TestHistoryPages(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(map[string]any{"amount": "1.00"}))
	for i := 2; i <= 8; i++ { // versions 2 to 8 set the amount to i; the last page holds two
		e.do("POST", "/product-payment/update/"+id, e.key, fmt.Sprintf(`{"amount":"%d.00"}`, i)).want(t, 200, "")
	}
	var versions []int64
	after := "0"
	for n := 0; after != ""; n++ {
		r := e.do("GET", "/product-payment/history/"+id+"?limit=3&after="+after, e.key, "")
		r.want(t, 200, "")
		data := dataOf[page[historyItem, *int64]](t, r)
		for _, it := range data.Items {
			versions = append(versions, it.Version)
			want := change{fmt.Sprintf("%d.00", it.Version-1), fmt.Sprintf("%d.00", it.Version)}
			if c := it.Changes["amount"]; it.Version > 1 && c != want {
				t.Errorf("version %d: got %v, want amount %d.00 to %d.00", it.Version, c, it.Version-1, it.Version)
			}
		}
		if after = ""; data.HasMore && data.Next != nil {
			after = strconv.FormatInt(*data.Next, 10)
		} else if data.Next != nil || n != 2 {
			t.Errorf("page %d: got hasMore %v next %v, want the third page to be the last", n, data.HasMore, data.Next)
		}
	}
	if !slices.Equal(versions, []int64{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("got versions %v, want 1 to 8 once each", versions)
	}
	e.do("GET", "/product-payment/history/"+id+"?limit=101&after=x", e.key, "").wantFields(t, "limit", "after")
}

var (
	metricLine = regexp.MustCompile(`^([a-z_]+)(\{.*\})? (\S+)$`)
	routeLabel = regexp.MustCompile(`route="([^"]*)"`)
)

// /metrics counts requests by route pattern and code, and database commits, without naming an account, key or id.
func TestMetrics(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	e.getView(e.key, id)
	e.do("GET", "/nope", "", "")
	resp, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: got %d %s, want 200 text/plain", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	series := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		m := metricLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a metric line: %q", line)
		}
		value, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("not a value: %q", line)
		}
		if l := routeLabel.FindStringSubmatch(m[2]); l != nil && !strings.Contains(l[1], " /") && l[1] != "unmatched" {
			t.Errorf("route label %q is not a pattern: %q", l[1], line)
		}
		for _, secret := range []string{"acme", e.keyID, id, e.key} {
			if strings.Contains(line, secret) {
				t.Errorf("a label holds an account, key or id: %q", line)
			}
		}
		series[m[1]+m[2]] = value
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
