package main

import (
	"bufio"
	"cmp"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"reflect"
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

// TestHelperServerProcess is not a test: started by childCommand, it is the program (args after "--").
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv("PAYBUTTONS_TEST_CHILD") != "1" {
		t.Skip("the program itself, run as a child process by other tests")
	}
	os.Args = append([]string{"paybuttons"}, os.Args[slices.Index(os.Args, "--")+1:]...)
	main() // which exits with the status of an error
	os.Exit(0)
}

// childCommand is the program as a child process, without PAYBUTTONS_ variables or -race's exit sleep.
func childCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperServerProcess$", "--"}, args...)...)
	env := slices.DeleteFunc(os.Environ(), func(v string) bool { return strings.HasPrefix(v, "PAYBUTTONS_") })
	cmd.Env = append(env, "PAYBUTTONS_TEST_CHILD=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	return cmd
}

// child is `paybuttons serve` as a child process, its output going to the file log.
type child struct {
	cmd      *exec.Cmd
	log, url string
	gone     atomic.Bool // it has exited, and cmd.ProcessState is set
}

func (c *child) output() string { text, _ := os.ReadFile(c.log); return string(text) }

// startChild serves db in a child process, killed when the test ends, and returns once it listens.
func startChild(t *testing.T, db string) *child {
	t.Helper()
	c := &child{cmd: childCommand("serve", "-addr", "127.0.0.1:0", "-rate", "0", "-db", db)}
	c.log = t.TempDir() + "/log"
	out, err := os.Create(c.log)
	require(t, err == nil, "%v", err)
	defer out.Close() // the child has its own
	c.cmd.Stdout, c.cmd.Stderr = out, out
	err = c.cmd.Start()
	require(t, err == nil, "cannot start the server: %v", err)
	go func() { c.cmd.Wait(); c.gone.Store(true) }()
	t.Cleanup(func() { c.cmd.Process.Kill(); awaitTrue(c.gone.Load) })
	listening := regexp.MustCompile(`msg=listening url=(\S+) `) // the space: the whole port is there
	awaitTrue(func() bool { return listening.MatchString(c.output()) || c.gone.Load() })
	url := listening.FindStringSubmatch(c.output())
	require(t, url != nil, "the server exited, or did not listen within 20 s:\n%s", c.output())
	c.url = url[1]
	return c
}

// A server killed amid writes (3 times; 20 with PAYBUTTONS_LONG_TESTS=1), then stopped, loses no answer.
func TestCrashKeepsAnsweredWrites(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no SIGTERM to send")
	}
	t.Parallel()
	cycles, workers, db := 3, 6, t.TempDir()+"/crash.db"
	if longTests() {
		cycles = 20
	}
	var key string
	var buttons []*crashButton
	for cycle := 0; cycle <= cycles; cycle++ {
		c := startChild(t, db)
		key = cmp.Or(key, regexp.MustCompile(`pbk_\S+`).FindString(c.output())) // the first start mints one
		buttons = checkCrash(t, db, buttons, fmt.Sprint("after start ", cycle))
		// Each button goes to one worker, which alone writes it: what the worker knows of it is exact.
		mine := make([][]*crashButton, workers)
		for i, b := range buttons {
			mine[i%workers] = append(mine[i%workers], b)
		}
		var acked atomic.Int64
		var wg sync.WaitGroup
		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 9}}
		for w := range workers {
			tag := fmt.Sprint(cycle, "-", w)
			wg.Go(func() { mine[w] = crashWorker(t, client, c.url, key, tag, mine[w], &acked) })
		}
		// The stop comes after a random number of answered writes, with others in flight at any step.
		target := 5 + rand.Int64N(150)
		awaitTrue(func() bool { return acked.Load() >= target }) // false: the workers failed the test
		if cycle == cycles {
			inFlight := stopDuringCreate(t, c, key)
			wg.Wait()
			checkCrash(t, db, append(slices.Concat(mine...), inFlight), "after SIGTERM")
			return
		}
		c.cmd.Process.Kill()
		require(t, awaitTrue(c.gone.Load), "the server still runs 20 s after its SIGKILL")
		wg.Wait()
		buttons = slices.Concat(mine...)
	}
}

