package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A button reads back through get and list exactly as it was made: an object, every field in its
// form, text as it was sent (no HTML escaping), and the version as ETag. HEAD has no body. Every
// answer has its request id: the caller's when it is sane. A read writes nothing. The access log
// names the request, the key and the button.
func TestReads(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	id := e.create(e.key, `{"productName":" Tom & Jerry <3 ","description":"a\tb","amount":19.9,
		"currency":"usd","paymentMethod":"StripeConnect","ApplicationFeePercentage":"2.5",
		"paymentType":"subscription","billingInterval":"month","isLive":true,
		"metadata":{"orderRef":"<A-17>"}}`)
	get, at := "/product-payment/get/"+id, e.stored("acme", id).CreatedAt
	want := `{"id":"` + id + `","productName":"Tom & Jerry <3","description":"a\tb",` +
		`"amount":"19.90","currency":"USD","billingInterval":"month",` +
		`"paymentMethod":"StripeConnect","paymentType":"subscription","isLive":true,` +
		`"ApplicationFeePercentage":"2.50","metadata":{"orderRef":"<A-17>"},"state":"active",` +
		`"version":1,"createdAt":"` + at + `","updatedAt":"` + at + `","deletedAt":null}`
	r := e.do("GET", get, e.key, "")
	expect(t, string(r.env.Data) == want && r.header.Get("ETag") == `"1"`,
		"get: got %s, ETag %s\nwant %s", r.raw, r.header.Get("ETag"), want)
	readOnly, _, _ := e.store.createKey(context.Background(), "acme", true)
	list := e.do("GET", "/product-payment/list", readOnly, "") // any key lists
	wantPage := `"data":{"hasMore":false,"items":[` + want + `],"next":null}`
	expect(t, bytes.Contains(list.raw, []byte(wantPage)) && list.header.Get("ETag") == "",
		"list: got %s %v\nwant %s, no ETag", list.raw, list.header, wantPage)
	r = e.do("HEAD", get, e.key, "")
	expect(t, r.status == 200 && r.header.Get("ETag") == `"1"` && len(r.raw) == 0,
		"HEAD: got %d %v %q, want 200, ETag \"1\", no body", r.status, r.header, r.raw)
	t.Run("X-Request-Id", func(t *testing.T) {
		for sent, ok := range map[string]bool{"t-7:x_y.z": true, "a=b": false, "x": true,
			strings.Repeat("x", 128): true, strings.Repeat("x", 129): false} {
			got := e.do("GET", "/healthz", "", "", "X-Request-Id", sent).header.Get("X-Request-Id")
			expect(t, (got == sent) == ok && strings.HasPrefix(got, "req_") != ok, "%q: got %q",
				sent, got)
		}
	})
	t.Run("a read writes nothing", func(t *testing.T) {
		wal, _ := os.ReadFile(e.db + "-wal")
		for range 120 {
			e.do("GET", get, e.key, "").want(t, 200, "")
		}
		walAfter, _ := os.ReadFile(e.db + "-wal")
		expect(t, len(wal) > 0 && bytes.Equal(wal, walAfter), "the gets changed the WAL")
	})
	t.Run("the access log", func(t *testing.T) {
		e.do("GET", get, e.key, "", "X-Request-Id", "t-8").want(t, 200, "")
		line := `status=200 duration=\S+ requestId=t-8 keyId=` + e.keyID + ` buttonId=` + id + `\n`
		log := e.logged()
		expect(t, regexp.MustCompile(line).MatchString(log), "got log\n%s\nwant %s", log, line)
	})
}

