package main

// Faults the server survives without a restart, and what /healthz says of them: the database busy past its timeout, a
// full disk, a removed WAL, a damaged file; clients that fail to authenticate, hold connections, or send too slowly or
// too much.

import (
	"bufio"
	"bytes"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// wantUnavailable checks a 503 unavailable with data "" and a Retry-After of a positive number of seconds.
func wantUnavailable(t *testing.T, r response) {
	t.Helper()
	r.want(t, 503, "unavailable")
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || string(r.env.Data) != `""` {
		t.Errorf("%s: got Retry-After %q and data %s, want a positive number of seconds and \"\"",
			r.request, r.header.Get("Retry-After"), r.env.Data)
	}
}

// --- the database ---

// /healthz answers 200, and 503 once a table it reads is gone or the database does not answer.
func TestHealthz(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"api_keys", "buttons", "button_history", "idempotency_keys", "change_counter", ""} {
		e := newTestServer(t)
		e.do("GET", "/healthz", "", "").want(t, 200, "")
		if table == "" {
			e.store.health.Close() // its connections closed: the database no longer answers
		} else {
			e.exec("DROP TABLE " + table)
		}
		r := e.do("GET", "/healthz", "", "")
		if wantUnavailable(t, r); r.env.Message != "the database does not answer or refuses writes" {
			t.Errorf("%q dropped: got message %q, want the database does not answer or refuses writes", table,
				r.env.Message)
		}
	}
}

// A write lock held past busy_timeout makes writes a 503 that stores nothing, while reads and /healthz answer.
func TestBusyDatabaseAnswersUnavailable(t *testing.T) {
	longTests(t) // waits out the 5 s busy timeout, which the contract sets
	t.Parallel()
	e := newTestServer(t)
	// This also records the key's last use, so that no background write of it joins the create below.
	first := e.create(e.key, createBody(nil))
	other, _ := sql.Open("sqlite", e.dbPath+"?_pragma=busy_timeout(5000)")
	defer other.Close()
	lock, err := other.Begin()
	if err == nil {
		_, err = lock.Exec(`UPDATE buttons SET product_name = 'held' WHERE id = ?`, first)
	}
	if err != nil {
		t.Fatal(err)
	}
	e.getView(e.key, first) // reads do not wait behind the lock
	blocked := createBody(m{"productName": "Blocked"})
	wantUnavailable(t, e.do("POST", "/product-payment/create", e.key, blocked, "Idempotency-Key", "busy-create"))
	e.do("GET", "/healthz", "", "").want(t, 200, "") // another process writing is no fault
	if n := e.countButtons(); n != 1 {
		t.Errorf("got %d buttons after the 503, want 1", n)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/product-payment/create", e.key, blocked, "Idempotency-Key", "busy-create") // the 503 not kept
	if r.want(t, 200, ""); e.mustStored("acme", r.dataString()).ProductName != "Blocked" {
		t.Errorf("create after the lock was released: got %s, want it stored", r.raw)
	}
	if b := e.mustStored("acme", first); b.ProductName != "Pro plan" {
		t.Errorf("got productName %q, want the other connection's rolled-back write gone", b.ProductName)
	}
}

// On a full database (max_page_count) writes answer 503 saying the disk is full and change nothing: a batch fails as
// a unit with the answers rendered in it. Writes succeed once there is room, and a 503 is not kept for a retry.
func TestFullDatabaseAnswersUnavailable(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	ids := make([]string, 5)
	for i := range ids {
		ids[i] = e.create(e.key, createBody(m{"amount": "1.00"}))
	}
	if free := e.count(`PRAGMA freelist_count`); free != 0 {
		t.Fatalf("got %d free pages: the test needs none, so that every new row must grow the file", free)
	}
	// A pragma of the connection: e.exec runs it on the writer's, the one every write uses.
	e.exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, e.count(`PRAGMA page_count`)))
	big := strings.Repeat("é", 5000) // 10 KB: needs new overflow pages
	bigCreate := createBody(m{"description": big})
	// One batch of updates that fit in the pages the file has, then creates that do not: none may be answered 200
	// unless it is stored. The writer is held so that every request queues behind it, in the order sent; the pauses
	// only make that order likelier, and the checks hold whatever it is.
	release := holdWriter(e.store)
	creates, updates := make([]response, 3), make([]response, len(ids))
	var wg sync.WaitGroup
	for i := range updates {
		wg.Go(func() { // with a key: its answer, rendered in the batch, must go with it
			updates[i], _ = callAPI(http.DefaultClient, "POST", e.url+"/product-payment/update/"+ids[i], e.key,
				fmt.Sprintf(`{"amount":"%d.00"}`, i+2), "Idempotency-Key", ids[i])
		})
	}
	time.Sleep(100 * time.Millisecond)
	for i := range creates {
		wg.Go(func() {
			creates[i], _ = callAPI(http.DefaultClient, "POST", e.url+"/product-payment/create", e.key, bigCreate,
				"Idempotency-Key", fmt.Sprint("full-", i))
		})
	}
	time.Sleep(100 * time.Millisecond)
	release()
	wg.Wait()
	for _, r := range creates {
		if wantUnavailable(t, r); !strings.Contains(r.env.Message, "disk is full") {
			t.Errorf("%s: got %q on a full disk, want it to say the disk is full", r.request, r.env.Message)
		}
	}
	for i, r := range updates {
		b, want := e.mustStored("acme", ids[i]), button{AmountMinor: 100, Version: 1}
		if r.status == 200 {
			want = button{AmountMinor: int64(i+2) * 100, Version: 2}
		} else {
			wantUnavailable(t, r)
		}
		if b.AmountMinor != want.AmountMinor || b.Version != want.Version {
			t.Errorf("%s answered %d: got amount %d version %d stored, want %d version %d",
				r.request, r.status, b.AmountMinor, b.Version, want.AmountMinor, want.Version)
		}
	}
	if n := e.countButtons(); n != len(ids) {
		t.Errorf("got %d buttons after the failed creates, want %d", n, len(ids))
	}
	e.exec(`PRAGMA max_page_count = 1073741824`)
	r := e.do("POST", "/product-payment/create", e.key, bigCreate, "Idempotency-Key", "full-0") // the 503 not kept
	if r.want(t, 200, ""); e.mustStored("acme", r.dataString()).Description != big {
		t.Errorf("create once there is room: got it stored without its description")
	}
}

