package main

// Contract section 9: metadata, read-only keys, the change feed, paged
// history, one server per database file, metrics.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pageOf decodes a page of buttons ({items, hasMore, next}) from r.
func pageOf[C any](t testing.TB, r response) (items []buttonView, hasMore bool, next C) {
	t.Helper()
	var p page[buttonView, C]
	if err := json.Unmarshal(r.env.Data, &p); err != nil {
		t.Fatalf("%s: data is not a page: %v\n%s", r.request, err, r.raw)
	}
	return p.Items, p.HasMore, p.Next
}

func TestMetadata(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(map[string]any{"metadata": map[string]any{"orderRef": "A-17", "team": "web", "gone": ""}}))
	if got := e.getView(e.key, id)["metadata"]; !reflectEqualJSON(got, `{"orderRef":"A-17","team":"web"}`) {
		t.Errorf("create: got metadata %v, want orderRef and team (\"\" leaves a key out)", got)
	}
	plain := e.create(e.key, createBody(nil))
	if got := e.getView(e.key, plain)["metadata"]; !reflectEqualJSON(got, `{}`) {
		t.Errorf("got metadata %v for a button without, want {}", got)
	}
	// Update merges: a string sets, null or "" removes, keys not named stay.
	e.do("POST", "/product-payment/update/"+id, e.key, `{"metadata":{"team":null,"orderRef":"A-18","campaign":"x"}}`).want(t, 200, "")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"metadata":{"campaign":""},"productName":"Renamed"}`).want(t, 200, "")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"metadata":null,"productName":"Again"}`).want(t, 200, "")
	if b := e.mustStored("acme", id); !reflectEqualJSON(map[string]string(b.Metadata), `{"orderRef":"A-18"}`) || b.Version != 4 {
		t.Errorf("after the merges got %v version %d, want only orderRef A-18, version 4", b.Metadata, b.Version)
	}
	many := map[string]any{}
	for i := range 50 {
		many[fmt.Sprint("k", i)] = "v"
	}
	e.do("POST", "/product-payment/update/"+id, e.key, mustJSON(map[string]any{"metadata": many})).
		wantFields(t, "metadata") // 51 with orderRef
	e.do("POST", "/product-payment/create", e.key, createBody(map[string]any{"metadata": map[string]any{"bad key": "v"}})).
		wantFields(t, "metadata")
	e.do("POST", "/product-payment/create", e.key, createBody(map[string]any{"metadata": map[string]any{"k": 5}})).
		wantFields(t, "metadata.k")
	e.do("POST", "/product-payment/create", e.key, createBody(map[string]any{"metadata": []string{"k"}})).
		wantFields(t, "metadata")

	// History shows each metadata key that changed as an entry of its own.
	h := e.do("GET", "/product-payment/history/"+id+"?after=1&limit=1", e.key, "")
	h.want(t, 200, "")
	var data page[historyItem, *int64]
	json.Unmarshal(h.env.Data, &data)
	if len(data.Items) != 1 || !reflectEqualJSON(data.Items[0].Changes, `{"metadata.team":{"from":"web","to":null},
		"metadata.orderRef":{"from":"A-17","to":"A-18"},"metadata.campaign":{"from":null,"to":"x"}}`) {
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

// reflectEqualJSON reports whether v, encoded, is the JSON want.
func reflectEqualJSON(v any, want string) bool {
	var a, b any
	json.Unmarshal([]byte(mustJSON(v)), &a)
	json.Unmarshal([]byte(want), &b)
	return mustJSON(a) == mustJSON(b)
}

func mustJSON(v any) string {
	text, _ := json.Marshal(v)
	return string(text)
}

func TestReadOnlyKey(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	var stdout, stderr syncBuffer
	err := run(context.Background(), []string{"paybuttons", "keys", "create", "-account", "acme", "-read-only", "-db", e.dbPath},
		func(string) string { return "" }, &stdout, &stderr)
	reader := strings.TrimSpace(stdout.String())
	if err != nil || !strings.HasPrefix(reader, "pbk_") || !strings.Contains(stderr.String(), "key_") {
		t.Fatalf("keys create -read-only: got %q on stdout, %q on stderr (%v), want the key and its id", reader, stderr.String(), err)
	}
	list, _ := runCLI(t, nil, "keys", "list", "-db", e.dbPath)
	if strings.Count(list, "\tread-only\t") != 1 || strings.Count(list, "\tread-write\t") != 2 {
		t.Errorf("keys list: got %q, want one read-only key and two read-write", list)
	}
	for _, path := range []string{"get/" + id, "list", "history/" + id, "changes"} {
		e.do("GET", "/product-payment/"+path, reader, "").want(t, 200, "")
	}
	before := e.mustStored("acme", id)
	// Refused before the body is read and before any lookup: a broken body or
	// an unknown id changes nothing to the answer.
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
	items, hasMore, next := pageOf[int64](e.t, r)
	for _, it := range items {
		ids, seqs = append(ids, it.ID), append(seqs, it.ChangeSeq)
	}
	return ids, seqs, hasMore, next
}

func TestChangeFeed(t *testing.T) {
	e := newTestServer(t)
	a1 := e.create(e.key, createBody(nil))
	b1 := e.create(e.keyB, createBody(nil)) // interleaved with another account's changes
	a2 := e.create(e.key, createBody(nil))
	e.do("POST", "/product-payment/update/"+a1, e.key, `{"amount":"1.00"}`).want(t, 200, "")
	e.do("POST", "/product-payment/update/"+b1, e.keyB, `{"amount":"1.00"}`).want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+a1, e.key, "").want(t, 200, "")
	ids, seqs, hasMore, next := e.feed(e.key, "")
	if !slices.Equal(ids, []string{a2, a1}) || hasMore || next != seqs[1] || !slices.IsSorted(seqs) {
		t.Fatalf("since=0: got %v %v hasMore %v next %d, want a2 then a1 (changed last, deleted, once)", ids, seqs, hasMore, next)
	}
	if v := e.getView(e.key, a1); v["state"] != "deleted" || int64(v["changeSeq"].(float64)) != seqs[1] {
		t.Errorf("get shows %v %v, want the deleted button at changeSeq %d", v["state"], v["changeSeq"], seqs[1])
	}
	if ids, _, hasMore, next2 := e.feed(e.key, "since=0&limit=1"); !slices.Equal(ids, []string{a2}) || !hasMore || next2 != seqs[0] {
		t.Errorf("limit=1: got %v hasMore %v next %d", ids, hasMore, next2)
	}
	if ids, _, _, n := e.feed(e.key, fmt.Sprint("since=", next)); len(ids) != 0 || n != next {
		t.Errorf("since=next: got %v next %d, want nothing and next %d again", ids, n, next)
	}
	if ids, _, _, _ := e.feed(e.keyB, ""); !slices.Equal(ids, []string{b1}) {
		t.Errorf("the other account's feed: got %v, want only its own %s", ids, b1)
	}
	e.do("GET", "/product-payment/changes?since=-1&limit=0&wait=61", e.key, "").wantFields(t, "since", "limit", "wait")

	// The sequence survives a restart and goes on from where it was.
	if err := e.store.close(); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	e.store, e.url = st, serveStore(t, st, config{providerName: "the service"})
	a3 := e.create(e.key, createBody(nil))
	if ids, seqs, _, _ := e.feed(e.key, fmt.Sprint("since=", next)); !slices.Equal(ids, []string{a3}) || seqs[0] <= next {
		t.Errorf("after a restart: got %v %v, want only %s, past %d", ids, seqs, a3, next)
	}
}

