package main

// Faults the server must survive without a restart: the database busy past
// its timeout, a full disk, clients that send too slowly or too much.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// wantUnavailable checks a 503 answer: code unavailable, empty data and a
// Retry-After of a positive number of seconds.
func wantUnavailable(t *testing.T, what string, r response) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable || r.env.IsSuccess || r.env.Code != "unavailable" || string(r.env.Data) != `""` {
		t.Errorf("%s: got %v, want 503 unavailable with data \"\"", what, r)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("%s: got Retry-After %q, want a positive number of seconds", what, r.header.Get("Retry-After"))
	}
}

// wantFreshAfterFault sends again, once the fault is gone, a create that got
// a 503 with an Idempotency-Key: a 5xx is never kept, so it runs afresh and
// creates the button; the next repeat is a replay of that answer.
func wantFreshAfterFault(t *testing.T, e *testEnv, body, key string) {
	t.Helper()
	client := newTestClient()
	defer client.CloseIdleConnections()
	first, err := callAPI(client, "POST", e.url+"/product-payment/create", e.key, body, "Idempotency-Key", key)
	if err != nil || first.status != 200 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("create with Idempotency-Key %s after its 503: got %v (%v, replayed %q), want 200 run afresh",
			key, first, err, first.header.Get("Idempotent-Replayed"))
	}
	if _, err := e.stored("acme", first.dataString()); err != nil {
		t.Errorf("create with Idempotency-Key %s answered 200 for %s: %v", key, first.dataString(), err)
	}
	again, err := callAPI(client, "POST", e.url+"/product-payment/create", e.key, body, "Idempotency-Key", key)
	if err != nil || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.raw, first.raw) {
		t.Errorf("repeat of create with Idempotency-Key %s: got %v (%v, replayed %q), want a replay of %s",
			key, again, err, again.header.Get("Idempotent-Replayed"), first.raw)
	}
}