// On a real full disk (a small tmpfs) writes and /healthz answer 503; once a file is removed /healthz answers 200
// again, and every create answered before is there.
func TestFullDiskTurnsHealthzUnavailableUntilThereIsRoom(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("a real full disk needs root on Linux, to mount a small tmpfs")
	}
	t.Parallel()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	e := &testEnv{t: t, dbPath: filepath.Join(dir, "full.db")}
	var err error
	if e.store, err = openStore(e.dbPath); err != nil {
		t.Fatal(err)
	}
	e.key, _ = e.mintKey("acme", false)
	e.url = serveStore(t, e.store, config{providerName: "the service"})
	for range 5 {
		e.create(e.key, createBody(nil))
	}
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); err == nil; { // to the last byte: a short write fills what is left
		_, err = filler.Write(chunk)
	}
	filler.Close()
	r := e.do("POST", "/product-payment/create", e.key, createBody(nil))
	if wantUnavailable(t, r); !strings.Contains(r.env.Message, "disk is full") {
		t.Errorf("got %q on a full disk, want it to say the disk is full", r.env.Message)
	}
	for range 2 { // it stays so: /healthz tries a write each time
		wantUnavailable(t, e.do("GET", "/healthz", "", ""))
	}
	os.Remove(filler.Name())
	e.do("GET", "/healthz", "", "").want(t, 200, "")
	if e.create(e.key, createBody(nil)); e.countButtons() != 6 {
		t.Errorf("got %d buttons, want the 6 creates answered 200", e.countButtons())
	}
}

