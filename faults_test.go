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

// wantUnavailable checks a 503 unavailable with data "" and a Retry-After of
// a positive number of seconds.
func wantUnavailable(t *testing.T, r response) {
	t.Helper()
	r.want(t, 503, "unavailable")
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || string(r.env.Data) != `""` {
		t.Errorf("%s: got Retry-After %q and data %s, want a positive number of seconds and \"\"",
			r.request, r.header.Get("Retry-After"), r.env.Data)
	}
}

// A write lock held past busy_timeout makes writes a 503 that stores nothing, while reads answer.
func TestBusyDatabaseAnswersUnavailable(t *testing.T) {
	longTests(t) // waits out the 5 s busy timeout
	t.Parallel()
	e := newTestServer(t)
	// This also records the key's last use, so that no background write of
	// it joins the create below.
	first := e.create(e.key, createBody(nil))
	before := e.countButtons()
	other, err := sql.Open("sqlite", e.dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(`UPDATE buttons SET product_name = 'held' WHERE id = ?`, first); err != nil {
		t.Fatal(err)
	}
	e.getView(e.key, first) // reads do not wait behind the lock
	blocked := createBody(m{"productName": "Blocked"})
	wantUnavailable(t, e.do("POST", "/product-payment/create", e.key, blocked, "Idempotency-Key", "busy-create"))
	if n := e.countButtons(); n != before {
		t.Errorf("got %d buttons after the 503, want %d", n, before)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	if b := e.mustStored("acme", e.create(e.key, createBody(m{"productName": "After"}))); b.ProductName != "After" {
		t.Errorf("create after the lock was released: got %+v, want it stored", b)
	}
	r := e.sendTwice("POST", "/product-payment/create", blocked, "busy-create") // its 503 was not kept
	r.want(t, 200, "")
	e.mustStored("acme", r.dataString())
	if b := e.mustStored("acme", first); b.ProductName != "Pro plan" {
		t.Errorf("got productName %q, want the other connection's rolled-back write gone", b.ProductName)
	}
}

// On a full disk (max_page_count) writes answer 503 and change nothing, and succeed once there is room.
func TestFullDiskAnswersUnavailable(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	ids := make([]string, 6)
	for i := range ids {
		ids[i] = e.create(e.key, createBody(m{"amount": "1.00"}))
	}
	// max_page_count belongs to a connection: it goes through the writer, so
	// that it reaches the one connection every write uses.
	maxPages := func(n int) {
		t.Helper()
		err := e.store.write(context.Background(), func(tx *writeTx) error {
			_, err := tx.exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, n))
			return err
		})
		if err != nil {
			t.Fatalf("max_page_count = %d: %v", n, err)
		}
	}
	if free := e.count(`PRAGMA freelist_count`); free != 0 {
		t.Fatalf("got %d free pages: the test needs none, so that every new row must grow the file", free)
	}
	maxPages(e.count(`PRAGMA page_count`))

	big := strings.Repeat("é", 5000) // 10 KB: needs new overflow pages
	bigCreate, bigUpdate := createBody(m{"description": big}), fmt.Sprintf(`{"description":%q}`, big)
	before := e.countButtons()
	for _, tt := range []struct {
		path, body string
		headers    []string
	}{
		{"create", bigCreate, nil},
		{"create", bigCreate, []string{"Idempotency-Key", "full-create"}},
		{"update/" + ids[0], bigUpdate, []string{"Idempotency-Key", "full-update"}},
		{"update/" + ids[0], bigUpdate, nil}, // a row that grows
	} {
		r := e.do("POST", "/product-payment/"+tt.path, e.key, tt.body, tt.headers...)
		wantUnavailable(t, r)
		if !strings.Contains(r.env.Message, "disk is full") {
			t.Errorf("got %q on a full disk, want it to say the disk is full", r.env.Message)
		}
	}
	if b := e.mustStored("acme", ids[0]); b.Description != "Monthly access" || b.Version != 1 {
		t.Errorf("after the 503 update got description of %d characters, version %d; want it unchanged, version 1", len(b.Description), b.Version)
	}

	// One batch of updates that fit in the pages the file has, then creates
	// that do not: the batch fails as a unit, so none of them may be answered
	// 200 unless it is stored. The writer is held so that every request
	// queues behind it; a channel's waiting senders are served in order.
	release := holdWriter(e.store)
	creates, updates := make([]response, 3), make([]response, len(ids)-1)
	var wg sync.WaitGroup
	for i := range updates {
		wg.Go(func() {
			updates[i] = e.do("POST", "/product-payment/update/"+ids[i+1], e.key, fmt.Sprintf(`{"amount":"%d.00"}`, i+2),
				"Idempotency-Key", ids[i+1]) // its answer, rendered in the batch, must go with it
		})
	}
	// The pauses only decide the order within the batch, never what the
	// checks accept.
	time.Sleep(200 * time.Millisecond)
	for i := range creates {
		wg.Go(func() { creates[i] = e.do("POST", "/product-payment/create", e.key, bigCreate) })
	}
	time.Sleep(200 * time.Millisecond)
	release()
	wg.Wait()
	for _, r := range creates {
		wantUnavailable(t, r)
	}
	applied := 0
	for i, r := range updates {
		b, want := e.mustStored("acme", ids[i+1]), button{AmountMinor: 100, Version: 1}
		if r.status == 200 {
			applied, want = applied+1, button{AmountMinor: int64(i+2) * 100, Version: 2}
		} else {
			wantUnavailable(t, r)
		}
		if b.AmountMinor != want.AmountMinor || b.Version != want.Version {
			t.Errorf("update %d answered %d: got amount %d version %d stored, want %d version %d",
				i, r.status, b.AmountMinor, b.Version, want.AmountMinor, want.Version)
		}
	}
	t.Logf("in the batch with failing creates, %d of %d updates were applied", applied, len(updates))
	if n := e.countButtons(); n != before {
		t.Errorf("got %d buttons after the failed creates, want %d", n, before)
	}

	maxPages(1 << 30)
	if b := e.mustStored("acme", e.create(e.key, bigCreate)); b.Description != big {
		t.Errorf("create after the disk has room: got %d characters of description, want %d", len(b.Description), len(big))
	}
	e.do("POST", "/product-payment/update/"+ids[0], e.key, bigUpdate).want(t, 200, "")
	r := e.sendTwice("POST", "/product-payment/create", bigCreate, "full-create") // its 503 was not kept
	r.want(t, 200, "")
	e.mustStored("acme", r.dataString())
}

