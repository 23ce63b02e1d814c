package main

// Tests that need a real server process: kill -9 at random moments, and SIGTERM under load. The server runs as a
// child process: this test binary started again as TestHelperServerProcess, which calls run.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv marks a test binary that startChild started to be the server.
const childEnv = "PAYBUTTONS_TEST_CHILD"

// TestHelperServerProcess is not a test: it is the server that the crash and shutdown tests start, kill and restart,
// run with the arguments after "--".
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child process of the crash and shutdown tests")
	}
	args := append([]string{"paybuttons"}, os.Args[slices.Index(os.Args, "--")+1:]...)
	if err := run(context.Background(), args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paybuttons:", err)
		os.Exit(exitStatus(err))
	}
	os.Exit(0)
}

// childServer is the server running as a child process.
type childServer struct {
	cmd       *exec.Cmd
	log       *syncBuffer   // its stdout and stderr
	url, addr string        // addr: host:port of url
	done      chan struct{} // closed when the process has exited, and cmd.ProcessState is set
}

// startChild starts `paybuttons serve` on dbPath in a child process and returns once it listens; it fails the test if
// the child exits or is not listening within 30 s. The child is killed at the end of the test if still running.
func startChild(t *testing.T, dbPath string, args ...string) *childServer {
	t.Helper()
	c := &childServer{log: &syncBuffer{}, done: make(chan struct{}),
		cmd: childCommand(append([]string{"serve", "-addr", "127.0.0.1:0", "-db", dbPath, "-rate", "0"}, args...)...)}
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	go func() { c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.cmd.Process.Kill(); <-c.done })
	for timeout := time.After(30 * time.Second); c.url == ""; {
		select {
		case <-c.done:
			t.Fatalf("child exited (%v) before listening:\n%s", c.cmd.ProcessState, c.log)
		case <-timeout:
			t.Fatalf("child not listening after 30 s:\n%s", c.log)
		case <-time.After(5 * time.Millisecond):
			logs := c.log.String() // complete lines only: a line still being written may hold half a port
			c.url = listeningURL(logs[:strings.LastIndexByte(logs, '\n')+1])
		}
	}
	c.addr = strings.TrimPrefix(c.url, "http://")
	return c
}

// childCommand runs the program with args as a child process: this test binary again, as TestHelperServerProcess. The
// caller's PAYBUTTONS_ variables (a TLS certificate, say) do not reach it.
func childCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperServerProcess$", "--"}, args...)...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PAYBUTTONS_")
	}), childEnv+"=1")
	return cmd
}

// kill sends SIGKILL and waits for the process; it fails the test if the process had already exited by itself.
func (c *childServer) kill(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("child exited by itself (%v) before the kill:\n%s", c.cmd.ProcessState, c.log)
	default:
		c.cmd.Process.Kill()
		<-c.done
	}
}

// mintKeyCLI creates a key for account with `paybuttons keys create`.
func mintKeyCLI(t *testing.T, dbPath, account string) string {
	t.Helper()
	out, err := runCLI(t, nil, "keys", "create", "-account", account, "-db", dbPath)
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	return strings.TrimSpace(out)
}

func newTestClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 20 * time.Second}
}

// --- kill -9 ---

// crashButton is what the crash test knows of a button after its last acknowledged write (version 0: its create has
// no answer) and, as pending, how the write sent last, without an answer, would leave it: applied whole or not at all.
type crashButton struct {
	id, desc, name, state string // desc: unique to its create, never changed
	amount, version       int64  // amount: cents, USD
	history               string // its changes as checkCrashState reads them from button_history
	action, idemKey       string // of the write that leaves it so: create, update, delete or restore; its key or ""
	pending               *crashButton
}

func money(cents int64) string { return fmt.Sprintf("%d.%02d", cents/100, cents%100) }