// A refusal has its status and code and changes nothing; a write's ETag is its button's version.
func TestRefusals(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	id, otherID := e.create(e.key, createBody(nil)), e.create(e.otherKey, createBody(nil))
	deleted := e.create(e.key, createBody(nil))
	e.do("DELETE", "/product-payment/delete/"+deleted, e.key, "").want(t, 200, "")
	readOnly, _, _ := e.store.createKey(context.Background(), "acme", true)
	before, body, amount := e.stored("acme", id), createBody(nil), `{"amount":"1"}`
	get, update := "GET /product-payment/get/", "POST /product-payment/update/"
	del, restore := "DELETE /product-payment/delete/", "POST /product-payment/restore/"
	create, ct := "POST /product-payment/create", "Content-Type: "
	codes := map[int]string{400: "invalid_request", 401: "unauthorized", 403: "forbidden",
		404: "not_found", 405: "method_not_allowed", 409: "wrong_state", 412: "precondition_failed",
		413: "payload_too_large", 415: "unsupported_media_type"}
	for _, c := range []struct {
		name, request, key, body, header string // request: "METHOD path"; header: "Name: value"
		status                           int
	}{
		{"no key", get + id, "", "", "", 401},
		{"an unknown key", get + id, "pbk_nope", "", "", 401},
		{"the key before the body", create, "", "{", "", 401},
		{"a read-only key reads", get + id, readOnly, "", "", 200},
		{"a read-only create, before the body", create, readOnly, "{", "", 403},
		{"a read-only update", update + id, readOnly, amount, "", 403},
		{"a read-only delete", del + id, readOnly, "", "", 403},
		{"a read-only restore", restore + deleted, readOnly, "", "", 403},
		{"no such button", get + "btn_01JD0000000000000000000000", e.key, "", "", 404},
		{"not an id", get + "42", e.key, "", "", 404},
		{"another account's get", get + otherID, e.key, "", "", 404},
		{"another account's delete", del + otherID, e.key, "", "", 404},
		{"another account's update", update + id, e.otherKey, amount, "", 404},
		{"restore of an active button", restore + id, e.key, "", "", 409},
		{"delete of a deleted button", del + deleted, e.key, "", "", 409},
		{"update of a deleted button", update + deleted, e.key, amount, "", 409},
		{"a fee on Stripe", update + id, e.key, `{"ApplicationFeePercentage":"2"}`, "", 400},
		{"an unknown path", "GET /nope", e.key, "", "", 404},
		{"dot segments, never redirected", get + "../create", e.key, "", "", 404},
		{"encoded dot segments", get + "%2e%2e/x", e.key, "", "", 404},
		{"a trailing slash", create + "/", e.key, body, "", 404},
		{"another method", "GET /product-payment/create", e.key, "", "", 405},
		{"OPTIONS", "OPTIONS /product-payment/create", "", "", "", 405},
		{"text/plain", create, e.key, body, ct + "text/plain", 415},
		{"a body over 64 KiB", create, e.key, strings.Repeat(" ", 64<<10) + body, "", 413},
		{"a body of 64 KiB", create, e.key, strings.Repeat(" ", 64<<10-len(body)) + body, "", 200},
		{"JSON with a charset", create, e.key, body, ct + "application/json; charset=utf-8", 200},
		{"a +json media type", create, e.key, body, ct + "application/vnd.x+json", 200},
		{"Idempotency-Key on a read", get + id, e.key, "", "Idempotency-Key: k", 200},
		{"Idempotency-Key on a create", create, e.key, body, "Idempotency-Key: k", 400},
		{"an empty Idempotency-Key", create, e.key, body, "Idempotency-Key: ", 400},
		{"Idempotency-Key on a delete", del + id, e.key, "", "Idempotency-Key: k", 400},
		{"If-Match with a leading zero", del + id, e.key, "", `If-Match: "01"`, 400},
		{"If-Match 0", del + id, e.key, "", `If-Match: "0"`, 400},
		{"If-Match unquoted", del + id, e.key, "", `If-Match: 1`, 400},
		{"If-Match with one quote", del + id, e.key, "", `If-Match: 1"`, 400},
		{"If-Match of another version", del + id, e.key, "", `If-Match: "2"`, 412},
		{"If-Match *", restore + deleted, e.key, "", `If-Match: *`, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			buttons := e.buttons()
			method, path, _ := strings.Cut(c.request, " ")
			r := e.do(method, path, c.key, c.body, strings.Split(c.header, ": ")...)
			r.want(t, c.status, codes[c.status])
			created, h := c.request == create && c.status == 200, r.header
			expect(t, created == (e.buttons() == buttons+1) && h.Get("Cache-Control") ==
				"no-store" && h.Get("X-Content-Type-Options") == "nosniff" &&
				(h.Get("ETag") != "") == (c.status == 200), "got %d buttons (had %d), headers %v",
				e.buttons(), buttons, h)
			if strings.HasPrefix(c.header, "Idempotency-Key") && c.status == 400 {
				r.wantFields(t, "Idempotency-Key")
			}
		})
	}
	after, restored := e.stored("acme", id), e.stored("acme", deleted)
	expect(t, reflect.DeepEqual(after, before) && restored.State == "active" &&
		restored.DeletedAt == nil, "got %s and %s", jsonOf(after), jsonOf(restored))
	t.Run("a 400 names every failing field in full", func(t *testing.T) {
		many := m{"applicationFeePercentage": "1", "paymentType": "One_time"}
		for i := range 30 {
			many[fmt.Sprintf("unknown%02d_%s", i, strings.Repeat("é", 50))] = i
		}
		r := e.do("POST", "/product-payment/create", e.key, createBody(many))
		r.wantFields(t, slices.Collect(maps.Keys(many))...)
		want := "32 fields are invalid: " + strings.Join(slices.Sorted(maps.Keys(many)), ", ")
		expect(t, r.env.Message == want && r.env.Errors["applicationFeePercentage"] ==
			`unknown name; did you mean "ApplicationFeePercentage"?` &&
			r.env.Errors["paymentType"] == `must be exactly "one_time"`, "got %s", r.raw)
	})
	t.Run("the same body gets the same answer", func(t *testing.T) {
		body := createBody(m{"metadata": m{"a b": "1", "c d": "2", "é": "3", "": "4", "x/y": "5"}})
		first := e.do("POST", "/product-payment/create", e.key, body)
		first.wantFields(t, "metadata")
		for range 20 {
			r := e.do("POST", "/product-payment/create", e.key, body)
			expect(t, bytes.Equal(r.raw, first.raw), "got %s\nthen %s", first.raw, r.raw)
		}
	})
}

