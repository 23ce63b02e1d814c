package main

// Durability tests that need a real server process: kill -9 at random moments and SIGTERM under load. The server runs
// as a child process: this test binary started again with TestHelperServerProcess, which calls run.

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// childEnv marks a test binary that startChild started to be the server.
const childEnv = "PAYBUTTONS_TEST_CHILD"

// TestHelperServerProcess is not a test: it is the server process that the crash and shutdown tests start, kill and
// restart. The arguments after "--" are the program's.
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child process of the crash and shutdown tests")
	}
	args := append([]string{"paybuttons"}, os.Args[slices.Index(os.Args, "--")+1:]...) // childCommand puts "--"
	if err := run(context.Background(), args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paybuttons:", err)
		os.Exit(exitStatus(err))
	}
	os.Exit(0)
}

// childServer is the server running as a child process.
type childServer struct {
	cmd  *exec.Cmd
	log  *syncBuffer // its stdout and stderr
	url  string
	addr string        // host:port of url
	done chan struct{} // closed when the process has exited, and cmd.ProcessState is set
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
			// Complete lines only: a line still being written may hold half a port.
			logs := c.log.String()
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
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYBUTTONS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"=1")
	return cmd
}

// kill sends SIGKILL and waits for the process; it fails the test if the process had already exited by itself.
func (c *childServer) kill(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("child exited by itself (%v) before the kill:\n%s", c.cmd.ProcessState, c.log)
	default:
	}
	c.cmd.Process.Kill()
	<-c.done
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

// wantIntegrity fails the test unless PRAGMA integrity_check finds db whole.
func wantIntegrity(t *testing.T, db *sql.DB, when string) {
	t.Helper()
	var report string
	err := db.QueryRow(`SELECT group_concat(integrity_check, char(10)) FROM pragma_integrity_check`).Scan(&report)
	if err != nil || report != "ok" {
		t.Fatalf("%s: integrity_check got %q (%v), want ok", when, report, err)
	}
}

// --- kill -9 ---

// crashButton is what the crash test knows of one button: its values after the last acknowledged request and that
// request's Idempotency-Key (version 0 while its create has no answer); and, as pending, the button as the request sent
// last, without an answer, would leave it: that may or may not be applied.
type crashButton struct {
	id, desc, idemKey, name, state string // desc: unique to its create, never changed: the model's key
	amount, version                int64  // amount: cents, USD
	pending                        *crashButton
}

// createBody is the body of b's create: the same every time it is sent, so a retry with its Idempotency-Key matches.
func (b *crashButton) createBody() string {
	return createBody(map[string]any{"productName": b.name, "description": b.desc, "amount": money(b.amount)})
}

func money(cents int64) string { return fmt.Sprintf("%d.%02d", cents/100, cents%100) }

// crashValues are a button's values as the crash test compares them.
type crashValues struct {
	ID, Account, Name, Desc, Currency, Interval, Method, Type, State string
	Amount, Fee, Version                                             int64
	Live, Metadata, Deleted                                          bool
}

// crashDiff describes how got, and whether it is stored at all, differ from
// what the test knows of the button, or returns "".
func crashDiff(want *crashButton, got button, stored bool) string {
	if !stored || want.version == 0 {
		if stored == (want.version > 0) {
			return ""
		}
		return fmt.Sprintf("got stored %v, want %v", stored, want.version > 0)
	}
	w := crashValues{cmp.Or(want.id, got.ID), "acme", want.name, want.desc, "USD", "", "Stripe", "one_time", want.state,
		want.amount, 0, want.version, false, false, want.state == stateDeleted}
	g := crashValues{got.ID, got.Account, got.ProductName, got.Description, got.Currency, got.BillingInterval, got.PaymentMethod,
		got.PaymentType, got.State, got.AmountMinor, got.FeeBasisPoints, got.Version, got.IsLive, len(got.Metadata) > 0,
		!got.DeletedAt.IsZero()}
	var diffs []string
	for i, gv, wv := 0, reflect.ValueOf(g), reflect.ValueOf(w); i < gv.NumField(); i++ {
		if gv.Field(i).Interface() != wv.Field(i).Interface() {
			diffs = append(diffs, fmt.Sprintf("%s got %v, want %v", gv.Type().Field(i).Name, gv.Field(i), wv.Field(i)))
		}
	}
	return strings.Join(diffs, "; ")
}

// crashAnswer is what must be kept for an Idempotency-Key: an answer naming id,
// byte for byte body if the write was answered; nothing if id is "" (not stored).
type crashAnswer struct{ id, body string }