// TestBusyDatabaseAnswersUnavailable holds the write lock from another
// connection past busy_timeout: a create answers 503 and stores nothing,
// reads still answer, and once the lock is gone creates succeed again.
func TestBusyDatabaseAnswersUnavailable(t *testing.T) {
	longTests(t) // waits out the 5 s busy timeout
	t.Parallel()
	e := newTestServer(t)
	client := newTestClient()
	defer client.CloseIdleConnections()
	// This also records the key's last use, so that no background write of
	// it joins the create below.
	first := e.create(e.key, createBody(nil))
	before := e.countButtons()

	other, err := sql.Open("sqlite", e.dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	lock, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(ctx, `UPDATE buttons SET product_name = 'held' WHERE id = ?`, first); err != nil {
		t.Fatal(err)
	}

	// Reads do not wait behind the lock.
	if r, err := callAPI(client, "GET", e.url+"/product-payment/get/"+first, e.key, ""); err != nil || r.status != 200 {
		t.Errorf("get while the write lock is held: got %v (%v), want 200", r, err)
	}
	blocked := createBody(map[string]any{"productName": "Blocked"})
	r, err := callAPI(client, "POST", e.url+"/product-payment/create", e.key, blocked, "Idempotency-Key", "busy-create")
	if err != nil {
		t.Fatalf("create while the write lock is held: %v", err)
	}
	wantUnavailable(t, "create while the write lock is held", r)
	if n := e.countButtons(); n != before {
		t.Errorf("got %d buttons after the 503, want %d", n, before)
	}

	if _, err := lock.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	id := e.create(e.key, createBody(map[string]any{"productName": "After"}))
	if b, err := e.stored("acme", id); err != nil || b.ProductName != "After" {
		t.Errorf("create after the lock was released: got %+v (%v), want it stored", b, err)
	}
	wantFreshAfterFault(t, e, blocked, "busy-create")
	if b, _ := e.stored("acme", first); b.ProductName != "Pro plan" {
		t.Errorf("got productName %q, want the other connection's rolled-back write gone", b.ProductName)
	}
}

// TestFullDiskAnswersUnavailable caps the file at its current size with
// max_page_count: writes that need room answer 503 and change nothing, writes
// committed in the same batch keep what was answered 200, and once there is
// room again the server writes as before.
func TestFullDiskAnswersUnavailable(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	client := newTestClient()
	defer client.CloseIdleConnections()
	ids := make([]string, 6)
	for i := range ids {
		ids[i] = e.create(e.key, createBody(map[string]any{"amount": "1.00"}))
	}
	// max_page_count belongs to a connection: it goes through the writer, so
	// that it reaches the one connection every write uses.
	maxPages := func(n int64) {
		t.Helper()
		err := e.store.write(context.Background(), func(tx *writeTx) error {
			_, err := tx.exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, n))
			return err
		})
		if err != nil {
			t.Fatalf("max_page_count = %d: %v", n, err)
		}
	}
	var free, pages int64
	if err := e.store.reader.QueryRow(`PRAGMA freelist_count`).Scan(&free); err != nil || free != 0 {
		t.Fatalf("got %d free pages (%v): the test needs none, so that every new row must grow the file", free, err)
	}
	if err := e.store.reader.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	maxPages(pages)

	big := strings.Repeat("é", 5000) // 10 KB: needs new overflow pages
	bigCreate := createBody(map[string]any{"description": big})
	before := e.countButtons()
	create := func() (response, error) {
		return callAPI(client, "POST", e.url+"/product-payment/create", e.key, bigCreate)
	}
	r, err := create()
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, "create on a full disk", r)
	if !strings.Contains(r.env.Message, "disk is full") {
		t.Errorf("got %q on a full disk, want it to say the disk is full", r.env.Message)
	}
	r, err = callAPI(client, "POST", e.url+"/product-payment/create", e.key, bigCreate, "Idempotency-Key", "full-create")
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, "create with an Idempotency-Key on a full disk", r)
	r, err = callAPI(client, "POST", e.url+"/product-payment/update/"+ids[0], e.key, fmt.Sprintf(`{"description":%q}`, big),
		"Idempotency-Key", "full-update")
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, "update with an Idempotency-Key growing a row on a full disk", r)
	r, err = callAPI(client, "POST", e.url+"/product-payment/update/"+ids[0], e.key, fmt.Sprintf(`{"description":%q}`, big))
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, "update growing a row on a full disk", r)
	if b, _ := e.stored("acme", ids[0]); b.Description != "Monthly access" || b.Version != 1 {
		t.Errorf("after the 503 update got description of %d characters, version %d; want it unchanged, version 1", len(b.Description), b.Version)
	}

	// One batch of updates that fit in the pages the file has, then creates
	// that do not: the batch fails as a unit, so none of them may be answered
	// 200 unless it is stored. The writer is held so that every request
	// queues behind it; a channel's waiting senders are served in order.
	release := holdWriter(e.store)
	type result struct {
		r   response
		err error
	}
	creates := make([]result, 3)
	updates := make([]result, len(ids)-1)
	var wg sync.WaitGroup
	for i := range updates {
		wg.Go(func() {
			body := fmt.Sprintf(`{"amount":"%d.00"}`, i+2)
			updates[i].r, updates[i].err = callAPI(client, "POST", e.url+"/product-payment/update/"+ids[i+1], e.key, body)
		})
	}
	// The pauses only decide the order within the batch, never what the
	// checks accept.
	time.Sleep(200 * time.Millisecond)
	for i := range creates {
		wg.Go(func() { creates[i].r, creates[i].err = create() })
	}
	time.Sleep(200 * time.Millisecond)
	release()
	wg.Wait()
	applied := 0
	for i, o := range creates {
		if o.err != nil {
			t.Errorf("create %d in the batch: %v", i, o.err)
			continue
		}
		wantUnavailable(t, fmt.Sprintf("create %d in the batch", i), o.r)
	}
	for i, o := range updates {
		b, err := e.stored("acme", ids[i+1])
		switch {
		case o.err != nil || err != nil:
			t.Errorf("update %d in the batch: %v, %v", i, o.err, err)
		case o.r.status == 200:
			applied++
			if b.AmountMinor != int64(i+2)*100 || b.Version != 2 {
				t.Errorf("update %d answered 200: got amount %d version %d stored, want %d version 2", i, b.AmountMinor, b.Version, (i+2)*100)
			}
		default:
			wantUnavailable(t, fmt.Sprintf("update %d in the batch", i), o.r)
			if b.AmountMinor != 100 || b.Version != 1 {
				t.Errorf("update %d answered %d: got amount %d version %d stored, want it unchanged", i, o.r.status, b.AmountMinor, b.Version)
			}
		}
	}
	t.Logf("in the batch with failing creates, %d of %d updates were applied", applied, len(updates))
	if n := e.countButtons(); n != before {
		t.Errorf("got %d buttons after the failed creates, want %d", n, before)
	}

	maxPages(1 << 30)
	id := e.create(e.key, bigCreate)
	if b, err := e.stored("acme", id); err != nil || b.Description != big {
		t.Errorf("create after the disk has room: got %d characters of description (%v), want %d", len(b.Description), err, len(big))
	}
	e.do("POST", "/product-payment/update/"+ids[0], e.key, fmt.Sprintf(`{"description":%q}`, big)).want(t, 200, "")
	wantFreshAfterFault(t, e, bigCreate, "full-create")
}

