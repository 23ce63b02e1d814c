package main

import (
	"bufio"
	"cmp"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestHelperServerProcess is not a test: started by childCommand, it is the program, run with the arguments after "--".
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv("PAYBUTTONS_TEST_CHILD") != "1" {
		t.Skip("the program itself, run as a child process by other tests")
	}
	os.Args = append([]string{"paybuttons"}, os.Args[slices.Index(os.Args, "--")+1:]...)
	main() // which exits with the status of an error
	os.Exit(0)
}

// childCommand is the program with args as a child process, without the caller's PAYBUTTONS_ variables or -race sleep.
func childCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperServerProcess$", "--"}, args...)...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PAYBUTTONS_") }),
		"PAYBUTTONS_TEST_CHILD=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	return cmd
}

// awaitTrue polls cond until it holds, and returns false if it does not within 20 s.
func awaitTrue(cond func() bool) bool {
	for deadline := time.Now().Add(20 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	return cond()
}

// child is `paybuttons serve` as a child process, its output going to the file log.
type child struct {
	cmd      *exec.Cmd
	log, url string
	gone     atomic.Bool // it has exited, and cmd.ProcessState is set
}

func (c *child) output() string { text, _ := os.ReadFile(c.log); return string(text) }

// startChild serves db on 127.0.0.1 in a child process, killed when the test ends, and returns once it listens.
func startChild(t *testing.T, db string) *child {
	t.Helper()
	c := &child{cmd: childCommand("serve", "-addr", "127.0.0.1:0", "-rate", "0", "-db", db), log: t.TempDir() + "/log"}
	out, err := os.Create(c.log)
	if c.cmd.Stdout, c.cmd.Stderr = out, out; err != nil || c.cmd.Start() != nil {
		t.Fatalf("cannot start the server (%v)", err)
	}
	out.Close() // the child has its own
	go func() { c.cmd.Wait(); c.gone.Store(true) }()
	t.Cleanup(func() { c.cmd.Process.Kill(); awaitTrue(c.gone.Load) })
	listening := regexp.MustCompile(`msg=listening url=(\S+) `) // the space after it: the whole port is there
	if !awaitTrue(func() bool { return listening.MatchString(c.output()) || c.gone.Load() }) || c.gone.Load() {
		t.Fatalf("the server exited, or did not listen within 20 s:\n%s", c.output())
	}
	c.url = listening.FindStringSubmatch(c.output())[1]
	return c
}

// crashButton is a button as its last write answered 200 left it (version 0: its create got no answer), and as the
// write without an answer would leave it (pending). key and message are those of the write that leaves it so.
type crashButton struct {
	id, desc, name, state, key, message string // desc: unique to its create, never changed
	amount, version                     int64
	pending                             *crashButton
	answers                             map[string]string // the bodies its writes' Idempotency-Keys got
}

// TestCrashKeepsAnsweredWrites kills the server with SIGKILL under concurrent writes and restarts it, 3 times (20 with
// PAYBUTTONS_LONG_TESTS=1), then stops it with SIGTERM; after each start and the stop, checkCrash checks the file.
func TestCrashKeepsAnsweredWrites(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no SIGTERM to send")
	}
	t.Parallel()
	cycles, workers, db := map[bool]int{false: 3, true: 20}[os.Getenv("PAYBUTTONS_LONG_TESTS") == "1"], 6, t.TempDir()+"/crash.db"
	key, buttons := "", []*crashButton{}
	for cycle := range cycles + 1 {
		c, mine, acked, wg := startChild(t, db), make([][]*crashButton, workers), atomic.Int64{}, sync.WaitGroup{}
		if cycle == 0 {
			key = regexp.MustCompile(`pbk_\S+`).FindString(c.output()) // the first start mints one
		}
		buttons = checkCrash(t, db, buttons, fmt.Sprint("after start ", cycle))
		for i, b := range buttons { // each button to one worker, which alone writes it: what it knows stays exact
			mine[i%workers] = append(mine[i%workers], b)
		}
		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		for w := range workers {
			wg.Go(func() { mine[w] = crashWorker(t, client, c.url, key, fmt.Sprint(cycle, "-", w), mine[w], &acked) })
		}
		// The stop comes after a random number of answered writes, with others in flight at any of their steps.
		target := 5 + rand.Int64N(150)
		awaitTrue(func() bool { return acked.Load() >= target }) // else the workers have failed the test
		if cycle < cycles {
			c.cmd.Process.Kill()
			awaitTrue(c.gone.Load) // else the next start fails: the file is in use
			wg.Wait()
			buttons = slices.Concat(mine...)
			continue
		}
		// SIGTERM while a create waits for its body, sent once the server says it is shutting down: the create must be
		// answered 200 and stored, and the server exit 0, "stopped" its last line. The server sends 100 Continue once
		// the handler, the key admitted, reads the body.
		body := createBody(m{"productName": "in flight", "description": "in flight", "amount": "1.00"})
		conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\nContent-Length: %d\r\n"+
			"Expect: 100-continue\r\n\r\n", key, len(body))
		r, raw := bufio.NewReader(conn), []byte{}
		resp, err := http.ReadResponse(r, nil)
		if err == nil && resp.StatusCode == 100 {
			c.cmd.Process.Signal(syscall.SIGTERM)
			awaitTrue(func() bool { return strings.Contains(c.output(), `msg="shutting down"`) })
			fmt.Fprint(conn, body)
			if resp, err = http.ReadResponse(r, nil); err == nil {
				raw, err = io.ReadAll(resp.Body)
			}
		}
		id := regexp.MustCompile(`^\{"isSuccess":true,"data":"(btn_\w+)","message":"created"}$`).FindSubmatch(raw)
		if err != nil || resp.StatusCode != 200 || id == nil {
			t.Fatalf("a create in flight at SIGTERM: got %v %s (%v), want 100 Continue, then 200 created", resp, raw, err)
		}
		if !awaitTrue(c.gone.Load) || c.cmd.ProcessState.ExitCode() != 0 ||
			!regexp.MustCompile(`msg=stopped\s*$`).MatchString(c.output()) {
			t.Errorf("after SIGTERM: got %v, want exit status 0 and msg=stopped last:\n%s", c.cmd.ProcessState, c.output())
		}
		b := &crashButton{id: string(id[1]), desc: "in flight", name: "in flight", amount: 100, state: "active", version: 1}
		wg.Wait()
		checkCrash(t, db, slices.Concat(append(mine, []*crashButton{b})...), "after SIGTERM")
	}
}