// storedAs says whether b is what is stored: row is a button's id and values as checkCrashState reads them.
func (b *crashButton) storedAs(row [2]string, stored bool) bool {
	if b.version == 0 || !stored {
		return b.version == 0 && !stored
	}
	return (b.id == "" || b.id == row[0]) && row[1] == fmt.Sprintf("%s|%d|USD||Stripe|one_time|0|0||%s|%d|1|1|%s",
		b.name, b.amount, b.state, b.version, b.history)
}

// crashModel is every button the test sent a create for, by description, and the status and body kept for each
// Idempotency-Key of a stored write (byte for byte what was sent, if it was answered). Workers add to it under mu.
type crashModel struct {
	mu      sync.Mutex
	buttons map[string]*crashButton
	keys    map[string][2]string
	acked   int // writes answered 200
}

// crashWrites sends creates, updates, deletes and restores one at a time, until the first request without an answer
// (the kill). Only this worker touches the buttons in mine during its cycle, so what it records of them is exact.
func (m *crashModel) crashWrites(t *testing.T, client *http.Client, url, key, prefix string, rng *rand.Rand,
	mine []*crashButton) {
	for seq := 0; ; seq++ {
		tag, amount := fmt.Sprintf("%s-%d", prefix, seq), 1+rng.Int64N(1_000_000)
		// b is the model's entry, next the button as the request leaves it: a create unless one of mine is picked.
		b, next := &crashButton{desc: tag}, &crashButton{desc: tag, name: "Plan " + tag, amount: amount,
			state: stateActive, version: 1, action: "create"}
		method, path, body := "POST", "create", createBody(map[string]any{"productName": next.name, "description": tag,
			"amount": money(amount)})
		if len(mine) > 0 && rng.IntN(3) != 0 {
			b = mine[rng.IntN(len(mine))]
			changed := *b
			switch {
			case b.state == stateDeleted:
				changed.state, changed.action, path, body = stateActive, "restore", "restore/"+b.id, ""
			case rng.IntN(8) == 0:
				changed.state, changed.action, method, path, body = stateDeleted, "delete", "DELETE", "delete/"+b.id, ""
			default:
				changed.name, changed.amount, changed.action, path = next.name, amount, "update", "update/"+b.id
				body = fmt.Sprintf(`{"productName":%q,"amount":%q}`, next.name, money(amount))
			}
			changed.history += fmt.Sprintf(" %s:%d", changed.action, changed.version) // with the version before it
			changed.version++
			next = &changed
		}
		next.idemKey = "idem-" + tag
		headers := []string{"Idempotency-Key", next.idemKey}
		if rng.IntN(2) == 0 { // half the requests carry one
			next.idemKey, headers = "", nil
		}
		r, err := callAPI(client, method, url+"/product-payment/"+path, key, body, headers...)
		if err == nil && (r.status != 200 || !validButtonID(r.dataString()) || b.id != "" && r.dataString() != b.id) {
			t.Errorf("%s: got %d %s, want 200 naming the button", r.request, r.status, r.raw)
			return
		}
		m.mu.Lock()
		if m.buttons[b.desc] = b; err != nil {
			b.pending = next
			m.mu.Unlock()
			return
		}
		if next.id == "" {
			next.id, mine = r.dataString(), append(mine, b)
		}
		if *b, m.acked = *next, m.acked+1; b.idemKey != "" {
			m.keys[b.idemKey] = [2]string{"200", string(r.raw)}
		}
		m.mu.Unlock()
	}
}

