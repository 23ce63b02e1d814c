package main

// Retries and versions: Idempotency-Key replays, in-flight keys, expiry, the answers stored, ETag and If-Match.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// sendTwice sends a request twice with Idempotency-Key key and the other headers given, and checks that the second
// answer replays the first: the same status, ETag and bytes, marked replayed.
func (e *testEnv) sendTwice(method, path, body, key string, headers ...string) response {
	e.t.Helper()
	headers = append(headers, "Idempotency-Key", key)
	first, again := e.do(method, path, e.key, body, headers...), e.do(method, path, e.key, body, headers...)
	if first.header.Get("Idempotent-Replayed") != "" || again.header.Get("Idempotent-Replayed") != "true" ||
		again.status != first.status || !bytes.Equal(again.raw, first.raw) ||
		again.header.Get("ETag") != first.header.Get("ETag") {
		e.t.Errorf("%s sent twice: got %d %s ETag %q, then %d %s ETag %q (Idempotent-Replayed %q), want the first "+
			"replayed", first.request, first.status, first.raw, first.header.Get("ETag"), again.status, again.raw,
			again.header.Get("ETag"), again.header.Get("Idempotent-Replayed"))
	}
	return first
}

// A retry with the same Idempotency-Key replays the first answer; the key with another request is refused.
func TestIdempotentReplay(t *testing.T) {
	e := newTestServer(t)
	body := createBody(nil)
	created := e.sendTwice("POST", "/product-payment/create", body, "order-1")
	created.want(t, 200, "")
	// A refusal is replayed too; a retried delete replays its 200, not a 409.
	id := e.create(e.key, body)
	for i, tt := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "create", `{"productName":""}`, 400, "invalid_request"},
		{"DELETE", "delete/" + id, "", 200, ""},
		{"DELETE", "delete/btn_01JD0000000000000000000000", "", 404, "not_found"},
		{"DELETE", "delete/not-an-id", "", 404, "not_found"},
	} {
		e.sendTwice(tt.method, "/product-payment/"+tt.path, tt.body, fmt.Sprint("k", i)).want(t, tt.status, tt.code)
	}
	if b := e.mustStored("acme", id); b.Version != 2 || b.State != stateDeleted {
		t.Errorf("got version %d state %s, want 2 deleted: the retry must not run again", b.Version, b.State)
	}
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 409, "wrong_state") // without the key: a new request
	cid := created.dataString()
	for path, sent := range map[string]string{"create": createBody(m{"amount": "1.00"}), "update/" + cid: body} {
		e.do("POST", "/product-payment/"+path, e.key, sent, "Idempotency-Key", "order-1").
			want(t, 422, "idempotency_mismatch")
	}
	// If-Match is part of the request: a retry with a corrected one needs a new key.
	e.do("DELETE", "/product-payment/delete/"+cid, e.key, "", "If-Match", `"7"`, "Idempotency-Key", "del").
		want(t, 412, "precondition_failed")
	e.do("DELETE", "/product-payment/delete/"+cid, e.key, "", "If-Match", `"1"`, "Idempotency-Key", "del").
		want(t, 422, "idempotency_mismatch")
	// Keys are per account: the same key from another account is a new request.
	e.do("POST", "/product-payment/create", e.keyB, body, "Idempotency-Key", "order-1").want(t, 200, "")
	// Answers given before the operation runs are not kept.
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct-1", "Content-Type", "text/plain").
		want(t, 415, "unsupported_media_type")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct-1").want(t, 200, "")
	if n, buttons := e.count(`SELECT count(*) FROM idempotency_keys`), e.countButtons(); n != 8 || buttons != 4 {
		t.Errorf("got %d stored answers and %d buttons, want 8 (order-1 twice, k0..k3, del, ct-1) and 4", n, buttons)
	}
	for _, key := range []string{"", strings.Repeat("k", 256), "tab\tin"} {
		e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", key).wantFields(t, "Idempotency-Key")
	}
}