// list pages newest first and filters; each query parameter is checked; no page skips or repeats.
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
	e.create(e.otherKey, createBody(nil))
	t.Run("filters", func(t *testing.T) {
		for _, c := range []struct {
			query string
			want  []string
			next  string // the last id when more follow, else ""
		}{
			{"", []string{ids[3], ids[2], ids[1], ids[0]}, ""},
			{"limit=4", []string{ids[3], ids[2], ids[1], ids[0]}, ""},
			{"limit=3", []string{ids[3], ids[2], ids[1]}, ids[1]},
			{"limit=1", []string{ids[3]}, ids[3]},
			{"limit=2&after=" + ids[3], []string{ids[2], ids[1]}, ids[1]},
			{"state=deleted", []string{ids[4]}, ""},
			{"state=all&isLive=true", []string{ids[1], ids[0]}, ""},
			{"paymentMethod=the%20service", []string{ids[3], ids[1]}, ""},
			{"state=all&isLive=false&paymentMethod=Stripe", []string{ids[4], ids[2]}, ""},
		} {
			got, next := e.page(t, c.query)
			expect(t, slices.Equal(got, c.want) && next == c.next,
				"list?%s: got %v, next %q; want %v, %q", c.query, got, next, c.want, c.next)
		}
	})
	t.Run("bad queries", func(t *testing.T) {
		for query, field := range map[string]string{"limit=0": "limit", "limit=101": "limit",
			"limit=%2B5": "limit", "limit=1&limit=2": "limit", "after=btn_x": "after",
			"after=btn_00": "after", "state=gone": "state", "isLive=1": "isLive",
			"paymentMethod=stripe": "paymentMethod", "%zz": "query", "since=0": "since",
			"after=" + strings.Repeat("0", 26): "after", // no btn_
			// It decodes, but is not what encoding gives.
			"after=btn_" + strings.Repeat("0", 25) + "1": "after"} {
			e.do("GET", "/product-payment/list?"+query, e.key, "").wantFields(t, field)
		}
	})
	t.Run("20 by default", func(t *testing.T) {
		for range 20 {
			e.create(e.key, createBody(nil))
		}
		first, next := e.page(t, "")
		expect(t, len(first) == 20 && next == first[19], "got %d, next %q", len(first), next)
	})
	t.Run("no skip or repeat while buttons are made", func(t *testing.T) {
		before := slices.Concat(e.pages(t, "state=all&limit=100")...)
		time.Sleep(time.Millisecond) // the ids made from here on sort after every one before
		var during []string
		for after, more := "", true; more; more = after != "" {
			var page []string
			page, after = e.page(t, "state=all&limit=3&after="+after)
			during = append(during, page...)
			e.create(e.key, createBody(nil)) // between two pages
		}
		expect(t, slices.Equal(during, before), "got %v, want %v", during, before)
	})
}

