package main

import (
	"bufio"
	"bytes"
	"cmp"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A server killed amid writes (3 times; 20 with PAYBUTTONS_LONG_TESTS=1), then stopped, loses no answer.
// Only the kill may stop it: a server that exits or stops answering by itself fails the test.
func TestCrashKeepsAnsweredWrites(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no SIGTERM to send")
	}
	t.Parallel()
	cycles, db := 3, t.TempDir()+"/crash.db"
	if os.Getenv("PAYBUTTONS_LONG_TESTS") == "1" {
		cycles = 20
	}
	key, _, _ := runCLI(t, nil, 0, "keys", "create", "-account", "acme", "-db", db)
	key = strings.TrimSpace(key)
	// Six workers; each button is one worker's, which alone writes it: what the worker knows of it is exact.
	mine := make([][]*crashButton, 6)
	for cycle := 0; cycle <= cycles; cycle++ {
		c := startChild(t, db)
		checkCrash(t, db, mine, fmt.Sprint("after start ", cycle))
		var acked atomic.Int64
		var stopped atomic.Bool // from here on, a write may get no answer
		var wg sync.WaitGroup
		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 9}}
		for w := range mine {
			tag := fmt.Sprint(cycle, "-", w)
			wg.Go(func() { mine[w] = crashWorker(t, client, c.url, key, tag, mine[w], &acked, &stopped) })
		}
		// The stop comes after a random number of answered writes, with others in flight at any step.
		target := 5 + rand.Int64N(150)
		reached := awaitTrue(func() bool { return acked.Load() >= target || c.gone.Load() })
		require(t, reached && !c.gone.Load(), "the server exited or stopped answering by itself before "+
			"%d answers:\n%s", target, c.output())
		stopped.Store(true)
		if cycle == cycles {
			inFlight := stopDuringCreate(t, c, key)
			wg.Wait()
			checkCrash(t, db, append(mine, []*crashButton{inFlight}), "after SIGTERM")
			return
		}
		c.cmd.Process.Kill()
		require(t, awaitTrue(c.gone.Load), "the server still runs 20 s after its SIGKILL")
		wg.Wait()
		wal, err := os.ReadFile(db + "-wal") // check reads what the server left, and changes none of it
		out, _, _ := runCLI(t, nil, 0, "check", "-db", db)
		walAfter, err2 := os.ReadFile(db + "-wal")
		expect(t, out == "ok\n" && bytes.Equal(wal, walAfter) && cmp.Or(err, err2) == nil,
			"after SIGKILL: check %q, WAL kept %v (%v)", out, bytes.Equal(wal, walAfter), cmp.Or(err, err2))
	}
}