// TestSlowHeaderSenderIsDropped sends request headers a byte every 200 ms:
// the header timeout (5 s) closes the connection, while other clients are
// served as usual.
func TestSlowHeaderSenderIsDropped(t *testing.T) {
	longTests(t) // waits out the 5 s header timeout
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "slow.db"))
	addr, key := strings.TrimPrefix(srv.url, "http://"), srv.mintedKey()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	type closed struct {
		got []byte
		at  time.Duration
	}
	closedCh := make(chan closed, 1)
	go func() {
		got, _ := io.ReadAll(conn) // until the server closes the connection
		closedCh <- closed{got, time.Since(start)}
	}()
	// Another client is served as usual meanwhile.
	served := make(chan error, 1)
	go func() {
		client := newTestClient()
		defer client.CloseIdleConnections()
		r, err := callAPI(client, "POST", "http://"+addr+"/product-payment/create", key, createBody(nil))
		if err == nil && r.status != 200 {
			err = fmt.Errorf("got %v, want 200", r)
		}
		served <- err
	}()
	header := "GET /product-payment/get/btn_01JD0000000000000000000000 HTTP/1.1\r\nHost: " + addr +
		"\r\nX-API-KEY: " + key + "\r\nX-Padding: " + strings.Repeat("a", 200)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case c := <-closedCh:
			if c.at < 4*time.Second || c.at > 8*time.Second {
				t.Errorf("got the connection closed after %v, want about 5 s (the header timeout)", c.at)
			}
			// net/http itself may answer a plain-text 400 before closing;
			// no handler ever ran.
			if len(c.got) > 0 && !bytes.HasPrefix(c.got, []byte("HTTP/1.1 4")) {
				t.Errorf("got %q on the slow connection, want it closed, at most with a 4xx", c.got)
			}
			if err := <-served; err != nil {
				t.Errorf("create while a slow client sends headers: %v", err)
			}
			return
		case <-tick.C:
		}
		if i >= len(header) || time.Since(start) > 15*time.Second {
			t.Fatalf("connection still open after %v of slow headers", time.Since(start))
		}
		conn.Write([]byte{header[i]}) // fails once the server has closed; the reader reports that
	}
}

// TestHugeBodyIsRefusedUnread streams a 10 MB body, announced with
// Content-Length or chunked: the server answers 413 payload_too_large long
// before the client has sent it all, stores nothing and closes the
// connection without reading the rest.
func TestHugeBodyIsRefusedUnread(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "huge.db")
	srv := startRun(t, "-db", dbPath)
	addr, key := strings.TrimPrefix(srv.url, "http://"), srv.mintedKey()
	const total = 10 << 20
	for _, chunked := range []bool{false, true} {
		name := map[bool]string{false: "content-length", true: "chunked"}[chunked]
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			framing := fmt.Sprintf("Content-Length: %d", total)
			if chunked {
				framing = "Transfer-Encoding: chunked"
			}
			fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: %s\r\nX-API-KEY: %s\r\n"+
				"Content-Type: application/json\r\n%s\r\n\r\n", addr, key, framing)
			type answer struct {
				status int
				body   []byte
				err    error
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					answered <- answer{err: err}
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				answered <- answer{resp.StatusCode, body, err}
			}()

			// 32 KiB every 10 ms: a server that read all 10 MB before
			// answering would answer after some 3 s, not after a few chunks.
			chunk := bytes.Repeat([]byte("a"), 32<<10)
			if chunked {
				chunk = append(append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), chunk...), "\r\n"...)
			}
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			sent, sentAtAnswer := 0, -1
			var writeErr error
			for sent < total && writeErr == nil {
				select {
				case a := <-answered:
					sentAtAnswer = sent
					if a.err != nil {
						t.Fatalf("no answer: %v", a.err)
					}
					var r response
					r.status, r.raw = a.status, a.body
					if err := json.Unmarshal(a.body, &r.env); err != nil || r.status != 413 || r.env.IsSuccess || r.env.Code != "payload_too_large" {
						t.Errorf("got %v (%v), want 413 payload_too_large", r, err)
					}
				case <-tick.C:
				}
				_, writeErr = conn.Write(chunk)
				sent += 32 << 10
			}
			switch {
			case sentAtAnswer < 0:
				t.Fatalf("no answer after sending %d bytes (write error %v)", sent, writeErr)
			case sentAtAnswer > total/2:
				t.Errorf("got the answer after %d bytes of the body, want it far sooner", sentAtAnswer)
			case writeErr == nil:
				t.Errorf("the server read all %d bytes after answering 413, want the connection closed", total)
			}
			t.Logf("answered after %d KiB; the connection failed after %d KiB: %v", sentAtAnswer>>10, sent>>10, writeErr)
		})
	}
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM buttons`).Scan(&n); err != nil || n != 0 {
		t.Errorf("got %d buttons (%v) after refused bodies, want 0", n, err)
	}
}