// crashModel is every button the test sent a create for, by description; the answers that must be kept, by
// Idempotency-Key; and the unanswered creates with a key, to retry after the restart. Workers add to it under mu.
type crashModel struct {
	mu      sync.Mutex
	buttons map[string]*crashButton
	keys    map[string]crashAnswer
	retry   []*crashButton
	acked   int // writes answered 200 in this cycle
}

// crashWorker sends creates, updates, deletes and restores to the server one at a time, until the first request without
// an answer (the kill). Only this worker touches the buttons in mine during its cycle, so what it records of them is
// exact.
type crashWorker struct {
	t                *testing.T
	client           *http.Client
	url, key, prefix string // prefix: "c<cycle>w<worker>"
	rng              *rand.Rand
	m                *crashModel
	mine             []*crashButton
}

func (w *crashWorker) run() {
	for seq := 0; ; seq++ {
		tag := fmt.Sprintf("%s-%d", w.prefix, seq)
		// next is the button as the request leaves it, b the model's entry for it (for a create, at
		// version 0 until answered): a create, unless one of mine is picked.
		next := &crashButton{desc: tag, name: "Plan " + tag, amount: 1 + w.rng.Int64N(1_000_000), state: stateActive, version: 1}
		b, method, path, body := &crashButton{desc: tag}, "POST", "create", next.createBody()
		if len(w.mine) > 0 && w.rng.IntN(3) != 0 {
			b, body = w.mine[w.rng.IntN(len(w.mine))], ""
			changed, fields := *b, map[string]any{}
			switch changed.version++; {
			case b.state == stateDeleted:
				changed.state, path = stateActive, "restore/"+b.id
			case w.rng.IntN(8) == 0:
				changed.state, method, path = stateDeleted, "DELETE", "delete/"+b.id
			default:
				if path = "update/" + b.id; w.rng.IntN(3) != 0 {
					changed.amount, fields["amount"] = next.amount, money(next.amount)
				}
				if len(fields) == 0 || w.rng.IntN(2) == 0 {
					changed.name, fields["productName"] = next.name, next.name
				}
				text, _ := json.Marshal(fields)
				body = string(text)
			}
			next = &changed
		}
		next.idemKey = "idem-" + tag // half the requests carry one
		headers := []string{"Idempotency-Key", next.idemKey}
		if w.rng.IntN(2) == 0 {
			next.idemKey, headers = "", nil
		}
		r, err := callAPI(w.client, method, w.url+"/product-payment/"+path, w.key, body, headers...)
		if err == nil && (r.status != 200 || !validButtonID(r.dataString()) || b.id != "" && r.dataString() != b.id) {
			w.t.Errorf("%s: got %d %s, want 200 naming the button", r.request, r.status, r.raw)
			return
		}
		w.m.mu.Lock()
		if w.m.buttons[b.desc] = b; err != nil {
			b.pending = next
			w.m.mu.Unlock()
			return
		}
		if next.id == "" {
			next.id, w.mine = r.dataString(), append(w.mine, b)
		}
		if *b, w.m.acked = *next, w.m.acked+1; b.idemKey != "" {
			w.m.keys[b.idemKey] = crashAnswer{b.id, string(r.raw)}
		}
		w.m.mu.Unlock()
	}
}