// A page stops before the button that would take it past 256 KiB, and goes on from there.
func TestListPageSize(t *testing.T) {
	t.Parallel()
	e, metadata := newTestServer(t), m{}
	for i := range 50 {
		metadata[fmt.Sprint("key", i)] = strings.Repeat("é.", 250) // 750 bytes
	}
	var want []string // newest first
	for range 9 {
		want = append([]string{e.create(e.key, createBody(m{"metadata": metadata}))}, want...)
		time.Sleep(time.Millisecond)
	}
	text, _, _ := e.store.get(context.Background(), "acme", want[0])
	perPage := (256 << 10) / len(text) // every button here is as long
	require(t, perPage < len(want), "buttons of %d bytes: %d fit in a page", len(text), perPage)
	pages := e.pages(t, "limit=100")
	expect(t, slices.Equal(slices.Concat(pages...), want), "got %v, want %v", pages, want)
	for i, page := range pages {
		expect(t, len(page) == min(perPage, len(want)-i*perPage), "page %d: %d", i, len(page))
	}
}

// pages lists with query, following next while hasMore, and returns each page's ids.
func (e *testEnv) pages(t *testing.T, query string) (pages [][]string) {
	for after, more := "", true; more; more = after != "" {
		var page []string
		page, after = e.page(t, query+"&after="+after)
		pages = append(pages, page)
	}
	return pages
}

// page lists with query and returns the ids and the next cursor ("" for none).
func (e *testEnv) page(t *testing.T, query string) (ids []string, next string) {
	t.Helper()
	r := e.do("GET", "/product-payment/list?"+query, e.key, "")
	r.want(t, 200, "")
	var page struct {
		Items   []button
		HasMore bool
		Next    string // "" for null
	}
	json.Unmarshal(r.env.Data, &page)
	require(t, page.HasMore == (page.Next != ""), "list?%s: got %s", query, r.raw)
	for _, b := range page.Items {
		ids = append(ids, b.ID)
	}
	return ids, page.Next
}

// Ids begin with the millisecond they were made in, then 80 random bits: none is the last plus 1.
func TestIDs(t *testing.T) {
	first, random, lastLow := uint64(time.Now().UnixMilli()), map[uint16]bool{}, uint64(0)
	for range 5000 {
		id := newButtonID()
		raw, _ := crockford.DecodeString(strings.TrimPrefix(id, "btn_"))
		ms, low := binary.BigEndian.Uint64(raw)>>16, binary.BigEndian.Uint64(raw[8:])
		require(t, validButtonID(id) && ms >= first && ms <= uint64(time.Now().UnixMilli()) &&
			low != lastLow+1 && low != lastLow, "got %s after %x", id, lastLow)
		random[binary.BigEndian.Uint16(raw[6:])] = true
		lastLow = low
	}
	expect(t, len(random) > 1, "bits 48 to 63 of every id: got %v, want random bits", random)
}