// TestCrashKeepsAcknowledgedWrites kills the server with SIGKILL at random moments under concurrent writes and
// restarts it on the same file, 3 times (20 with PAYBUTTONS_LONG_TESTS), then stops it with SIGTERM. After each kill:
// every write answered 200 is stored with its exact values and history, and its answer kept for its Idempotency-Key;
// each unanswered write is stored whole or not at all; the file is intact. After SIGTERM, also: a request in flight
// was answered, no write is stored without its answer, the process exited 0 and left no WAL.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGKILL and SIGTERM")
	}
	t.Parallel()
	cycles, workers, seed := 3, 8, rand.Uint64()
	if os.Getenv("PAYBUTTONS_LONG_TESTS") != "" {
		cycles = 20
	}
	t.Logf("seed %d, %d cycles", seed, cycles)
	rng := rand.New(rand.NewPCG(seed, 0))
	dbPath := filepath.Join(t.TempDir(), "crash.db")
	key := mintKeyCLI(t, dbPath, "acme")
	m := &crashModel{buttons: map[string]*crashButton{}, keys: map[string][2]string{}}
	for cycle := range cycles + 1 {
		child, client, acked := startChild(t, dbPath), newTestClient(), m.acked
		mine := make([][]*crashButton, workers) // every known button gets one worker; sorted, so the seed replays it
		for i, desc := range slices.Sorted(maps.Keys(m.buttons)) {
			mine[i%workers] = append(mine[i%workers], m.buttons[desc])
		}
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				m.crashWrites(t, client, child.url, key, fmt.Sprintf("c%dw%d", cycle, i),
					rand.New(rand.NewPCG(seed, uint64(cycle*workers+i+1))), mine[i])
			})
		}
		if cycle < cycles {
			time.Sleep(100*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond)))) // when to kill
			child.kill(t)
		} else {
			waitFor(t, "100 writes answered", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.acked >= acked+100 })
			stopWithCreateInFlight(t, child, dbPath, key, m)
		}
		wg.Wait()
		st := openTestStore(t, dbPath) // recovers the file as the next server would
		applied, dropped := checkCrashState(t, st.reader, m, fmt.Sprintf("after stop %d", cycle))
		st.close(false)
		t.Logf("cycle %d: %d writes answered 200 before the stop; of those without an answer %d were stored, %d not",
			cycle, m.acked-acked, applied, dropped)
		if cycle == cycles && applied > 0 {
			t.Errorf("after SIGTERM: got %d writes stored without an answer, want none cut off after its commit", applied)
		}
		if t.Failed() {
			return
		}
	}
}