// Headers sent a byte every 200 ms are cut off by the 5 s header timeout; other clients are served.
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
	closed := make(chan []byte, 1)
	go func() {
		got, _ := io.ReadAll(conn) // until the server closes the connection
		closed <- got
	}()
	header := "GET /product-payment/get/btn_01JD0000000000000000000000 HTTP/1.1\r\nHost: " + addr +
		"\r\nX-API-KEY: " + key + "\r\nX-Padding: " + strings.Repeat("a", 200)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case got := <-closed:
			if at := time.Since(start); at < 4*time.Second || at > 8*time.Second {
				t.Errorf("got the connection closed after %v, want about 5 s (the header timeout)", at)
			}
			// net/http itself may answer a plain-text 400 before closing;
			// no handler ever ran.
			if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 4")) {
				t.Errorf("got %q on the slow connection, want it closed, at most with a 4xx", got)
			}
			return
		case <-tick.C:
		}
		if i >= len(header) || time.Since(start) > 15*time.Second {
			t.Fatalf("connection still open after %v of slow headers", time.Since(start))
		}
		conn.Write([]byte{header[i]}) // fails once the server has closed; the reader reports that
		if i == 5 {
			r, err := callAPI(http.DefaultClient, "POST", srv.url+"/product-payment/create", key, createBody(nil))
			if err != nil || r.status != 200 {
				t.Errorf("create while a slow client sends headers: got %d (%v), want 200", r.status, err)
			}
		}
	}
}

// A 10 MB body is a 413 long before it is all sent: nothing stored, the rest never read.
func TestHugeBodyIsRefusedUnread(t *testing.T) {
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "huge.db"))
	addr, key := strings.TrimPrefix(srv.url, "http://"), srv.mintedKey()
	const total = 10 << 20
	for _, framing := range []string{fmt.Sprintf("Content-Length: %d", total), "Transfer-Encoding: chunked"} {
		t.Run(framing, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: %s\r\nX-API-KEY: %s\r\n"+
				"Content-Type: application/json\r\n%s\r\n\r\n", addr, key, framing)
			answered := make(chan response, 1)
			go func() {
				r := response{request: "POST /product-payment/create " + framing}
				if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
					r.status = resp.StatusCode
					r.raw, _ = io.ReadAll(resp.Body)
					json.Unmarshal(r.raw, &r.env)
				}
				answered <- r
			}()
			// 32 KiB every 10 ms: a server that read all 10 MB before
			// answering would answer after some 3 s, not after a few chunks.
			chunk := bytes.Repeat([]byte("a"), 32<<10)
			if strings.HasPrefix(framing, "Transfer-Encoding") {
				chunk = append(append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), chunk...), "\r\n"...)
			}
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			sent, sentAtAnswer := 0, -1
			var writeErr error
			for sent < total && writeErr == nil {
				select {
				case r := <-answered:
					sentAtAnswer = sent
					r.want(t, 413, "payload_too_large")
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
	r, err := callAPI(http.DefaultClient, "GET", srv.url+"/product-payment/list?state=all", key, "")
	if err != nil || !strings.Contains(string(r.env.Data), `"items":[]`) {
		t.Errorf("got %s (%v) after refused bodies, want no button", r.env.Data, err)
	}
}