// crashWorker sends creates, updates, deletes and restores of its buttons, half with an Idempotency-Key, one at a
// time until one gets no answer: the server is gone. It returns its buttons.
func crashWorker(t *testing.T, client *http.Client, url, key, tag string, mine []*crashButton,
	acked *atomic.Int64) []*crashButton {
	for seq := 0; ; seq++ {
		name, amount := fmt.Sprint(tag, "-", seq), 100+rand.Int64N(1_000_000)
		b, next := &crashButton{desc: name}, crashButton{desc: name, name: name, amount: amount, state: "active",
			version: 1, message: "created", answers: map[string]string{}}
		method, path, body := "POST", "create", createBody(m{"productName": name, "description": name,
			"amount": cents(amount)})
		if len(mine) == 0 || rand.IntN(3) == 0 {
			mine = append(mine, b) // a create
		} else {
			b = mine[rand.IntN(len(mine))]
			next, body = *b, ""
			switch next.version++; {
			case b.state == "deleted":
				next.state, path, next.message = "active", "restore/"+b.id, "restored"
			case rand.IntN(6) == 0:
				next.state, method, path, next.message = "deleted", "DELETE", "delete/"+b.id, "deleted"
			default:
				next.name, next.amount, path, next.message = name, amount, "update/"+b.id, "updated"
				body = fmt.Sprintf(`{"productName":%q,"amount":%q}`, name, cents(amount))
			}
		}
		var headers []string
		if next.key = ""; rand.IntN(2) == 0 { // on half the writes
			next.key, headers = "idem-"+name, []string{"Idempotency-Key", "idem-" + name}
		}
		r, err := callAPI(client, method, url+"/product-payment/"+path, key, body, headers...)
		next.id = cmp.Or(b.id, r.dataString())
		if err != nil || r.status != 200 || string(r.raw) != fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`,
			next.id, next.message) || !validButtonID(next.id) {
			if r.status != 0 { // an answer, but not the one this write must get
				t.Errorf("%s: got %d %s (%v), want 200 %s", r.request, r.status, r.raw, err, next.message)
			}
			next.id, b.pending = b.id, &next
			return mine
		}
		if *b = next; next.key != "" {
			b.answers[next.key] = string(r.raw)
		}
		acked.Add(1)
	}
}

// cents writes an amount of USD cents as the API does: 1234 is "12.34".
func cents(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

// checkCrash checks the file at path: integrity_check says ok; each button is stored as its last answered write left
// it, or its unanswered write whole; no other is; its history holds versions 1 to its own, the last as stored; the
// answers kept are those of its writes, byte for byte those their clients got. It returns the buttons as stored.
func checkCrash(t *testing.T, path string, buttons []*crashButton, when string) []*crashButton {
	t.Helper()
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro"))
	defer db.Close()
	// A button's JSON without times; its versions are a primary key: n of them from 1 to n are each of 1 to n.
	rows, err := db.Query(`SELECT 'sound', '', (SELECT group_concat(integrity_check) FROM pragma_integrity_check) ||
		', ' || (SELECT count(*) FROM history h WHERE NOT EXISTS (SELECT 1 FROM buttons b WHERE b.id = h.button_id))
		UNION ALL SELECT 'key', key, body FROM idempotency_keys UNION ALL SELECT 'button', button->>'description',
		button->>'id' || ' ' || iif((SELECT count(*) = max(version) AND min(version) = 1 AND max(version) =
		b.button->>'version' FROM history h WHERE h.button_id = b.id) AND (SELECT button FROM history h WHERE
		h.button_id = b.id ORDER BY version DESC LIMIT 1) = button, '', 'bad history ') || json_set(button, '$.id', '',
		'$.createdAt', '', '$.updatedAt', '', '$.deletedAt', iif(button->>'deletedAt' IS NULL, NULL, 'set')) FROM buttons b`)
	read := map[string]map[string]string{"sound": {}, "key": {}, "button": {}}
	stored, kept := read["button"], read["key"]
	if _, err = collect(rows, err, func(rows *sql.Rows) (what string, err error) {
		var name, value string
		err = rows.Scan(&what, &name, &value)
		read[what][name] = value
		return what, err
	}); err != nil || read["sound"][""] != "ok, 0" {
		t.Fatalf("%s: got integrity_check and histories of no button %q (%v), want ok, 0", when, read["sound"][""], err)
	}
	var left []*crashButton
	for _, b := range buttons {
		got, ok := stored[b.desc]
		id, _, _ := strings.Cut(got, " ")
		is := func(b *crashButton) bool {
			want := button{ProductName: b.name, Description: &b.desc, Amount: cents(b.amount), Currency: "USD",
				PaymentMethod: "Stripe", PaymentType: "one_time", Metadata: map[string]string{}, State: b.state,
				Version: b.version}
			if b.state == "deleted" {
				want.DeletedAt = orNil("set")
			}
			text, _ := json.Marshal(want)
			return ok == (b.version > 0) && (!ok || got == cmp.Or(b.id, id)+" "+string(text))
		}
		if delete(stored, b.desc); b.pending != nil && !is(b) && is(b.pending) { // the write without an answer, whole
			if *b, b.id = *b.pending, id; b.key != "" {
				b.answers[b.key] = fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`, b.id, b.message)
			}
		} else if !is(b) {
			t.Errorf("%s: button %q: got %q, want %+v or, its unanswered write applied, %+v", when, b.desc, got, *b, b.pending)
		}
		for k, body := range b.answers {
			if kept[k] != body {
				t.Errorf("%s: the answer kept for Idempotency-Key %s: got %q, want %s", when, k, kept[k], body)
			}
			delete(kept, k)
		}
		if b.pending = nil; b.version > 0 {
			left = append(left, b)
		}
	}
	if len(stored)+len(kept) > 0 {
		t.Errorf("%s: got buttons %q and answers %q stored, which no write answered or applied made", when, stored, kept)
	}
	return left
}