// stopWithCreateInFlight sends SIGTERM to child while it holds a create whose body has not arrived yet; it fails the
// test unless new connections are refused within 5 s, that create is then answered 200, and the process exits 0
// without logging an error and leaves no WAL. The create joins the model.
func stopWithCreateInFlight(t *testing.T, child *childServer, dbPath, key string, m *crashModel) {
	t.Helper()
	b := &crashButton{desc: "in-flight", name: "Plan in-flight", amount: 100, state: stateActive, version: 1}
	body, conn := createBody(map[string]any{"productName": b.name, "description": b.desc, "amount": "1.00"}),
		dialRaw(t, child.addr)
	// Go's server sends "100 Continue" when the handler starts reading the body.
	if status, _, _ := conn.roundTrip(fmt.Sprintf("POST /product-payment/create HTTP/1.1\r\nHost: x\r\n"+
		"X-API-KEY: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, len(body))); status != 100 {
		t.Fatalf("got %d for a request with Expect: 100-continue, want 100 Continue", status)
	}
	child.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, "new connections refused after SIGTERM", func() bool {
		c, err := net.Dial("tcp", child.addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	var env struct{ Data string }
	if status, _, raw := conn.roundTrip(body); status != 200 || json.Unmarshal(raw, &env) != nil {
		t.Fatalf("the create in flight: got %d %s, want 200\n%s", status, raw, child.log)
	}
	b.id = env.Data
	m.mu.Lock()
	m.buttons[b.desc] = b
	m.mu.Unlock()
	select {
	case <-child.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("process still running 20 s after SIGTERM:\n%s", child.log)
	}
	if code := child.cmd.ProcessState.ExitCode(); code != 0 || strings.Contains(child.log.String(), "level=ERROR") {
		t.Errorf("got exit status %d, want 0 and no error logged:\n%s", code, child.log)
	}
	if info, err := os.Stat(dbPath + "-wal"); err == nil && info.Size() != 0 {
		t.Errorf("got a %d-byte WAL after SIGTERM, want it checkpointed (absent or empty)", info.Size())
	}
}

// checkCrashState compares the database with the model: the file passes integrity_check; every button is stored
// once, as its last acknowledged write left it or as its one unanswered write would, with its history, and no other
// button or history is; the kept answers agree. The model then takes what is stored, so the next cycle knows every
// button exactly. It returns how many unanswered writes were stored and how many not.
func checkCrashState(t *testing.T, db *sql.DB, m *crashModel, when string) (applied, dropped int) {
	t.Helper()
	integrity := readRows(t, db, when, `SELECT '', group_concat(integrity_check, ' '), '' FROM pragma_integrity_check`)
	if integrity[""][0] != "ok" {
		t.Fatalf("%s: integrity_check got %q, want ok", when, integrity[""][0])
	}
	stored := readRows(t, db, when, `SELECT description, id, concat_ws('|', product_name, amount_minor, currency,
			coalesce(billing_interval, ''), payment_method, payment_type, is_live, coalesce(fee_basis_points, 0),
			coalesce(metadata, ''), state, version, (state = 'deleted') = (deleted_at IS NOT NULL),
			count(*) OVER (PARTITION BY description), (SELECT coalesce(group_concat(format(' %s:%d', action,
				version), '' ORDER BY change_version), '') FROM button_history h WHERE h.account = b.account
					AND h.button_id = b.id AND h.change_version = h.version + 1))
		FROM buttons b
		UNION ALL SELECT 'the history of no button', button_id, '' FROM button_history h
			WHERE NOT EXISTS (SELECT 1 FROM buttons b WHERE b.account = h.account AND b.id = h.button_id)`)
	for desc, row := range stored {
		if m.buttons[desc] == nil {
			t.Errorf("%s: button %s (%q) matches no create that was sent", when, row[0], desc)
		}
	}
	for desc, want := range m.buttons {
		p := want.pending
		switch got, ok := stored[desc]; {
		case want.storedAs(got, ok):
			if p != nil {
				dropped++
			}
		case p != nil && p.storedAs(got, ok):
			applied++
			*want, want.id = *p, got[0]
			if p.idemKey != "" { // its answer must be kept
				m.keys[p.idemKey] = [2]string{"200", fmt.Sprintf(`{"isSuccess":true,"data":%q,"message":"%sd"}`,
					got[0], p.action)}
			}
		default:
			t.Errorf("%s: button %s: got %q, want %+v or, with its unanswered write applied, %+v", when, desc, got, *want, p)
		}
		if want.pending = nil; want.version == 0 {
			delete(m.buttons, desc) // a create that was not stored: the process that could commit it is dead
		}
	}
	kept := readRows(t, db, when, `SELECT key, status, body FROM idempotency_keys`)
	keys := maps.Clone(kept)
	maps.Copy(keys, m.keys)
	for key := range keys {
		if kept[key] != m.keys[key] {
			t.Errorf("%s: the answer kept for Idempotency-Key %s: got %q, want %q", when, key, kept[key], m.keys[key])
		}
	}
	return applied, dropped
}

// readRows reads the rows of query, three text columns, into a map by the first.
func readRows(t *testing.T, db *sql.DB, when, query string) map[string][2]string {
	t.Helper()
	byFirst := map[string][2]string{}
	rows, err := db.Query(query)
	_, err = collect(rows, err, func(rows *sql.Rows) (first string, err error) {
		var r [2]string
		err = rows.Scan(&first, &r[0], &r[1])
		byFirst[first] = r
		return first, err
	})
	if err != nil {
		t.Fatalf("%s: %s: %v", when, query, err)
	}
	return byFirst
}
