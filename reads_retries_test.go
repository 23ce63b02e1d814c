package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
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

// listAll pages through everything query selects, limit at a time.
func (e *testEnv) listAll(key, query string, limit int) []string {
	e.t.Helper()
	var all []string
	after := ""
	for {
		q := fmt.Sprintf("%s&limit=%d", query, limit)
		if after != "" {
			q += "&after=" + after
		}
		ids, hasMore, next := e.listPageOf(key, q)
		all = append(all, ids...)
		if !hasMore {
			if next != "" {
				e.t.Fatalf("got next %q on the last page, want null", next)
			}
			return all
		}
		if next != ids[len(ids)-1] {
			e.t.Fatalf("got next %q, want the page's last id %q", next, ids[len(ids)-1])
		}
		after = next
	}
}

func TestListPagesSeeEachButtonOnceWhileOthersAreCreated(t *testing.T) {
	e := newTestServer(t)
	var existing []string
	for i := range 45 {
		existing = append(existing, e.create(e.key, createBody(m{"productName": fmt.Sprint("b", i)})))
	}
	e.create(e.keyB, createBody(nil)) // another account's: never listed

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // creates racing the paging
		defer wg.Done()
		for range 20 {
			e.create(e.key, createBody(nil))
		}
	}()
	seen := e.listAll(e.key, "state=all", 7)
	wg.Wait()

	if !slices.IsSortedFunc(seen, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("got ids out of newest-first order: %v", seen)
	}
	count := map[string]int{}
	for _, id := range seen {
		count[id]++
	}
	for _, id := range existing {
		if count[id] != 1 {
			t.Errorf("button %s listed %d times, want once", id, count[id])
		}
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("button %s listed %d times", id, n)
		}
		if b, err := e.stored("acme", id); err != nil || b.Account != "acme" {
			t.Errorf("listed %s, which is not acme's (%v)", id, err)
		}
	}
	if first, _, _ := e.listPageOf(e.key, "limit=1"); len(first) != 1 || first[0] <= existing[44] {
		t.Errorf("got first item %v, want one newer than the last of the first 45", first)
	}
}

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

// A filter no index serves examines at most maxScan rows a page, so that its
// cost does not grow with the account: past them the page ends early, with
// hasMore and a next that goes on from where it stopped.
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
				'2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', NULL, 'k', 'r', ?)`, id, tx.nextChange("acme")); err != nil {
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
	var data struct {
		Items []struct {
			Version                      int64
			At, Action, KeyID, RequestID string
			Changes                      map[string]struct{ From, To any }
		}
	}
	if err := json.Unmarshal(h.env.Data, &data); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for i, it := range data.Items {
		actions = append(actions, it.Action)
		if it.KeyID != e.keyID || it.At == "" || it.RequestID == "" || it.Version != int64(i+1) {
			t.Errorf("%s entry: got keyId %q at %q requestId %q, want %q and both set", it.Action, it.KeyID, it.At, it.RequestID, e.keyID)
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
	if len(update.Changes) != 2 || update.Changes["amount"].From != "10.00" || update.Changes["amount"].To != "12.00" ||
		update.Changes["description"].From != "Monthly access" || update.Changes["description"].To != nil {
		t.Errorf("update: got changes %+v, want amount 10.00 -> 12.00 and description cleared only", update.Changes)
	}
	if c := del.Changes["state"]; len(del.Changes) != 1 || c.From != "active" || c.To != "deleted" {
		t.Errorf("delete: got changes %+v, want state active -> deleted only", del.Changes)
	}
	// Another account sees no history.
	e.do("GET", "/product-payment/history/"+id, e.keyB, "").want(t, 404, "not_found")
}

func TestIfMatch(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	etag := e.do("GET", "/product-payment/get/"+id, e.key, "").header.Get("ETag")

	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"1.00"}`, "If-Match", etag).want(t, 200, "")
	before, _ := e.stored("acme", id)
	for _, op := range []struct{ method, path, body string }{
		{"POST", "/product-payment/update/", `{"amount":"2.00"}`},
		{"DELETE", "/product-payment/delete/", ""},
	} {
		e.do(op.method, op.path+id, e.key, op.body, "If-Match", etag).want(t, 412, "precondition_failed")
	}
	if after, _ := e.stored("acme", id); !reflect.DeepEqual(after, before) {
		t.Errorf("a 412 changed the button: got %+v, want %+v", after, before)
	}
	r := e.do("DELETE", "/product-payment/delete/"+id, e.key, "", "If-Match", `"2"`)
	r.want(t, 200, "")
	e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", `"2"`).want(t, 412, "precondition_failed")
	e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", `"3"`).want(t, 200, "")
	for _, bad := range []string{"3", `W/"3"`, `"3", "4"`} {
		e.do("POST", "/product-payment/restore/"+id, e.key, "", "If-Match", bad).want(t, 400, "invalid_request")
	}
	if b, _ := e.stored("acme", id); b.Version != 4 || b.State != stateActive {
		t.Errorf("got version %d state %s, want 4 active", b.Version, b.State)
	}
}

