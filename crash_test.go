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

// A server killed amid writes (3 times; 20 with PAYBUTTONS_LONG_TESTS=1), then stopped by SIGTERM
// during a create, loses no answered write and applies none in part; it never stops by itself.
func TestCrashKeepsAnsweredWrites(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no SIGTERM to send")
	}
	t.Parallel()
	cycles, db := map[bool]int{false: 3, true: 20}[os.Getenv("PAYBUTTONS_LONG_TESTS") == "1"],
		t.TempDir()+"/crash.db"
	key, _, _ := runCLI(t, nil, 0, "keys", "create", "-account", "acme", "-db", db)
	key = strings.TrimSpace(key)
	// Six workers; each button is one worker's, which alone writes it, so what it knows is exact.
	mine := make([][]*crashButton, 6)
	for cycle := 0; cycle <= cycles; cycle++ {
		c := startChild(t, db)
		checkCrash(t, db, mine, fmt.Sprint("after start ", cycle))
		var acked atomic.Int64
		var stopped atomic.Bool // from here on, a write may get no answer
		var wg sync.WaitGroup
		client := &http.Client{Timeout: 20 * time.Second}
		for w := range mine {
			tag := fmt.Sprint(cycle, "-", w)
			wg.Go(func() {
				mine[w] = crashWorker(t, client, c.url, key, tag, mine[w], &acked, &stopped)
			})
		}
		// The stop comes after a random number of answers, with other writes in flight.
		target := 5 + rand.Int64N(150)
		reached := awaitTrue(func() bool { return acked.Load() >= target || c.gone.Load() })
		require(t, reached && !c.gone.Load(), "the server exited or stopped answering by itself "+
			"before %d answers:\n%s", target, c.output())
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
		wal, _ := os.ReadFile(db + "-wal") // check reads what the server left, and changes none
		out, _, _ := runCLI(t, nil, 0, "check", "-db", db)
		walAfter, _ := os.ReadFile(db + "-wal")
		expect(t, out == "ok\n" && len(wal) > 0 && bytes.Equal(wal, walAfter),
			"after SIGKILL: check %q, WAL kept %v", out, bytes.Equal(wal, walAfter))
	}
}

// stopDuringCreate sends SIGTERM while a create waits for its body, and the body once the server
// is shutting down: the create must be answered and stored, and the server exit 0.
func stopDuringCreate(t *testing.T, c *child, key string) *crashButton {
	body := createBody(m{"description": "in flight", "amount": "1"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	require(t, err == nil, "%v", err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, len(body))
	reader := bufio.NewReader(conn)
	resp, err := http.ReadResponse(reader, nil)
	require(t, err == nil && resp.StatusCode == 100, "Expect: 100-continue: got %v (%v)", resp, err)
	c.cmd.Process.Signal(syscall.SIGTERM)
	stopping := awaitTrue(func() bool { return strings.Contains(c.output(), `"shutting down"`) })
	require(t, stopping, "no shutting down within 20 s of SIGTERM:\n%s", c.output())
	fmt.Fprint(conn, body)
	resp, err = http.ReadResponse(reader, nil)
	require(t, err == nil, "the create at SIGTERM: %v", err)
	raw, err := io.ReadAll(resp.Body)
	created := regexp.MustCompile(`^\{"isSuccess":true,"data":"btn_\w+","message":"created"}$`)
	require(t, err == nil && created.Match(raw), "the create at SIGTERM: got %s (%v)", raw, err)
	require(t, awaitTrue(c.gone.Load), "the server still runs 20 s after SIGTERM")
	status := c.cmd.ProcessState.ExitCode()
	expect(t, status == 0, "after SIGTERM: got exit status %d, want 0:\n%s", status, c.output())
	return &crashButton{desc: "in flight", version: 1}
}

// crashButton is a button as its last answered write left it. A create makes version 1, amount
// 1.00; each update adds one to both, so an amount that is not the version was written in part.
type crashButton struct {
	desc, id string // desc, the button's description, is its own
	version  int64  // 0: its create got no answer
	pending  bool   // its last write got no answer: it may have version+1
}

// crashWorker creates and updates its buttons until a write gets no answer (a stopped server's).
func crashWorker(t *testing.T, client *http.Client, url, key, tag string, mine []*crashButton,
	acked *atomic.Int64, stopped *atomic.Bool) []*crashButton {
	for seq := 0; ; seq++ {
		b, path := &crashButton{desc: fmt.Sprint(tag, "-", seq)}, "create"
		body := createBody(m{"description": b.desc, "amount": "1"})
		if len(mine) > 0 && rand.IntN(3) > 0 {
			b = mine[rand.IntN(len(mine))]
			path, body = "update/"+b.id, fmt.Sprintf(`{"amount":"%d"}`, b.version+1)
		} else {
			mine = append(mine, b)
		}
		r, err := callAPI(client, "POST", url+"/product-payment/"+path, key, body)
		msg := map[bool]string{true: "created", false: "updated"}[b.version == 0]
		want := fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`, cmp.Or(b.id, r.id), msg)
		if err != nil || string(r.raw) != want || !validButtonID(r.id) {
			if r.status != 0 || !stopped.Load() { // a wrong answer; or none, from a running server
				t.Errorf("%s: got %d %s (%v), want %s", r.request, r.status, r.raw, err, want)
			}
			b.pending = true
			return mine
		}
		b.id, b.version = r.id, b.version+1
		acked.Add(1)
	}
}

// checkCrash checks the file is sound, each button is as its last answered write or its unanswered
// one left it, whole, and nothing else is stored. It leaves each worker its stored buttons.
func checkCrash(t *testing.T, path string, mine [][]*crashButton, when string) {
	t.Helper()
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro"))
	defer db.Close()
	var integrity string
	err := db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity)
	require(t, err == nil && integrity == "ok", "%s: integrity: got %q (%v)", when, integrity, err)
	var text []byte
	var all []button
	err = db.QueryRow(`SELECT json_group_array(json(button)) FROM buttons`).Scan(&text)
	require(t, err == nil && json.Unmarshal(text, &all) == nil, "%s: read: %v", when, err)
	stored := map[string]button{}
	for _, b := range all {
		stored[*b.Description] = b
	}
	for w, buttons := range mine {
		mine[w] = nil
		for _, b := range buttons {
			got, found := stored[b.desc]
			delete(stored, b.desc)
			whole := got.Amount == fmt.Sprintf("%d.00", got.Version)
			if !found && b.version == 0 || found && whole && (got.Version == b.version ||
				b.pending && got.Version == b.version+1) {
				b.id, b.version, b.pending = got.ID, got.Version, false
			} else {
				t.Errorf("%s: button %s: got %s, want %+v", when, b.desc, jsonOf(got), *b)
			}
			if found {
				mine[w] = append(mine[w], b)
			}
		}
	}
	expect(t, len(stored) == 0, "%s: got buttons %v no write made", when, stored)
}