// stopDuringCreate sends SIGTERM while a create waits for its body, and the body once the server is
// shutting down: the create must be answered and stored, and the server exit 0.
func stopDuringCreate(t *testing.T, c *child, key string) *crashButton {
	body := createBody(m{"productName": "in flight", "description": "in flight", "amount": "1.00"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	require(t, err == nil, "%v", err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, len(body))
	reader := bufio.NewReader(conn)
	resp, err := http.ReadResponse(reader, nil)
	require(t, err == nil && resp.StatusCode == 100, "a create sent with Expect: 100-continue: got %v (%v), "+
		"want 100 Continue", resp, err)
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
	return &crashButton{id: string(id[1]), desc: "in flight", name: "in flight", state: "active", amount: 100,
		version: 1}
}

// crashButton is a button as its last answered write left it (version 0: none), or as pending would.
type crashButton struct {
	id, desc, name, state, key, message string // desc is the button's own, never changed
	amount, version                     int64  // amount in USD cents
	pending                             *crashButton
	answers                             map[string]string // by Idempotency-Key: the body its write got
}

// crashWorker writes its buttons, half with an Idempotency-Key, until a write gets no answer.
func crashWorker(t *testing.T, client *http.Client, url, key, tag string, mine []*crashButton,
	acked *atomic.Int64) []*crashButton {
	for seq := 0; ; seq++ {
		name, amount := fmt.Sprint(tag, "-", seq), 100+rand.Int64N(1_000_000)
		b := &crashButton{desc: name, answers: map[string]string{}}
		method, path, body := "POST", "create", createBody(m{"productName": name, "description": name,
			"amount": cents(amount)})
		next := crashButton{desc: name, name: name, state: "active", amount: amount, message: "created",
			answers: b.answers}
		if len(mine) > 0 && rand.IntN(3) > 0 { // a write of one of its buttons
			b = mine[rand.IntN(len(mine))]
			next, body = *b, ""
			switch {
			case b.state == "deleted":
				path, next.message, next.state = "restore/"+b.id, "restored", "active"
			case rand.IntN(6) == 0:
				method, path, next.message, next.state = "DELETE", "delete/"+b.id, "deleted", "deleted"
			default:
				path, next.message, next.name, next.amount = "update/"+b.id, "updated", name, amount
				body = fmt.Sprintf(`{"productName":%q,"amount":%q}`, name, cents(amount))
			}
		} else {
			mine = append(mine, b)
		}
		next.version, next.key = b.version+1, ""
		var headers []string
		if rand.IntN(2) == 0 {
			next.key = "idem-" + name
			headers = []string{"Idempotency-Key", next.key}
		}
		r, err := callAPI(client, method, url+"/product-payment/"+path, key, body, headers...)
		next.id = cmp.Or(b.id, r.dataString())
		want := fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`, next.id, next.message)
		if err != nil || string(r.raw) != want || !validButtonID(next.id) {
			if r.status != 0 { // an answer, but not the one this write must get
				t.Errorf("%s: got %d %s (%v), want %s", r.request, r.status, r.raw, err, want)
			}
			next.id, b.pending = b.id, &next
			return mine
		}
		*b = next
		if next.key != "" {
			b.answers[next.key] = string(r.raw)
		}
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
	want := button{ID: cmp.Or(b.id, got.ID), ProductName: b.name, Description: &b.desc,
		Amount: cents(b.amount), Currency: "USD", PaymentMethod: "Stripe", PaymentType: "one_time",
		Metadata: map[string]string{}, State: b.state, Version: b.version, CreatedAt: got.CreatedAt,
		UpdatedAt: got.UpdatedAt, DeletedAt: got.DeletedAt} // the times as stored, deletedAt set or not
	return reflect.DeepEqual(got, want) && (got.DeletedAt != nil) == (b.state == "deleted")
}

// checkCrash checks the file: it is sound; each button is as its last answered write left it, or as its
// unanswered write would; nothing else is stored, history is a row per version, answers as they were sent.
func checkCrash(t *testing.T, path string, buttons []*crashButton, when string) []*crashButton {
	t.Helper()
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro"))
	defer db.Close()
	var integrity string
	err := db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity)
	require(t, err == nil && integrity == "ok", "%s: integrity_check: got %q (%v)", when, integrity, err)
	stored, kept, history := map[string]button{}, map[string]string{}, int64(0)
	rows, err := db.Query(`SELECT button FROM buttons`)
	all, err := collect(rows, err, func(r *sql.Rows) (button, error) { return scanButton(r) })
	rows, err2 := db.Query(`SELECT key, body FROM idempotency_keys`)
	_, err2 = collect(rows, err2, func(r *sql.Rows) (key string, err error) {
		var body string
		err = r.Scan(&key, &body)
		kept[key] = body
		return key, err
	})
	err3 := db.QueryRow(`SELECT count(*) FROM history`).Scan(&history)
	require(t, cmp.Or(err, err2, err3) == nil, "%s: read the file: %v", when, cmp.Or(err, err2, err3))
	for _, b := range all {
		stored[*b.Description] = b
	}
	var left []*crashButton
	for _, b := range buttons {
		got, found := stored[b.desc]
		delete(stored, b.desc)
		switch {
		case b.is(got, found):
		case b.pending != nil && b.pending.is(got, found): // the write that got no answer, applied whole
			*b = *b.pending
			b.id = got.ID
			if b.key != "" {
				b.answers[b.key] = fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":%q}`, b.id, b.message)
			}
		default:
			t.Errorf("%s: button %s: got %s, want %+v or %+v", when, b.desc, jsonOf(got), *b, b.pending)
		}
		b.pending = nil
		for key, body := range b.answers {
			expect(t, kept[key] == body, "%s: the answer kept for %s: got %q, want %s", when, key, kept[key],
				body)
			delete(kept, key)
		}
		if found {
			left, history = append(left, b), history-got.Version
		}
	}
	expect(t, len(stored)+len(kept) == 0, "%s: got buttons %v, answers %v no write made", when, stored, kept)
	expect(t, history == 0, "%s: got %d history rows more than the buttons' versions", when, history)
	return left
}