// Once SQLite finds the file damaged (SQLITE_CORRUPT), /healthz answers 503 and every write is refused, for good: even
// once the damage is gone, the file must be checked before a server trusts it again.
func TestDamagedFileTurnsHealthzUnavailableForGood(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	id := e.create(e.key, createBody(nil))
	db, _ := sql.Open("sqlite", e.dbPath)
	defer db.Close()
	// The index only list reads, moved from the WAL into the file, is overwritten.
	var root, pageSize int64
	err := db.QueryRow(`SELECT rootpage, (SELECT page_size FROM pragma_page_size) FROM sqlite_master
		WHERE name = 'buttons_by_state'`).Scan(&root, &pageSize)
	for busy, deadline := 1, time.Now().Add(5*time.Second); err == nil && busy != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the WAL could not be checkpointed in 5 s")
		}
		err = db.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, new(int), new(int))
	}
	file, _ := os.OpenFile(e.dbPath, os.O_RDWR, 0)
	defer file.Close()
	page, at := make([]byte, pageSize), (root-1)*pageSize
	if _, err := file.ReadAt(page, at); err != nil {
		t.Fatal(err)
	}
	file.WriteAt(bytes.Repeat([]byte{0xff}, int(pageSize)), at)
	e.do("GET", "/healthz", "", "").want(t, 200, "") // it does not read that index
	wantUnavailable(t, e.do("GET", "/product-payment/list", e.key, ""))
	file.WriteAt(page, at) // repaired: every query would succeed again
	wantUnavailable(t, e.do("GET", "/healthz", "", ""))
	wantUnavailable(t, e.do("POST", "/product-payment/create", e.key, createBody(nil)))
	e.getView(e.key, id) // reads that succeed still answer
	if n := e.countButtons(); n != 1 {
		t.Errorf("got %d buttons, want the 1 created before the damage", n)
	}
}

// With its -wal file removed a server would lose every write acknowledged after: writes and /healthz answer 503, an
// ERROR line says to stop with SIGTERM, whose checkpoint saves what was written.
func TestRemovedWALRefusesWritesAndSIGTERMSavesThem(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "wal.db")
	key := mintKeyCLI(t, dbPath, "acme")
	child, client := startChild(t, dbPath), newTestClient()
	saved, err := callAPI(client, "POST", child.url+"/product-payment/create", key, createBody(nil))
	if err != nil || saved.status != 200 {
		t.Fatalf("create: got %v (%v)", saved.status, err)
	}
	if err := os.Remove(dbPath + "-wal"); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"POST /product-payment/create", "GET /healthz"} {
		method, path, _ := strings.Cut(path, " ")
		if r, err := callAPI(client, method, child.url+path, key, createBody(nil)); err != nil || r.status != 503 {
			t.Errorf("%s after the WAL was removed: got %v %s (%v), want 503", r.request, r.status, r.raw, err)
		}
	}
	child.cmd.Process.Signal(syscall.SIGTERM)
	<-child.done
	if logs := child.log.String(); !regexp.MustCompile(`level=ERROR .*Stop the server with SIGTERM`).MatchString(logs) {
		t.Errorf("got logs without an ERROR line saying to stop with SIGTERM:\n%s", logs)
	}
	get := startChild(t, dbPath).url + "/product-payment/get/" + saved.dataString()
	if r, err := callAPI(client, "GET", get, key, ""); err != nil || r.status != 200 {
		t.Errorf("the create answered before the WAL went, after SIGTERM and a restart: got %v (%v)", r.status, err)
	}
}

// --- clients ---

// Failed authentication is limited per client address: past a burst of 100, a request without a valid key gets 429 at
// once; a valid key keeps working from that address.
func TestFailedAuthenticationIsLimited(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	r, failed := response{status: 401}, -1
	var took time.Duration
	for ; failed < 200 && r.status == 401; failed++ {
		start := time.Now()
		r, took = e.do("GET", "/product-payment/list", fmt.Sprint("pbk_wrong", failed), ""), time.Since(start)
	}
	if failed < 100 || r.status != 429 || r.header.Get("Retry-After") != "1" || took > 500*time.Millisecond {
		t.Errorf("unknown keys: got %d 401s, then %d with Retry-After %q after %v; want 100 or more, then 429 at once",
			failed, r.status, r.header.Get("Retry-After"), took)
	}
	e.do("GET", "/product-payment/list", e.key, "").want(t, 200, "") // the same address, a valid key
}