// TestCrashKeepsAcknowledgedWrites kills the server with SIGKILL at random moments under concurrent writes, restarts it
// on the same file each time, and checks that every write answered 200 is stored with its exact values, that nothing is
// half-applied, and that the file is intact.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() || runtime.GOOS == "windows" {
		t.Skip("kills and restarts a server process several times; needs SIGKILL semantics")
	}
	t.Parallel()
	cycles, workers := 3, 8
	if os.Getenv("PAYBUTTONS_LONG_TESTS") != "" {
		cycles = 20
	}
	seed := rand.Uint64()
	t.Logf("seed %d, %d cycles", seed, cycles)
	rng := rand.New(rand.NewPCG(seed, 0))

	dbPath := filepath.Join(t.TempDir(), "crash.db")
	key := mintKeyCLI(t, dbPath, "acme")
	m := &crashModel{buttons: map[string]*crashButton{}, keys: map[string]crashAnswer{}}
	totalAcked := 0
	for cycle := range cycles {
		child := startChild(t, dbPath)
		client := newTestClient()
		retryLostCreates(t, client, child.url, key, m)
		// Every known button gets exactly one worker for this cycle; sorted, so the seed replays it.
		mine := make([][]*crashButton, workers)
		for i, desc := range slices.Sorted(maps.Keys(m.buttons)) {
			mine[i%workers] = append(mine[i%workers], m.buttons[desc])
		}
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go((&crashWorker{t: t, client: client, url: child.url, key: key, m: m, mine: mine[i],
				rng: rand.New(rand.NewPCG(seed, uint64(cycle*workers+i+1))), prefix: fmt.Sprintf("c%dw%d", cycle, i)}).run)
		}
		time.Sleep(100*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond))))
		child.kill(t)
		wg.Wait()

		t.Logf("cycle %d: %d writes answered 200 before the kill", cycle, m.acked)
		totalAcked, m.acked = totalAcked+m.acked, 0
		if t.Failed() {
			return
		}
		// Check a copy of the files as the kill left them, so that the next
		// start still has to recover the original from its WAL.
		db, err := sql.Open("sqlite", copyDatabase(t, dbPath, fmt.Sprintf("%s.snapshot%d", dbPath, cycle)))
		if err != nil {
			t.Fatal(err)
		}
		applied, dropped := checkCrashState(t, db, m, fmt.Sprintf("after kill %d", cycle))
		db.Close()
		t.Logf("cycle %d: of the writes without an answer, %d were stored and %d not; %d buttons", cycle, applied, dropped, len(m.buttons))
		if t.Failed() {
			return
		}
	}
	if totalAcked == 0 {
		t.Fatal("no write was answered 200 in any cycle: the test checked nothing")
	}
	// A restart with the real code path: every button reads back exactly.
	st, err := openStore(dbPath)
	if err != nil {
		t.Fatalf("open after the last kill: %v", err)
	}
	defer st.close(false)
	checkCrashState(t, st.reader, m, "after the last restart")
}

// copyDatabase copies the database file and its WAL (not the shared-memory
// index, which a reader rebuilds) and returns the copy's path.
func copyDatabase(t *testing.T, from, to string) string {
	t.Helper()
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(from + suffix)
		if err == nil {
			err = os.WriteFile(to+suffix, data, 0o600)
		}
		if err != nil && (suffix == "" || !errors.Is(err, os.ErrNotExist)) {
			t.Fatal(err)
		}
	}
	return to
}

// checkCrashState compares the database with the model: the file passes integrity_check; every button is stored with
// its last acknowledged values, or with its one unanswered change (or create) applied whole, and no other button is
// stored; history and kept answers agree. The model then takes the stored state, so the next cycle knows every button
// exactly. It returns how many unanswered writes were stored and how many not.
func checkCrashState(t *testing.T, db *sql.DB, m *crashModel, when string) (applied, dropped int) {
	t.Helper()
	wantIntegrity(t, db, when)
	rows, err := scanButtons(db.Query(`SELECT ` + selectButton + ` FROM buttons`))
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	stored, ids := map[string]button{}, map[string]bool{}
	for _, got := range rows {
		if _, twice := stored[got.Description]; twice || m.buttons[got.Description] == nil {
			t.Errorf("%s: button %s (%q) matches no create that was sent", when, got.ID, got.Description)
			continue
		}
		stored[got.Description], ids[got.ID] = got, true
	}
	m.retry = nil
	for desc, want := range m.buttons {
		got, ok := stored[desc]
		d, p := crashDiff(want, got, ok), want.pending
		switch {
		case p == nil:
		case d == "":
			dropped++
			if p.idemKey != "" {
				m.keys[p.idemKey] = crashAnswer{}
			}
		case crashDiff(p, got, ok) == "":
			applied++
			*want, want.id, d = *p, got.ID, ""
			if p.idemKey != "" {
				m.keys[p.idemKey] = crashAnswer{id: got.ID}
			}
		default:
			d += "; or, with its unanswered change applied, " + crashDiff(p, got, ok)
		}
		if d != "" {
			t.Errorf("%s: button %s (%s): %s", when, want.id, desc, d)
		}
		if p != nil && p.version == 1 && p.idemKey != "" {
			p.id = want.id // "" unless it was stored
			m.retry = append(m.retry, p)
		}
		if want.pending = nil; want.version == 0 {
			delete(m.buttons, desc) // a create that was not stored: the process that could commit it is dead
		}
	}
	checkCrashHistory(t, db, when)
	checkCrashAnswers(t, db, m, when, ids)
	return applied, dropped
}

