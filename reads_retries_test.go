package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// listPageOf reads one list page through the API.
func (e *testEnv) listPageOf(key, query string) (ids []string, hasMore bool, next string) {
	e.t.Helper()
	r := e.do("GET", "/product-payment/list?"+query, key, "")
	r.want(e.t, 200, "")
	var page struct {
		Items   []struct{ ID string }
		HasMore bool
		Next    *string
	}
	if err := json.Unmarshal(r.env.Data, &page); err != nil {
		e.t.Fatalf("list data: %v\n%s", err, r.raw)
	}
	for _, it := range page.Items {
		ids = append(ids, it.ID)
	}
	if page.Next != nil {
		next = *page.Next
	}
	return ids, page.HasMore, next
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
	wg.Go(func() {
		for range 20 {
			e.create(e.key, createBody(nil))
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
	wg.Wait()
	for i, id := range seen {
		if i > 0 && id >= seen[i-1] {
			t.Errorf("got %s after %s, want each id once, newest first", id, seen[i-1])
		}
		if b, err := e.stored("acme", id); err != nil || b.Account != "acme" {
			t.Errorf("listed %s, which is not acme's (%v)", id, err)
		}
	}
	for _, id := range existing {
		if !slices.Contains(seen, id) {
			t.Errorf("button %s never listed", id)
		}
	}
	if first, _, _ := e.listPageOf(e.key, "limit=1"); len(first) != 1 || first[0] <= existing[44] {
		t.Errorf("got first item %v, want one newer than the last of the first 45", first)
	}
}

// List filters by state, isLive and paymentMethod, goes on after an id, and names a refused parameter.
func TestListQueries(t *testing.T) {
	e := newTestServer(t)
	live := e.create(e.key, createBody(m{"isLive": true}))
	connect := e.create(e.key, createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "1"}))
	gone := e.create(e.key, createBody(nil))
	e.do("DELETE", "/product-payment/delete/"+gone, e.key, "").want(t, 200, "")
	e.create(e.keyB, createBody(m{"isLive": true}))
	for query, want := range map[string][]string{
		"":                                      {connect, live},
		"state=deleted":                         {gone},
		"state=all":                             {gone, connect, live},
		"state=all&isLive=true":                 {live},
		"isLive=false":                          {connect},
		"state=all&paymentMethod=StripeConnect": {connect},
		"paymentMethod=the+service":             nil,
		"state=all&limit=1&after=" + connect:    {live},
	} {
		if got, _, _ := e.listPageOf(e.key, query); !slices.Equal(got, want) {
			t.Errorf("list?%s: got %v, want %v", query, got, want)
		}
	}
	for query, param := range map[string]string{
		"limit=0": "limit", "limit=101": "limit", "limit=%2B5": "limit", "state=gone": "state", "isLive=yes": "isLive",
		"paymentMethod=stripe": "paymentMethod", "after=btn_nope": "after", "Limit=5": "Limit", "limit=5&limit=6": "limit",
		"limit=0&state=x&isLive": "state",
	} {
		if r := e.do("GET", "/product-payment/list?"+query, e.key, ""); r.env.Errors[param] == "" {
			t.Errorf("list?%s: got %d %v, want a 400 naming %q", query, r.status, r.env.Errors, param)
		}
	}
}

// An unindexed filter examines at most maxScan rows a page, so its cost does not grow with the account.
func TestFilteredListExaminesAtMostMaxScanRows(t *testing.T) {
	e := newTestServer(t)
	match := e.create(e.key, createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "1",
		"metadata": map[string]any{"team": "web"}}))
	var ids []string // newest first
	err := e.store.write(context.Background(), func(tx *writeTx) error {
		for range maxScan + 200 {
			id := e.store.ids.next()
			ids = append([]string{id}, ids...)
			if _, err := tx.exec(`INSERT INTO buttons (id, account, `+buttonFields+`, created_key_id, created_request_id, change_seq)
				VALUES (?, 'acme', 'W', NULL, 100, 'USD', NULL, 'Stripe', 'one_time', 0, NULL, NULL, 'active', 1,
				'2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', NULL, 'k', 'r', ?)`, id, tx.nextChange()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, filter := range []string{"paymentMethod=StripeConnect", "isLive=true&state=all", "metadata%5Bteam%5D=web"} {
		got, hasMore, next := e.listPageOf(e.key, filter)
		if len(got) != 0 || !hasMore || next != ids[maxScan-1] {
			t.Errorf("list?%s: got %v hasMore %v next %s, want an empty page that goes on after the %dth newest, %s",
				filter, got, hasMore, next, maxScan, ids[maxScan-1])
		}
		if filter != "isLive=true&state=all" {
			if got, hasMore, _ := e.listPageOf(e.key, filter+"&after="+next); !slices.Equal(got, []string{match}) || hasMore {
				t.Errorf("list?%s after %s: got %v hasMore %v, want the one match and the end", filter, next, got, hasMore)
			}
		}
	}
	if got, _, _ := e.listPageOf(e.key, "limit=2"); !slices.Equal(got, ids[:2]) {
		t.Errorf("unfiltered list: got %v, want the newest two %v", got, ids[:2])
	}
}

// History holds an entry per change, with its key, request id and changed fields; none for a refusal.
func TestHistoryRecordsEveryChange(t *testing.T) {
	e := newTestServer(t)
	r := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "10.00"}), "X-Request-Id", "req-create")
	r.want(t, 200, "")
	id := r.dataString()
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"12.00","description":null}`, "X-Request-Id", "req-update").want(t, 200, "")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"-1"}`).want(t, 400, "invalid_request")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"13.00"}`, "If-Match", `"1"`).want(t, 412, "precondition_failed")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 200, "")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 409, "wrong_state")
	e.do("POST", "/product-payment/restore/"+id, e.key, "").want(t, 200, "")
	h := e.do("GET", "/product-payment/history/"+id, e.key, "")
	h.want(t, 200, "")
	var data page[historyItem, *int64]
	if err := json.Unmarshal(h.env.Data, &data); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for i, it := range data.Items {
		actions = append(actions, it.Action)
		if it.KeyID != e.keyID || it.At.IsZero() || it.RequestID == "" || it.Version != int64(i+1) {
			t.Errorf("%s entry: got keyId %q at %v requestId %q, want %q and both set",
				it.Action, it.KeyID, it.At, it.RequestID, e.keyID)
		}
	}
	if want := []string{"create", "update", "delete", "restore"}; !slices.Equal(actions, want) {
		t.Fatalf("got actions %v, want %v (refused changes write nothing)\n%s", actions, want, h.raw)
	}
	create, update, del := data.Items[0], data.Items[1], data.Items[2]
	if c := create.Changes["amount"]; c.From != nil || c.To != "10.00" || create.RequestID != "req-create" {
		t.Errorf("create: got amount %+v request %q, want null -> 10.00, req-create", c, create.RequestID)
	}
	if _, ok := create.Changes["billingInterval"]; ok {
		t.Error("create: got a change for billingInterval, which stayed null")
	}
	if len(update.Changes) != 2 || update.Changes["amount"] != (change{"10.00", "12.00"}) ||
		update.Changes["description"] != (change{"Monthly access", nil}) {
		t.Errorf("update: got changes %+v, want amount 10.00 -> 12.00 and description cleared only", update.Changes)
	}
	if len(del.Changes) != 1 || del.Changes["state"] != (change{"active", "deleted"}) {
		t.Errorf("delete: got changes %+v, want state active -> deleted only", del.Changes)
	}
}

// If-Match lets a change run only on the version it names, a strong ETag.
func TestIfMatch(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	etag := e.do("GET", "/product-payment/get/"+id, e.key, "").header.Get("ETag")
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"1.00"}`, "If-Match", etag).want(t, 200, "")
	before := e.mustStored("acme", id)
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"2.00"}`, "If-Match", etag).
		want(t, 412, "precondition_failed")
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "", "If-Match", etag).want(t, 412, "precondition_failed")
	if after := e.mustStored("acme", id); !reflect.DeepEqual(after, before) {
		t.Errorf("a 412 changed the button: got %+v, want %+v", after, before)
	}
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "", "If-Match", `"2"`).want(t, 200, "")
	e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", `"2"`).want(t, 412, "precondition_failed")
	e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", `"3"`).want(t, 200, "")
	for _, bad := range []string{"3", `W/"3"`, `"3", "4"`} {
		e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", bad).want(t, 400, "invalid_request")
	}
	if b := e.mustStored("acme", id); b.Version != 4 || b.State != stateActive {
		t.Errorf("got version %d state %s, want 4 active", b.Version, b.State)
	}
}

// storedAnswers counts the idempotency records of account.
func (e *testEnv) storedAnswers(account string) int {
	return e.count(`SELECT count(*) FROM idempotency_keys WHERE account = ?`, account)
}

// sendTwice sends a request twice with Idempotency-Key key and checks that the
// second answer replays the first: the same status and bytes, marked replayed.
func (e *testEnv) sendTwice(method, path, body, key string) response {
	e.t.Helper()
	first := e.do(method, path, e.key, body, "Idempotency-Key", key)
	again := e.do(method, path, e.key, body, "Idempotency-Key", key)
	if first.header.Get("Idempotent-Replayed") != "" || again.header.Get("Idempotent-Replayed") != "true" ||
		again.status != first.status || !bytes.Equal(again.raw, first.raw) {
		e.t.Errorf("%s sent twice: got %d %s, then %d %s (Idempotent-Replayed %q), want the first replayed",
			first.request, first.status, first.raw, again.status, again.raw, again.header.Get("Idempotent-Replayed"))
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
		e.do("POST", "/product-payment/"+path, e.key, sent, "Idempotency-Key", "order-1").want(t, 422, "idempotency_mismatch")
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
	if n, buttons := e.storedAnswers("acme"), e.countButtons(); n != 7 || buttons != 4 {
		t.Errorf("got %d stored answers for acme and %d buttons, want 7 (order-1, k0..k3, del, ct-1) and 4", n, buttons)
	}
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "").want(t, 400, "invalid_request")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", strings.Repeat("k", 256)).want(t, 400, "invalid_request")
}

// Concurrent requests with one Idempotency-Key make one button; the rest are told it is in flight.
func TestConcurrentRequestsWithOneKeyMakeOneButton(t *testing.T) {
	e := newTestServer(t)
	body := createBody(nil)
	results := make([]response, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "same") })
	}
	wg.Wait()
	ids := map[string]bool{}
	for _, r := range results {
		switch {
		case r.status == 200:
			ids[r.dataString()] = true
		case r.status == 409 && r.env.Code == "idempotency_in_flight":
		default:
			t.Errorf("got %d %s, want 200 or 409 idempotency_in_flight", r.status, r.raw)
		}
	}
	if n := e.countButtons(); n != 1 || len(ids) != 1 {
		t.Errorf("got %d buttons and ids %v, want exactly one", n, ids)
	}
}

// Past 24 hours an Idempotency-Key is free again, and its answer purged, a limited number at a time.
func TestIdempotencyKeysExpire(t *testing.T) {
	e := newTestServer(t)
	setCreated := func(at any, keys string) {
		e.store.write(context.Background(), func(tx *writeTx) error {
			_, err := tx.exec(`UPDATE idempotency_keys SET created_at = ? WHERE key LIKE ?`, at, keys)
			return err
		})
	}
	e.do("POST", "/product-payment/create", e.key, createBody(nil), "Idempotency-Key", "old").want(t, 200, "")
	setCreated("2000-01-01T00:00:00.000Z", "old")
	if r := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "3.00"}), "Idempotency-Key", "old"); r.status != 200 ||
		r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a key past its 24 hours: got %d %s, want a new request", r.status, r.raw)
	}
	for i := range 34 {
		e.do("DELETE", "/product-payment/delete/x", e.key, "", "Idempotency-Key", fmt.Sprint("k", i))
	}
	setCreated("2000-01-01T00:00:00.000Z", "k%")
	setCreated(now(), "k3_")                  // k30..k33
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
	if n := e.storedAnswers("acme"); n != 5 {
		t.Errorf("got %d answers left, want old's new one and k30..k33", n)
	}
}