func TestChangeFeedWaits(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	_, _, _, next := e.feed(e.key, "")
	type answer struct {
		ids   []string
		after time.Duration
	}
	wait := func(key, query string) chan answer {
		done := make(chan answer, 1)
		go func() {
			start := time.Now()
			ids, _, _, _ := e.feed(key, query)
			done <- answer{ids, time.Since(start)}
		}()
		return done
	}
	woken := wait(e.key, fmt.Sprintf("since=%d&wait=30", next))
	notWoken := wait(e.key, fmt.Sprintf("since=%d&wait=1", next))
	time.Sleep(200 * time.Millisecond) // both are waiting by now; the checks do not depend on it
	e.create(e.keyB, createBody(nil))  // another account's change wakes neither for good
	select {
	case a := <-notWoken:
		if len(a.ids) != 0 || a.after < time.Second {
			t.Errorf("wait=1 with no change of its account: got %v after %v, want nothing after a second", a.ids, a.after)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait=1 did not answer within 10 s")
	}
	id := e.create(e.key, createBody(nil))
	start := time.Now()
	select {
	case a := <-woken:
		if !slices.Equal(a.ids, []string{id}) || time.Since(start) > time.Second {
			t.Errorf("wait=30: got %v %v after the create, want %s within a second", a.ids, time.Since(start), id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting request was not woken by its account's change")
	}
}

func TestShutdownAnswersWaitingRequests(t *testing.T) {
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "wait.db"))
	done := make(chan response, 1)
	go func() {
		r, _ := callAPI(http.DefaultClient, "GET", srv.url+"/product-payment/changes?since=99&wait=60", srv.mintedKey(), "")
		done <- r
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if ids, _, next := pageOf[int64](t, r); r.status != 200 || len(ids) != 0 || next != 99 || time.Since(start) > 3*time.Second {
			t.Errorf("got %d %s after %v, want 200 with no items, next 99, at once", r.status, r.raw, time.Since(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was not answered at shutdown")
	}
}

func TestHistoryPages(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(map[string]any{"amount": "1.00"}))
	for i := 2; i <= 8; i++ { // versions 2 to 8 set the amount to i; the last page holds two
		e.do("POST", "/product-payment/update/"+id, e.key, fmt.Sprintf(`{"amount":"%d.00"}`, i)).want(t, 200, "")
	}
	var versions []int64
	after := "0"
	for page := 0; after != ""; page++ {
		r := e.do("GET", "/product-payment/history/"+id+"?limit=3&after="+after, e.key, "")
		r.want(t, 200, "")
		var data struct {
			Items []struct {
				Version int64
				Changes map[string]change
			}
			HasMore bool
			Next    *int64
		}
		json.Unmarshal(r.env.Data, &data)
		for _, it := range data.Items {
			versions = append(versions, it.Version)
			if c := it.Changes["amount"]; it.Version > 1 && (c.From != fmt.Sprintf("%d.00", it.Version-1) || c.To != fmt.Sprintf("%d.00", it.Version)) {
				t.Errorf("version %d: got amount change %v, want %d.00 to %d.00 across pages", it.Version, c, it.Version-1, it.Version)
			}
		}
		if after = ""; data.HasMore && data.Next != nil {
			after = strconv.FormatInt(*data.Next, 10)
		} else if data.Next != nil || page != 2 {
			t.Errorf("page %d: got hasMore %v next %v, want the third page to be the last", page, data.HasMore, data.Next)
		}
	}
	if !slices.Equal(versions, []int64{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("got versions %v, want 1 to 8 once each", versions)
	}
	e.do("GET", "/product-payment/history/"+id+"?limit=101&after=x", e.key, "").wantFields(t, "limit", "after")
}

// A second server on the same file refuses to start while the first keeps
// serving; keys and backup still work beside it; after a kill -9 the next
// server starts without anything to clean up.
func TestOneServerPerDatabaseFile(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "one.db")
	key := mintKeyCLI(t, dbPath, "acme")
	first := startChild(t, dbPath)
	second := runChild(t, "serve", "-db", dbPath, "-addr", "127.0.0.1:0")
	if second.code != 1 || second.took > 5*time.Second || strings.Count(strings.TrimSpace(second.stderr), "\n") != 0 ||
		!strings.Contains(second.stderr, "in use by another server") {
		t.Errorf("second serve: got exit %d after %v with %q, want 1 within 5 s and one line", second.code, second.took, second.stderr)
	}
	if r, err := callAPI(newTestClient(), "POST", first.url+"/product-payment/create", key, createBody(nil)); err != nil || r.status != 200 {
		t.Errorf("the first server after the refusal: got %v (%v), want it serving", r.status, err)
	}
	mintKeyCLI(t, dbPath, "beside")
	if _, err := runCLI(t, nil, "backup", "-db", dbPath, filepath.Join(t.TempDir(), "copy.db")); err != nil {
		t.Errorf("backup beside a running server: %v", err)
	}
	first.kill(t)
	startChild(t, dbPath) // fails the test unless it listens
}

// ran is what a command run as a child process did.
type ran struct {
	code   int
	stderr string
	took   time.Duration
}

// runChild runs the program as a child process with args and waits for it.
func runChild(t *testing.T, args ...string) ran {
	t.Helper()
	cmd := childCommand(args...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	cmd.Run()
	return ran{cmd.ProcessState.ExitCode(), stderr.String(), time.Since(start)}
}

var (
	metricLine = regexp.MustCompile(`^([a-z_]+)(\{.*\})? (\S+)$`)
	labelPair  = regexp.MustCompile(`([a-z]+)="([^"]*)"`)
)

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
	lines := bufio.NewScanner(strings.NewReader(string(body)))
	for lines.Scan() {
		line := lines.Text()
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
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			if l[1] == "route" && !strings.Contains(l[2], " /") && l[2] != "unmatched" {
				t.Errorf("route label %q is not a pattern: %q", l[2], line)
			}
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
	if series["paybuttons_db_commits_total"] < 3 || series[`paybuttons_db_batch_size_bucket{le="+Inf"}`] != series["paybuttons_db_commits_total"] ||
		series["paybuttons_db_size_bytes"] <= 0 {
		t.Errorf("got db series %v, want commits (the keys and the create), batch sizes of each, and a size", series)
	}
	off := newTestServer(t, func(c *config) { c.metrics = false })
	off.do("GET", "/metrics", "", "").want(t, 404, "not_found")
}