// stopDuringCreate sends SIGTERM while a create waits for its body, and the body once the server is
// shutting down: the create must be answered and stored, and the server exit 0.
func stopDuringCreate(t *testing.T, c *child, key string) *crashButton {
	body := createBody(m{"description": "in flight", "amount": "1.00"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	require(t, err == nil, "%v", err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, len(body))
	reader := bufio.NewReader(conn)
	resp, err := http.ReadResponse(reader, nil)
	require(t, err == nil && resp.StatusCode == 100, "Expect: 100-continue: got %v (%v), want 100", resp, err)
	c.cmd.Process.Signal(syscall.SIGTERM)
	stopping := awaitTrue(func() bool { return strings.Contains(c.output(), `msg="shutting down"`) })
	require(t, stopping, "no shutting down within 20 s of SIGTERM:\n%s", c.output())
	fmt.Fprint(conn, body)
	var raw []byte
	resp, err = http.ReadResponse(reader, nil)
	if err == nil {
		raw, err = io.ReadAll(resp.Body)
	}
	id := regexp.MustCompile(`^\{"isSuccess":true,"data":"(btn_\w+)","message":"created"}$`).FindSubmatch(raw)
	require(t, err == nil && resp.StatusCode == 200 && id != nil, "the create in flight at SIGTERM: got %s "+
		"(%v), want 200 created", raw, err)
	require(t, awaitTrue(c.gone.Load), "the server still runs 20 s after SIGTERM")
	status := c.cmd.ProcessState.ExitCode()
	expect(t, status == 0, "after SIGTERM: got exit status %d, want 0; output:\n%s", status, c.output())
	return &crashButton{id: string(id[1]), desc: "in flight", state: "active", amount: 100, version: 1}
}

// crashButton is a button as its last answered write left it (version 0: none), or as pending would.
type crashButton struct {
	id, desc, state string // desc, the button's description, is its own
	amount, version int64  // amount in USD cents
	pending         *crashButton
}

// crashWorker writes its buttons until a write gets no answer, which only a stopped server may leave.
func crashWorker(t *testing.T, client *http.Client, url, key, tag string, mine []*crashButton,
	acked *atomic.Int64, stopped *atomic.Bool) []*crashButton {
	for seq := 0; ; seq++ {
		b, amount := &crashButton{desc: fmt.Sprint(tag, "-", seq)}, 100+rand.Int64N(1_000_000)
		next, message := crashButton{desc: b.desc, state: "active", amount: amount}, "created"
		method, path, body := "POST", "create", createBody(m{"description": b.desc, "amount": cents(amount)})
		if len(mine) > 0 && rand.IntN(3) > 0 { // a write of one of its buttons
			b = mine[rand.IntN(len(mine))]
			next, body = *b, fmt.Sprintf(`{"amount":%q}`, cents(amount))
			switch {
			case b.state == "deleted":
				path, message, next.state = "restore/"+b.id, "restored", "active"
			case rand.IntN(6) == 0:
				method, path, message, next.state = "DELETE", "delete/"+b.id, "deleted", "deleted"
			default:
				path, message, next.amount = "update/"+b.id, "updated", amount
			}
		} else {
			mine = append(mine, b)
		}
		next.version = b.version + 1
		r, err := callAPI(client, method, url+"/product-payment/"+path, key, body)
		next.id = cmp.Or(b.id, r.id)
		want := fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`, next.id, message)
		if err != nil || string(r.raw) != want || !validButtonID(next.id) {
			if r.status != 0 || !stopped.Load() { // a wrong answer; or none, from a running server
				t.Errorf("%s: got %d %s (%v), want %s", r.request, r.status, r.raw, err, want)
			}
			next.id, b.pending = b.id, &next
			return mine
		}
		*b = next
		acked.Add(1)
	}
}

// cents writes an amount of USD cents as the API does: 1234 is "12.34".
func cents(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

// is reports whether got, as stored (found false: not stored), is b.
func (b *crashButton) is(got button, found bool) bool {
	if !found || b.version == 0 {
		return !found && b.version == 0
	}
	return got.ID == cmp.Or(b.id, got.ID) && got.Amount == cents(b.amount) && got.State == b.state &&
		got.Version == b.version && (got.DeletedAt != nil) == (b.state == "deleted")
}

// checkCrash checks the file: it is sound; each button is as its last answered write left it, or as its
// unanswered write would; nothing else is stored. It leaves each worker the buttons stored.
func checkCrash(t *testing.T, path string, mine [][]*crashButton, when string) {
	t.Helper()
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro"))
	defer db.Close()
	var integrity string
	err := db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity)
	require(t, err == nil && integrity == "ok", "%s: integrity_check: got %q (%v)", when, integrity, err)
	rows, err := db.Query(`SELECT button FROM buttons`)
	all, err := collect(rows, err, func(r *sql.Rows) (b button, err error) {
		var text []byte
		if err = r.Scan(&text); err == nil {
			err = json.Unmarshal(text, &b)
		}
		return b, err
	})
	require(t, err == nil, "%s: read the file: %v", when, err)
	stored := map[string]button{}
	for _, b := range all {
		stored[*b.Description] = b
	}
	for w, buttons := range mine {
		mine[w] = nil
		for _, b := range buttons {
			got, found := stored[b.desc]
			delete(stored, b.desc)
			switch {
			case b.is(got, found):
			case b.pending != nil && b.pending.is(got, found): // the write that got no answer, applied whole
				*b = *b.pending
				b.id = got.ID
			default:
				t.Errorf("%s: button %s: got %s, want %+v or %+v", when, b.desc, jsonOf(got), *b, b.pending)
			}
			b.pending = nil
			if found {
				mine[w] = append(mine[w], b)
			}
		}
	}
	expect(t, len(stored) == 0, "%s: got buttons %v no write made", when, stored)
}