// checkCrashHistory checks, for all buttons in one query, that a button at version N has one history row per change,
// versions 2 to N, each holding the button as it was one version before (that version; the values this test never
// changes; updated_at the time of the change before, changed_at that of the version after), with the action from its
// state to the next row's (or the button's); and that no row is left of a button that is not there.
func checkCrashHistory(t *testing.T, db *sql.DB, when string) {
	t.Helper()
	var problems sql.NullString
	err := db.QueryRow(`WITH h AS (
		SELECT h.button_id AS id, h.change_version AS v, h.action, h.version, h.state, h.deleted_at,
			b.version AS now, coalesce(lead(h.state) OVER next, b.state) AS next,
			(h.description, h.currency, h.billing_interval, h.payment_method, h.payment_type, h.is_live,
				h.fee_basis_points, h.metadata, h.created_at) IS (b.description, b.currency, b.billing_interval,
				b.payment_method, b.payment_type, b.is_live, b.fee_basis_points, b.metadata, b.created_at) AS same,
			h.updated_at IS coalesce(lag(h.changed_at) OVER next, b.created_at) AND
				h.changed_at IS coalesce(lead(h.updated_at) OVER next, b.updated_at) AS timed
		FROM button_history h LEFT JOIN buttons b ON b.account = h.account AND b.id = h.button_id
		WINDOW next AS (PARTITION BY h.button_id ORDER BY h.change_version)),
	a AS (SELECT *, CASE WHEN state = 'active' AND next = 'deleted' THEN 'delete'
		WHEN state = 'deleted' AND next = 'active' THEN 'restore' ELSE 'update' END AS want FROM h)
	SELECT group_concat(id || ': ' || problem, char(10)) FROM (SELECT * FROM (SELECT id, CASE
		WHEN now IS NULL THEN format('change %d of a button that does not exist', v)
		WHEN v NOT BETWEEN 2 AND now THEN format('got change %d, want 2 to %d', v, now)
		WHEN version != v - 1 THEN format('change %d: got version %d, want %d', v, version, v - 1)
		WHEN action != want THEN format('change %d from %s to %s: got %s, want %s', v, state, next, action, want)
		WHEN NOT same THEN format('change %d: got values unlike the button''s where no change differs', v)
		WHEN NOT timed THEN format('change %d: got times unlike those of the versions before and after it', v)
		WHEN (state = 'deleted') != (deleted_at IS NOT NULL) THEN format('change %d: got state %s with deleted_at %s', v, state, quote(deleted_at))
		END AS problem FROM a
	UNION ALL
	SELECT b.id, format('at version %d: got %d changes, want %d', b.version, count(h.button_id), b.version - 1)
		FROM buttons b LEFT JOIN button_history h ON h.account = b.account AND h.button_id = b.id
		GROUP BY b.account, b.id HAVING count(h.button_id) != b.version - 1)
	WHERE problem IS NOT NULL LIMIT 10)`).Scan(&problems)
	if err != nil || problems.Valid {
		t.Errorf("%s: history: got problems (%v), want none:\n%s", when, err, problems.String)
	}
}

// checkCrashAnswers checks the answers kept for Idempotency-Keys: each is a 200 naming a stored button (of ids); every
// write with a key that was answered has its answer kept byte for byte, and one stored without an answer has one naming
// its button; no write that was not stored has one.
func checkCrashAnswers(t *testing.T, db *sql.DB, m *crashModel, when string, ids map[string]bool) {
	t.Helper()
	rows, err := db.Query(`SELECT key, status, body FROM idempotency_keys WHERE account = 'acme'`)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	defer rows.Close()
	kept := map[string]crashAnswer{}
	for rows.Next() {
		var key, status, body string
		var env struct{ Data string }
		if err := rows.Scan(&key, &status, &body); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(body), &env); err != nil || status != "200" || !ids[env.Data] {
			t.Errorf("%s: answer kept for %s: got %s %s, want 200 naming a stored button", when, key, status, body)
		}
		kept[key] = crashAnswer{env.Data, body}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, want := range m.keys {
		switch got, ok := kept[key]; {
		case want.id == "" && ok:
			t.Errorf("%s: write with Idempotency-Key %s is not stored: got its answer kept %s, want none", when, key, got.body)
		case want.id != "" && (got.id != want.id || want.body != "" && got.body != want.body):
			t.Errorf("%s: write with Idempotency-Key %s, stored as %s: got kept answer %s, want %s", when, key, want.id,
				cmp.Or(got.body, "none"), cmp.Or(want.body, "one naming it")) // no body: the write had no answer
		}
	}
}