// rawConn is a client's connection, written and read by hand.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(15 * time.Second))
	return rawConn{c, bufio.NewReader(c)}
}

// roundTrip sends request and reads the answer's status and body; status -1 if there is none.
func (c rawConn) roundTrip(request string) (status int, header http.Header, body []byte) {
	fmt.Fprint(c, request)
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return -1, nil, nil
	}
	if resp.ContentLength >= 0 { // else it ends when the server closes the connection
		body, _ = io.ReadAll(resp.Body)
	}
	return resp.StatusCode, resp.Header, body
}

// At the -max-conns cap an idle keep-alive connection is closed to let a new client in within a second; a connection
// with a request in progress is never cut; with none idle, a new connection is closed at once.
func TestConnectionCapMakesRoomFromIdleConnections(t *testing.T) {
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "conns.db"), "-max-conns", "2")
	addr, healthz := strings.TrimPrefix(srv.url, "http://"), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	// A create whose body is held back: its handler runs and waits for it, as the 100 Continue says.
	body := createBody(nil)
	held := fmt.Sprintf("POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", srv.mintedKey(), len(body))
	busy, idle := dialRaw(t, addr), dialRaw(t, addr)
	if status, _, _ := busy.roundTrip(held); status != 100 {
		t.Fatalf("a create with Expect: 100-continue: got %d, want 100", status)
	}
	if status, _, _ := idle.roundTrip(healthz); status != 200 {
		t.Fatalf("healthz: got %d, want 200", status)
	}
	// The idle one may not be marked idle yet when its answer arrives: the newcomer tries until a second has passed.
	var newcomer rawConn
	for status, start := 0, time.Now(); status != 200; status, _, _ = newcomer.roundTrip(healthz) {
		if time.Since(start) > time.Second {
			t.Fatalf("a new client at the cap with an idle connection open: got %d for a second, want 200", status)
		}
		newcomer = dialRaw(t, addr)
	}
	if _, err := idle.r.ReadByte(); err != io.EOF {
		t.Errorf("the idle connection: got %v, want it closed (EOF)", err)
	}
	if status, _, _ := newcomer.roundTrip(held); status != 100 {
		t.Fatalf("a second held create: got %d, want 100", status)
	}
	refused := dialRaw(t, addr)
	refused.SetDeadline(time.Now().Add(time.Second))
	if n, err := refused.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("a connection at the cap with none idle: got %d bytes, %v, want it closed at once", n, err)
	}
	for _, c := range []rawConn{busy, newcomer} { // their requests were in progress: they are answered
		if status, _, _ := c.roundTrip(body); status != 200 {
			t.Errorf("a create in progress at the cap: got %d, want 200", status)
		}
	}
}

// What only the real http.Server sees: headers of 16 KiB are read and 16 KiB + 1 byte is a 431; OPTIONS * is answered
// with the envelope and the usual headers, like any path.
func TestHeaderLimitAndOptionsStar(t *testing.T) {
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "headers.db"))
	head := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: "
	for _, tt := range []struct {
		request string
		status  int
		want    string // in the body
	}{
		{head + strings.Repeat("a", 16<<10-len(head)-4) + "\r\n\r\n", 200, `"isSuccess":true`},
		{head + strings.Repeat("a", 16<<10+1-len(head)-4) + "\r\n\r\n", 431, ""},
		{"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 404, `"code":"not_found"`},
	} {
		status, header, body := dialRaw(t, strings.TrimPrefix(srv.url, "http://")).roundTrip(tt.request)
		if status != tt.status || !strings.Contains(string(body), tt.want) ||
			status != 431 && header.Get("X-Request-Id") == "" {
			t.Errorf("%.20q (%d bytes): got %d %s, want %d with %s and an X-Request-Id", tt.request, len(tt.request),
				status, body, tt.status, tt.want)
		}
	}
}