// Faults below the API. A write waits at most its deadline behind another process's lock: then a
// 503 with Retry-After, and nothing of it is stored, then or later; reads go on meanwhile. A full
// disk is a 503 that keeps nothing; a fault or a panic is a 500 that logs its cause with the
// request id and sends none; /healthz is 503 without a database. The file is WAL, synchronous=FULL.
func TestFaults(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	e.store.writeWait = time.Second // the test waits 1 s, not 5, for another process's lock:
	other, _ := sql.Open("sqlite", sqliteURI(e.db, "_txlock=immediate"))
	defer other.Close()
	lock, err := other.Begin()
	require(t, err == nil, "take the write lock: %v", err)
	defer lock.Rollback()
	start, create, body := time.Now(), "/product-payment/create", createBody(nil)
	var wg sync.WaitGroup
	answers, took := [3]response{}, [3]time.Duration{}
	for i := range answers { // one waits for the lock, two behind it for the writer connection
		wg.Go(func() {
			answers[i], _ = callAPI(http.DefaultClient, "POST", e.url+create, e.key, body)
			took[i] = time.Since(start)
		})
	}
	ctx, hangUp := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+create, strings.NewReader(body))
	req.Header.Set("X-API-KEY", e.key)
	wg.Go(func() { http.DefaultClient.Do(req) })
	t.Run("reads go on behind a lock", func(t *testing.T) {
		for range 20 {
			e.do("GET", "/product-payment/list", e.key, "").want(t, 200, "")
		}
	})
	waited := awaitTrue(func() bool { return e.store.writer.Stats().WaitCount >= 3 })
	require(t, waited, "the writes behind the lock did not queue within 20 s")
	hangUp()
	wg.Wait()
	lock.Rollback()
	t.Run("a write behind the lock is a 503 after 1 s, and nothing stored", func(t *testing.T) {
		for i, r := range answers {
			r.want(t, 503, "unavailable")
			expect(t, r.header.Get("Retry-After") == "1", "got %v, want Retry-After: 1", r.header)
			expect(t, took[i]/time.Second == 1, "took %v, want 1 s and less than 2", took[i])
		}
		expect(t, e.buttons() == 0, "got %d buttons after the lock went", e.buttons())
	})
	t.Run("a hang-up behind the lock is no ERROR", func(t *testing.T) {
		log := e.logged()
		expect(t, strings.Count(log, "level=ERROR") == 3 && strings.Count(log, "status=499") == 1,
			"got log\n%s\nwant three ERRORs for the 503s, and the hang-up as status=499", log)
	})
	t.Run("the lock gone, a write goes through", func(t *testing.T) {
		e.do("POST", "/product-payment/create", e.key, createBody(nil)).want(t, 200, "")
	})
	t.Run("WAL, synchronous=FULL", func(t *testing.T) {
		mode, synchronous := "", 0
		e.store.reader.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
		e.store.writer.QueryRow(`PRAGMA synchronous`).Scan(&synchronous)
		expect(t, mode == "wal" && synchronous == 2, "got %s, synchronous %d", mode, synchronous)
	})
	t.Run("a full disk", func(t *testing.T) {
		id := e.create(e.key, createBody(nil))
		e.store.writer.Exec(`PRAGMA max_page_count = 1`) // SQLite keeps what the file has
		defer e.store.writer.Exec(`PRAGMA max_page_count = 1000000`)
		big := createBody(m{"description": strings.Repeat("x", 900)})
		r := e.do("POST", "/product-payment/create", e.key, big)
		for i := 0; i < 100 && r.status == 200; i++ {
			r = e.do("POST", "/product-payment/create", e.key, big)
		}
		buttons := e.buttons()
		r = e.do("POST", "/product-payment/update/"+id, e.key,
			`{"description":"`+strings.Repeat("y", 4000)+`"}`)
		r.want(t, 503, "unavailable")
		expect(t, r.env.Message == "the disk is full; retry later" && e.buttons() == buttons &&
			r.header.Get("Retry-After") == "1" && e.stored("acme", id).Version == 1,
			"got %s %v, %d buttons (had %d); want none kept", r.raw, r.header, e.buttons(), buttons)
	})
	t.Run("a fault", func(t *testing.T) {
		execSQL(e.db, `ALTER TABLE buttons RENAME TO gone`) // the server's SQL names no such table
		r := e.do("POST", "/product-payment/create", e.key, createBody(nil), "X-Request-Id", "t5")
		execSQL(e.db, `ALTER TABLE gone RENAME TO buttons`)
		fault := `level=ERROR msg="request failed" requestId=t5 status=500 err=.*no such table`
		log := e.logged()
		expect(t, bytes.Equal(r.raw, internalError) && regexp.MustCompile(fault).MatchString(log),
			"got %d %s, log\n%s\nwant %s", r.status, r.raw, log, fault)
	})
	t.Run("a panic", func(t *testing.T) {
		var logs bytes.Buffer
		s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
		rec, req := httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil)
		req.Header.Set("X-Request-Id", "t-panic")
		panics := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("why") })
		s.withBasics(panics).ServeHTTP(rec, req)
		expect(t, rec.Code == 500 && bytes.Equal(rec.Body.Bytes(), internalError) &&
			strings.Contains(logs.String(), `msg=panic requestId=t-panic panic=why`),
			"got %d %s, log %s", rec.Code, rec.Body, logs.String())
	})
	t.Run("healthz without a database", func(t *testing.T) {
		e.store.reader.Close()
		r := e.do("GET", "/healthz", "", "")
		r.want(t, 503, "unavailable")
		logged := "requestId=" + r.header.Get("X-Request-Id") + " status=503" // a new id
		expect(t, r.header.Get("Retry-After") == "1" && strings.Contains(e.logged(), logged),
			"got %v, want Retry-After and a log line %s", r.header, logged)
	})
}