// retryLostCreates sends again, after the restart, every create that got no answer and carried an Idempotency-Key: one
// that was stored must be replayed with its button's id, one that was not must now be created.
func retryLostCreates(t *testing.T, client *http.Client, url, key string, m *crashModel) {
	t.Helper()
	replays := 0
	for _, b := range m.retry {
		r, err := callAPI(client, "POST", url+"/product-payment/create", key, b.createBody(), "Idempotency-Key", b.idemKey)
		replayed := r.header.Get("Idempotent-Replayed") == "true"
		switch want := "a new button"; {
		case err != nil || r.status != 200 || replayed != (b.id != "") || b.id != "" && r.dataString() != b.id ||
			!validButtonID(r.dataString()):
			if b.id != "" {
				want = "a replay naming " + b.id + ", stored before the kill"
			}
			t.Errorf("retry of create %s after the restart: got %d %s replayed %v (%v), want %s", b.desc, r.status, r.raw, replayed, err, want)
		case b.id != "":
			replays++
		default:
			b.id = r.dataString()
			m.buttons[b.desc] = b
			m.keys[b.idemKey] = crashAnswer{b.id, string(r.raw)}
		}
	}
	if len(m.retry) > 0 {
		t.Logf("retried %d unanswered creates after the restart: %d replayed, %d created", len(m.retry), replays, len(m.retry)-replays)
	}
}

// --- SIGTERM ---

// TestShutdownUnderLoadFinishesRequestsInFlight sends SIGTERM to a server busy with creates and holding one request
// whose body has not arrived yet: that request still gets its 200, new connections are refused, every create stored is
// one that was answered, the process exits 0 and leaves no WAL.
func TestShutdownUnderLoadFinishesRequestsInFlight(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGTERM")
	}
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "shutdown.db")
	key := mintKeyCLI(t, dbPath, "acme")
	child := startChild(t, dbPath)

	// Load: creates with unique descriptions until the server stops answering.
	client := newTestClient()
	var acked sync.Map // description -> id
	var nAcked atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				desc := fmt.Sprintf("load%d-%d", w, seq)
				r, err := callAPI(client, "POST", child.url+"/product-payment/create", key, createBody(map[string]any{"description": desc}))
				if err != nil {
					return // refused or closed: the server is going away
				}
				if r.status != 200 {
					t.Errorf("create %s during shutdown: got %d %s, want 200", desc, r.status, r.raw)
					return
				}
				acked.Store(desc, r.dataString())
				nAcked.Add(1)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); nAcked.Load() < 50 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}

	// A request in flight: the handler runs and waits for the body. Go's
	// server sends "100 Continue" when the handler starts reading it.
	conn, err := net.Dial("tcp", child.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	slow := createBody(map[string]any{"description": "in-flight"})
	fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: %s\r\nX-API-KEY: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", child.addr, key, len(slow))
	br := bufio.NewReader(conn)
	if cont, err := http.ReadResponse(br, nil); err != nil || cont.StatusCode != 100 {
		t.Fatalf("got %v (%v) for a request with Expect: 100-continue, want 100 Continue", cont, err)
	}

	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", child.addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("new connections still accepted 5 s after SIGTERM")
		}
	}
	select {
	case <-child.done:
		t.Fatalf("process exited (%v) with a request in flight:\n%s", child.cmd.ProcessState, child.log)
	default:
	}

	// The in-flight request completes after the listener has closed.
	if _, err := io.WriteString(conn, slow); err != nil {
		t.Fatalf("send the held body: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight request got no answer: %v\n%s", err, child.log)
	}
	var env struct{ Data string }
	err = json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("in-flight request: got status %d data %q (%v), want 200", resp.StatusCode, env.Data, err)
	}
	acked.Store("in-flight", env.Data)
	nAcked.Add(1)
	wg.Wait()
	select {
	case <-child.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("process still running 20 s after SIGTERM:\n%s", child.log)
	}
	if code := child.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("got exit status %d (%v), want 0:\n%s", code, child.cmd.ProcessState, child.log)
	}
	if strings.Contains(child.log.String(), "level=ERROR") {
		t.Errorf("the server logged an error:\n%s", child.log)
	}
	if info, err := os.Stat(dbPath + "-wal"); err == nil && info.Size() != 0 {
		t.Errorf("got a %d-byte WAL after shutdown, want it checkpointed (absent or empty)", info.Size())
	}

	// Stored creates are exactly the answered ones: none was cut off after it was committed.
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	wantIntegrity(t, db, "after shutdown")
	stored, err := scanButtons(db.Query(`SELECT ` + selectButton + ` FROM buttons`))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range stored {
		if id, _ := acked.Load(b.Description); id != b.ID {
			t.Errorf("got button %s (%s) stored, want only the creates answered 200 (its answer named %v)", b.ID, b.Description, id)
		}
	}
	if int64(len(stored)) != nAcked.Load() {
		t.Errorf("got %d buttons stored, want the %d creates answered 200", len(stored), nAcked.Load())
	}
	t.Logf("%d creates answered before and during shutdown", nAcked.Load())
}