// storedAnswers counts the idempotency records of account.
func (e *testEnv) storedAnswers(account string) int {
	return e.count(`SELECT count(*) FROM idempotency_keys WHERE account = ?`, account)
}

func TestIdempotentReplay(t *testing.T) {
	e := newTestServer(t)
	body := createBody(nil)
	first := e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "order-1")
	first.want(t, 200, "")
	again := e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "order-1")
	again.want(t, 200, "")
	if !bytes.Equal(again.raw, first.raw) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("got replay %s (Idempotent-Replayed %q), want %s byte for byte, replayed", again.raw, again.header.Get("Idempotent-Replayed"), first.raw)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Error("the first answer says it was replayed")
	}
	if n := e.countButtons(); n != 1 {
		t.Errorf("got %d buttons, want 1", n)
	}

	other := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "1.00"}), "Idempotency-Key", "order-1")
	other.want(t, 422, "idempotency_mismatch")
	otherPath := e.do("POST", "/product-payment/update/"+first.dataString(), e.key, body, "Idempotency-Key", "order-1")
	otherPath.want(t, 422, "idempotency_mismatch")
	// If-Match is part of the request: a retry with a corrected one needs a new key.
	e.do("DELETE", "/product-payment/delete/"+first.dataString(), e.key, "", "If-Match", `"7"`, "Idempotency-Key", "del").
		want(t, 412, "precondition_failed")
	e.do("DELETE", "/product-payment/delete/"+first.dataString(), e.key, "", "If-Match", `"1"`, "Idempotency-Key", "del").
		want(t, 422, "idempotency_mismatch")

	// Keys are per account: the same key from another account is a new request.
	e.do("POST", "/product-payment/create", e.keyB, body, "Idempotency-Key", "order-1").want(t, 200, "")
	if n := e.countButtons(); n != 2 {
		t.Errorf("got %d buttons, want 2", n)
	}

	// A refused request's answer is kept and replayed too.
	bad := `{"productName":""}`
	r1 := e.do("POST", "/product-payment/create", e.key, bad, "Idempotency-Key", "bad-1")
	r1.want(t, 400, "invalid_request")
	r2 := e.do("POST", "/product-payment/create", e.key, bad, "Idempotency-Key", "bad-1")
	if !bytes.Equal(r2.raw, r1.raw) || r2.status != 400 || r2.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("got %d %s, want the 400 replayed", r2.status, r2.raw)
	}
	// Answers given before the operation runs are not kept.
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct-1", "Content-Type", "text/plain").want(t, 415, "unsupported_media_type")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "ct-1").want(t, 200, "")
	if n := e.storedAnswers("acme"); n != 4 {
		t.Errorf("got %d stored answers for acme, want 4 (order-1, del, bad-1, ct-1)", n)
	}
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "").want(t, 400, "invalid_request")
	e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", strings.Repeat("k", 256)).want(t, 400, "invalid_request")

	// A retried delete replays its 200 instead of a 409; a 404, of a missing
	// button or a malformed id, is replayed too.
	id := e.create(e.key, createBody(nil))
	for _, path := range []string{"delete/" + id, "delete/btn_01JD0000000000000000000000", "delete/not-an-id"} {
		first := e.do("DELETE", "/product-payment/"+path, e.key, "", "Idempotency-Key", "k-"+path)
		again := e.do("DELETE", "/product-payment/"+path, e.key, "", "Idempotency-Key", "k-"+path)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.raw, first.raw) || again.status != first.status {
			t.Errorf("DELETE %s: got %d %s, want a replay of %d %s", path, again.status, again.raw, first.status, first.raw)
		}
	}
	if b := e.mustStored("acme", id); b.Version != 2 || b.State != stateDeleted {
		t.Errorf("got version %d state %s, want 2 deleted: the retry must not run again", b.Version, b.State)
	}
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 409, "wrong_state") // without the key: a new request
}