// Concurrent requests with one Idempotency-Key make one button; the rest are told it is in flight.
func TestConcurrentRequestsWithOneKeyMakeOneButton(t *testing.T) {
	e := newTestServer(t)
	results, errs := make([]response, 20), make([]error, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { // callAPI, not e.do: a goroutine may not end the test
			results[i], errs[i] = callAPI(http.DefaultClient, "POST", e.url+"/product-payment/create", e.key,
				createBody(nil), "Idempotency-Key", "same")
		})
	}
	wg.Wait()
	ids := map[string]bool{}
	for i, r := range results {
		if r.status == 200 {
			ids[r.dataString()] = true
		} else if errs[i] != nil || r.status != 409 || r.env.Code != "idempotency_in_flight" {
			t.Errorf("%s: got %d %s (%v), want 200 or 409 idempotency_in_flight", r.request, r.status, r.raw, errs[i])
		}
	}
	if n := e.countButtons(); n != 1 || len(ids) != 1 {
		t.Errorf("got %d buttons and ids %v, want exactly one", n, ids)
	}
}

// Past 24 hours an Idempotency-Key is free again, and its answer purged, a limited number at a time.
func TestIdempotencyKeysExpire(t *testing.T) {
	e := newTestServer(t)
	age := func(keys string, at any) {
		e.exec(`UPDATE idempotency_keys SET created_at = ? WHERE key LIKE ?`, at, keys)
	}
	e.do("POST", "/product-payment/create", e.key, createBody(nil), "Idempotency-Key", "old").want(t, 200, "")
	age("old", "2000-01-01T00:00:00.000Z")
	r := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "3.00"}), "Idempotency-Key", "old")
	if r.want(t, 200, ""); r.header.Get("Idempotent-Replayed") != "" || e.countButtons() != 2 {
		t.Errorf("a key past 24 hours: got %s replayed %q, want a new request", r.raw, r.header.Get("Idempotent-Replayed"))
	}
	for i := range 34 {
		e.do("DELETE", "/product-payment/delete/x", e.key, "", "Idempotency-Key", fmt.Sprint("k", i))
	}
	age("k%", "2000-01-01T00:00:00.000Z")
	age("k3_", now())                         // k30..k33
	for _, want := range []int64{20, 10, 0} { // k0..k29
		var n int64
		err := e.store.write(context.Background(), func(tx *writeTx) (err error) {
			n, err = purgeExpired(tx, 20)
			return err
		})
		if n != want || err != nil {
			t.Errorf("purge: got %d, %v, want %d", n, err, want)
		}
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys`); n != 5 {
		t.Errorf("got %d answers left, want old's new one and k30..k33", n)
	}
}

// Every write answers ETag "<version>" and its replay repeats it, so each answer's ETag can be the next write's
// If-Match: a chain of writes needs no get in between (issue 16, item 14). An update that gives every field the value
// it has answers "unchanged" and the current version, and changes nothing: version, updatedAt, changeSeq, history. A
// stale If-Match is a 412 that changes nothing; one not in the form get sends, "<version>", is a 400 (item 12).
func TestVersionsETagAndIfMatch(t *testing.T) {
	e := newTestServer(t)
	id, etag, last := "", "*", button{} // any version: create ignores If-Match
	for i, w := range []struct{ method, path, body, message, etag string }{
		{"POST", "create", createBody(m{"description": nil, "metadata": m{"k": "v"}}), "created", `"1"`},
		{"POST", "update/", `{"amount":"5.00"}`, "updated", `"2"`},
		{"POST", "update/", `{"description":null}`, "unchanged", `"2"`},
		{"POST", "update/", `{"productName":"Pro plan","amount":"5"}`, "unchanged", `"2"`},
		{"POST", "update/", `{"currency":"usd","metadata":{"k":"v","gone":null}}`, "unchanged", `"2"`},
		{"DELETE", "delete/", "", "deleted", `"3"`},
		{"POST", "restore/", "", "restored", `"4"`},
		{"POST", "update/", `{"productName":"Last"}`, "updated", `"5"`},
	} {
		r := e.sendTwice(w.method, "/product-payment/"+w.path+id, w.body, fmt.Sprint("chain-", i), "If-Match", etag)
		if r.want(t, 200, ""); r.env.Message != w.message || r.header.Get("ETag") != w.etag {
			t.Errorf("%s: got %s ETag %q, want %s ETag %s", r.request, r.env.Message, r.header.Get("ETag"), w.message, w.etag)
		}
		id, etag = r.dataString(), r.header.Get("ETag")
		if b := e.mustStored("acme", id); w.message == "unchanged" && !reflect.DeepEqual(b, last) {
			t.Errorf("%s: got %+v, want it unchanged: %+v", r.request, b, last)
		} else {
			last = b
		}
	}
	if get := e.do("GET", "/product-payment/get/"+id, e.key, ""); get.header.Get("ETag") != `"5"` {
		t.Errorf(`get: got ETag %q, want "5" as the last write answered`, get.header.Get("ETag"))
	}
	if n := e.count(`SELECT count(*) FROM button_history`); last.Version != 5 || last.ProductName != "Last" || n != 4 {
		t.Errorf("after the chain got %+v and %d history rows, want version 5, Last, and 4 rows", last, n)
	}
	for _, w := range [][]string{{"POST", "update/", `{"amount":"2.00"}`, `"4"`}, {"DELETE", "delete/", "", `"1"`},
		{"POST", "restore/", "", `"6"`}} { // a 412 before the restore's 409
		e.do(w[0], "/product-payment/"+w[1]+id, e.key, w[2], "If-Match", w[3]).want(t, 412, "precondition_failed")
	}
	for _, bad := range []string{"5", `W/"5"`, `"5", "6"`, `"05"`, `"+5"`, `" 5"`, `"01"`, `"+1"`, `" 1"`, `"0"`, `"-5"`} {
		e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"9.00"}`, "If-Match", bad).wantFields(t, "If-Match")
	}
	if after := e.mustStored("acme", id); !reflect.DeepEqual(after, last) {
		t.Errorf("a refused If-Match changed the button: got %+v, want %+v", after, last)
	}
}