// Headers sent a byte every 200 ms are cut off by the 5 s header timeout; other clients are served.
func TestSlowHeaderSenderIsDropped(t *testing.T) {
	longTests(t) // waits out the 5 s header timeout, which the contract sets
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "slow.db"))
	conn, start, closed := dialRaw(t, strings.TrimPrefix(srv.url, "http://")), time.Now(), make(chan []byte, 1)
	go func() {
		got, _ := io.ReadAll(conn) // until the server closes the connection
		closed <- got
	}()
	header := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + strings.Repeat("a", 200)
	for i := 0; i < len(header); i++ {
		select {
		case got := <-closed:
			if at := time.Since(start); at < 4*time.Second || at > 8*time.Second {
				t.Errorf("got the connection closed after %v, want about 5 s (the header timeout)", at)
			}
			// net/http itself may answer a plain-text 400 before closing; no handler ever ran.
			if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 4")) {
				t.Errorf("got %q on the slow connection, want it closed, at most with a 4xx", got)
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
		conn.Write([]byte{header[i]}) // fails once the server has closed; the reader reports that
		if i == 5 {
			r, err := callAPI(http.DefaultClient, "POST", srv.url+"/product-payment/create", srv.mintedKey(),
				createBody(nil))
			if err != nil || r.status != 200 {
				t.Errorf("create while a slow client sends headers: got %d (%v), want 200", r.status, err)
			}
		}
	}
	t.Fatalf("connection still open after %v of slow headers", time.Since(start))
}

// A 10 MB body is a 413 long before it is all sent: nothing stored, the rest never read.
func TestHugeBodyIsRefusedUnread(t *testing.T) {
	t.Parallel()
	srv := startRun(t, "-db", filepath.Join(t.TempDir(), "huge.db"))
	addr, key := strings.TrimPrefix(srv.url, "http://"), srv.mintedKey()
	const total = 10 << 20
	for _, framing := range []string{fmt.Sprintf("Content-Length: %d", total), "Transfer-Encoding: chunked"} {
		t.Run(framing, func(t *testing.T) {
			t.Parallel()
			conn, answered := dialRaw(t, addr), make(chan int, 1)
			fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n"+
				"Content-Type: application/json\r\n%s\r\n\r\n", key, framing)
			go func() {
				status, _, _ := conn.roundTrip("")
				answered <- status
			}()
			// 32 KiB every 5 ms: a server that read all 10 MB before answering would answer after some 1.6 s, not
			// after a few chunks.
			chunk := bytes.Repeat([]byte("a"), 32<<10)
			if strings.HasPrefix(framing, "Transfer-Encoding") {
				chunk = append(append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), chunk...), "\r\n"...)
			}
			sent, sentAtAnswer, status := 0, -1, 0
			var writeErr error
			for ; sent < total && writeErr == nil; sent += 32 << 10 {
				select {
				case status = <-answered:
					sentAtAnswer = sent
				case <-time.After(5 * time.Millisecond):
				}
				_, writeErr = conn.Write(chunk)
			}
			switch {
			case sentAtAnswer < 0 || status != 413:
				t.Errorf("got %d after sending %d bytes (write error %v), want 413", status, sent, writeErr)
			case sentAtAnswer > total/2:
				t.Errorf("got the answer after %d bytes of the body, want it far sooner", sentAtAnswer)
			case writeErr == nil:
				t.Errorf("the server read all %d bytes after answering 413, want the connection closed", total)
			}
		})
	}
	t.Cleanup(func() { // after the subtests
		r, err := callAPI(http.DefaultClient, "GET", srv.url+"/product-payment/list?state=all", key, "")
		if err != nil || !strings.Contains(string(r.env.Data), `"items":[]`) {
			t.Errorf("got %s (%v) after refused bodies, want no button", r.env.Data, err)
		}
	})
}