func TestConcurrentRequestsWithOneKeyMakeOneButton(t *testing.T) {
	e := newTestServer(t)
	body := createBody(nil)
	results := make([]response, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = e.do("POST", "/product-payment/create", e.key, body, "Idempotency-Key", "same")
		}()
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

// Past 24 hours an Idempotency-Key is free again, and its answer is purged,
// no more than the purge's limit at a time.
func TestIdempotencyKeysExpire(t *testing.T) {
	e := newTestServer(t)
	e.do("POST", "/product-payment/create", e.key, createBody(nil), "Idempotency-Key", "old").want(t, 200, "")
	age := func(key string) {
		e.store.write(context.Background(), func(tx *writeTx) error {
			_, err := tx.exec(`UPDATE idempotency_keys SET created_at = '2000-01-01T00:00:00.000Z' WHERE key LIKE ?`, key)
			return err
		})
	}
	age("old")
	if r := e.do("POST", "/product-payment/create", e.key, createBody(m{"amount": "3.00"}), "Idempotency-Key", "old"); r.status != 200 ||
		r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a key past its 24 hours: got %d %s, want a new request", r.status, r.raw)
	}
	for i := range 34 {
		e.do("DELETE", "/product-payment/delete/x", e.key, "", "Idempotency-Key", fmt.Sprint("k", i))
	}
	age("k%")
	e.store.write(context.Background(), func(tx *writeTx) error {
		_, err := tx.exec(`UPDATE idempotency_keys SET created_at = ? WHERE key IN ('k30', 'k31', 'k32', 'k33')`, now())
		return err
	})
	for _, want := range []int64{20, 10, 0} { // k0..k29
		if n, err := purge(e.store, 20); n != want || err != nil {
			t.Errorf("purge: got %d, %v, want %d", n, err, want)
		}
	}
	if n := e.storedAnswers("acme"); n != 5 {
		t.Errorf("got %d answers left, want old's new one and k30..k33", n)
	}
}

func TestBackupWhileWriting(t *testing.T) {
	e := newTestServer(t)
	before := e.create(e.key, createBody(nil))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				e.create(e.key, createBody(nil))
			}
		}
	}()
	dest := filepath.Join(t.TempDir(), "copy.db")
	out, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest)
	close(stop)
	wg.Wait()
	if err != nil || !strings.Contains(out, dest) {
		t.Fatalf("backup: got %q, %v", out, err)
	}
	if _, err := runCLI(t, nil, "backup", "-db", e.dbPath, dest); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second backup to the same file: got %v, want a refusal", err)
	}

	copied, err := openStore(dest)
	if err != nil {
		t.Fatalf("open the copy: %v", err)
	}
	defer copied.close()
	var check string
	if err := copied.reader.QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check on the copy: %q, %v", check, err)
	}
	// Every button in the copy has its full history: the copy is one moment.
	all, _, err := copied.listButtons(context.Background(), "acme", listFilter{Limit: 1 << 30})
	if err != nil || len(all) == 0 {
		t.Fatalf("list the copy: got %d buttons, %v", len(all), err)
	}
	for _, b := range all {
		entries, current, err := copied.buttonHistory(context.Background(), "acme", b.ID, 0, 100)
		if err != nil || int64(len(entries)) != b.Version || current != b.Version || !reflect.DeepEqual(entries[len(entries)-1].After, b) {
			t.Errorf("button %s at version %d: got %d history entries (%v), want one a version ending in the button",
				b.ID, b.Version, len(entries), err)
		}
	}
	// The copy serves: the key and the button made before the backup are there.
	restored := &testEnv{t: t, url: serveStore(t, copied, config{providerName: "the service"}), store: copied}
	if v := restored.getView(e.key, before); v["id"] != before {
		t.Errorf("got %v from the restored server, want button %s", v["id"], before)
	}
	restored.create(e.key, createBody(nil))
}

// purge runs purgeExpired through the writer, as its ticker does.
func purge(st *store, limit int) (n int64, err error) {
	err = st.write(context.Background(), func(tx *writeTx) error {
		n, err = purgeExpired(tx, limit)
		return err
	})
	return n, err
}