// A body of thousands of unknown fields gets a 400 of a few KB: it names the first 20, each cut to 40 bytes, and says
// how many more there were; with an Idempotency-Key, that small answer is what is stored (issue 16, item 3).
func TestLargeRefusalIsSmallAndStoredSmall(t *testing.T) {
	e := newTestServer(t)
	unknown, shown := m{}, []string(nil)
	for i := range 3000 {
		name := fmt.Sprintf("z%04d", i)
		if i < 25 { // sorted first, and longer than 40 bytes: cut at 39, between two-byte characters
			name = fmt.Sprintf("%02d", i) + strings.Repeat("é", 60)
		}
		if unknown[name] = 1; i < 20 {
			shown = append(shown, name[:2+2*18]+"…")
		}
	}
	body := createBody(unknown)
	r := e.sendTwice("POST", "/product-payment/create", body, "big")
	r.wantFields(t, shown...)
	if len(body) < 30_000 || len(r.raw) > 4<<10 {
		t.Errorf("a %d-byte body got a %d-byte refusal, want at most 4 KiB", len(body), len(r.raw))
	}
	if want := "3000 fields are invalid: " + strings.Join(shown, ", ") + " and 2980 more"; r.env.Message != want {
		t.Errorf("got message %q, want %q", r.env.Message, want)
	}
	var stored []byte
	err := e.store.reader.QueryRow(`SELECT body FROM idempotency_keys WHERE key = 'big'`).Scan(&stored)
	if err != nil || !bytes.Equal(stored, r.raw) || e.countButtons() != 0 {
		t.Errorf("stored %d bytes (%v) and %d buttons, want the %d bytes sent and none", len(stored), err,
			e.countButtons(), len(r.raw))
	}
}