// The speed of get and create over HTTP on loopback, 64 clients at once, against a ceiling that
// reads the body as JSON and sends the real answer with no database; "ratio" is their rates' ratio.
func BenchmarkGet(b *testing.B) {
	e := newTestServer(b)
	id := e.create(e.key, createBody(m{"metadata": m{"orderRef": "A-17"}}))
	benchmarkAgainstCeiling(b, e, "GET", "/product-payment/get/"+id, "")
}

func BenchmarkCreate(b *testing.B) {
	benchmarkAgainstCeiling(b, newTestServer(b), "POST", "/product-payment/create", createBody(nil))
}

func benchmarkAgainstCeiling(b *testing.B, e *testEnv, method, path, body string) {
	answer := e.do(method, path, e.key, body)
	answer.want(b, 200, "")
	ceiling := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(new(any))
		maps.Copy(w.Header(), answer.header.Clone())
		w.Write(answer.raw)
	}))
	defer ceiling.Close()
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	measure := func(url string) time.Duration {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := callAPI(client, method, url+path, e.key, body)
				if err != nil || r.status != 200 {
					b.Errorf("%s: got %d %s (%v)", r.request, r.status, r.raw, err)
					return
				}
			}
		})
		return time.Since(start)
	}
	ceilingTime, serverTime := measure(ceiling.URL), measure(e.url)
	b.ReportMetric(float64(serverTime.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(ceilingTime.Seconds()/serverTime.Seconds(), "ratio")
}
