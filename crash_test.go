package main

// Durability tests that need a real server process: kill -9 at random moments
// and SIGTERM under load. The server runs as a child process: this test binary
// started again with TestHelperServerProcess, which calls run.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// childEnv marks a test binary that startChild started to be the server.
const childEnv = "PAYBUTTONS_TEST_CHILD"

// TestHelperServerProcess is not a test: it is the server process that the
// crash and shutdown tests start, kill and restart. The arguments after "--"
// are the program's.
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child process of the crash and shutdown tests")
	}
	args := []string{"paybuttons"}
	if i := slices.Index(os.Args, "--"); i >= 0 {
		args = append(args, os.Args[i+1:]...)
	}
	if err := run(context.Background(), args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paybuttons:", err)
		os.Exit(exitStatus(err))
	}
	os.Exit(0)
}

// serverLog collects what a server writes on stderr and picks out the
// listening URL and a first key from its complete lines.
type serverLog struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	scanned int
	url     string
	key     string
	ready   chan struct{} // closed once the URL is known
}

func newServerLog() *serverLog { return &serverLog{ready: make(chan struct{})} }

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		rest := l.buf.Bytes()[l.scanned:]
		end := bytes.IndexByte(rest, '\n')
		if end < 0 {
			break
		}
		line := string(rest[:end])
		l.scanned += end + 1
		if strings.HasPrefix(line, "pbk_") {
			l.key = line
		}
		if _, after, ok := strings.Cut(line, " url="); ok && l.url == "" && strings.Contains(line, "msg=listening") {
			if f := strings.Fields(after); len(f) > 0 {
				l.url = f[0]
				close(l.ready)
			}
		}
	}
	return len(p), nil
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *serverLog) listening() (url, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url, l.key
}

// childServer is the server running as a child process.
type childServer struct {
	cmd   *exec.Cmd
	log   *serverLog
	url   string
	addr  string        // host:port of url
	done  chan struct{} // closed when the process has exited
	state *os.ProcessState
}

// startChild starts `paybuttons serve` on dbPath in a child process and returns
// once it listens; it fails the test if the child exits or is not listening
// within 30 s. The child is killed at the end of the test if still running.
func startChild(t *testing.T, dbPath string, args ...string) *childServer {
	t.Helper()
	cmd := childCommand(append([]string{"serve", "-addr", "127.0.0.1:0", "-db", dbPath, "-rate", "0"}, args...)...)
	c := &childServer{cmd: cmd, log: newServerLog(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	go func() {
		cmd.Wait()
		c.state = cmd.ProcessState
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
	})
	select {
	case <-c.log.ready:
	case <-c.done:
		t.Fatalf("child exited (%v) before listening:\n%s", c.state, c.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("child not listening after 30 s:\n%s", c.log)
	}
	c.url, _ = c.log.listening()
	c.addr = strings.TrimPrefix(c.url, "http://")
	return c
}

// childCommand runs the program with args as a child process: this test
// binary again, as TestHelperServerProcess. The caller's PAYBUTTONS_
// variables (a TLS certificate, say) do not reach it.
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

// kill sends SIGKILL and waits for the process; it fails the test if the
// process had already exited by itself.
func (c *childServer) kill(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("child exited by itself (%v) before the kill:\n%s", c.state, c.log)
	default:
	}
	c.cmd.Process.Kill()
	<-c.done
}

// mintKeyCLI creates a key for account with `paybuttons keys create`.
func mintKeyCLI(t *testing.T, dbPath, account string) string {
	t.Helper()
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"paybuttons", "keys", "create", "-account", account, "-db", dbPath},
		func(string) string { return "" }, &stdout, io.Discard)
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	return strings.TrimSpace(stdout.String())
}

func newTestClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 32},
		Timeout:   20 * time.Second,
	}
}

// --- kill -9 ---

// crashButton is what the crash test knows of one button: the values after
// its last acknowledged change, and the change sent last without an answer,
// which may or may not have been applied.
type crashButton struct {
	id      string
	desc    string // unique, set by the create and never changed: finds unacknowledged creates
	idemKey string // the create's Idempotency-Key, "" for none
	name    string
	amount  int64 // cents, USD
	state   string
	version int64
	pending *crashChange
}

// crashChange is one update, delete or restore; zero fields stay unchanged.
type crashChange struct {
	name    string
	amount  int64
	state   string
	idemKey string // the request's Idempotency-Key, "" for none
}

// after returns b as it is once c has been applied.
func (b crashButton) after(c crashChange) crashButton {
	if c.name != "" {
		b.name = c.name
	}
	if c.amount != 0 {
		b.amount = c.amount
	}
	if c.state != "" {
		b.state = c.state
	}
	b.version++
	b.pending = nil
	return b
}

func crashCreateBody(b *crashButton) string {
	return fmt.Sprintf(`{"productName":%q,"description":%q,"amount":"%d.%02d","currency":"USD",`+
		`"paymentMethod":"Stripe","paymentType":"one_time","isLive":false}`,
		b.name, b.desc, b.amount/100, b.amount%100)
}

// crashWorker sends creates, updates, deletes and restores to the server one
// at a time, until the first request without an answer (the kill). Only this
// worker touches the buttons in mine during its cycle, so what it records of
// them is exact.
type crashWorker struct {
	t       *testing.T
	client  *http.Client
	url     string
	key     string
	rng     *rand.Rand
	prefix  string // "c<cycle>w<worker>"
	mine    []*crashButton
	created []*crashButton    // acknowledged creates
	lost    *crashButton      // the create sent without an answer, if that was the last request
	keys    map[string]string // Idempotency-Key -> button id, of requests answered 200
	acked   int
}

func (w *crashWorker) run() {
	for seq := 0; ; seq++ {
		if len(w.mine) == 0 || w.rng.IntN(3) == 0 {
			b := &crashButton{
				desc:    fmt.Sprintf("%s-%d", w.prefix, seq),
				amount:  1 + w.rng.Int64N(1_000_000),
				state:   stateActive,
				version: 1,
			}
			b.name = "Plan " + b.desc
			var headers []string
			if w.rng.IntN(2) == 0 {
				b.idemKey = "idem-" + b.desc
				headers = []string{"Idempotency-Key", b.idemKey}
			}
			r, err := callAPI(w.client, "POST", w.url+"/product-payment/create", w.key, crashCreateBody(b), headers...)
			if err != nil {
				w.lost = b
				return
			}
			if r.status != 200 || !validButtonID(r.dataString()) {
				w.t.Errorf("create %s: got %v, want 200 with a button id", b.desc, r)
				return
			}
			b.id = r.dataString()
			if b.idemKey != "" {
				w.keys[b.idemKey] = b.id
			}
			w.mine = append(w.mine, b)
			w.created = append(w.created, b)
			w.acked++
			continue
		}
		b := w.mine[w.rng.IntN(len(w.mine))]
		var c crashChange
		var method, path, body string
		switch {
		case b.state == stateDeleted:
			c.state, method, path = stateActive, "POST", "/product-payment/restore/"
		case w.rng.IntN(8) == 0:
			c.state, method, path = stateDeleted, "DELETE", "/product-payment/delete/"
		default:
			method, path = "POST", "/product-payment/update/"
			var fields []string
			if w.rng.IntN(3) != 0 {
				c.amount = 1 + w.rng.Int64N(1_000_000)
				fields = append(fields, fmt.Sprintf(`"amount":"%d.%02d"`, c.amount/100, c.amount%100))
			}
			if len(fields) == 0 || w.rng.IntN(2) == 0 {
				c.name = fmt.Sprintf("Plan %s-%d", w.prefix, seq)
				fields = append(fields, fmt.Sprintf(`"productName":%q`, c.name))
			}
			body = "{" + strings.Join(fields, ",") + "}"
		}
		var headers []string
		if w.rng.IntN(2) == 0 {
			c.idemKey = fmt.Sprintf("idem-%s-%d", w.prefix, seq)
			headers = []string{"Idempotency-Key", c.idemKey}
		}
		r, err := callAPI(w.client, method, w.url+path+b.id, w.key, body, headers...)
		if err != nil {
			b.pending = &c
			return
		}
		if r.status != 200 || r.dataString() != b.id {
			w.t.Errorf("%s %s%s %s: got %v, want 200", method, path, b.id, body, r)
			return
		}
		*b = b.after(c)
		if c.idemKey != "" {
			w.keys[c.idemKey] = b.id
		}
		w.acked++
	}
}

// crashModel is every button the test knows must exist, by id, the creates
// sent without an answer, by description, and the Idempotency-Keys whose
// answer must be stored, with the button id it names.
type crashModel struct {
	byID map[string]*crashButton
	lost map[string]*crashButton
	keys map[string]string
	// idempotent is set once the schema has the idempotency_keys table:
	// retry then holds the unanswered creates that carried a key, to be sent
	// again after the restart.
	idempotent bool
	retry      []*crashButton
}

// TestCrashKeepsAcknowledgedWrites kills the server with SIGKILL at random
// moments under concurrent writes, restarts it on the same file each time, and
// checks that every write answered 200 is stored with its exact values, that
// nothing is half-applied, and that the file is intact.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a server process several times")
	}
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGKILL semantics")
	}
	t.Parallel()
	const cycles, workers = 5, 8
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	dir := t.TempDir()
	dbPath := filepath.Join(dir, "crash.db")
	key := mintKeyCLI(t, dbPath, "acme")
	m := &crashModel{byID: map[string]*crashButton{}, lost: map[string]*crashButton{}, keys: map[string]string{}}
	totalAcked := 0

	for cycle := range cycles {
		child := startChild(t, dbPath)
		client := newTestClient()
		retryLostCreates(t, client, child.url, key, m)
		// Every known button gets exactly one worker for this cycle.
		ids := make([]string, 0, len(m.byID))
		for id := range m.byID {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		ws := make([]*crashWorker, workers)
		for i := range ws {
			ws[i] = &crashWorker{t: t, client: client, url: child.url, key: key,
				rng: rand.New(rand.NewPCG(seed, uint64(cycle*workers+i+1))), prefix: fmt.Sprintf("c%dw%d", cycle, i),
				keys: map[string]string{}}
		}
		for i, id := range ids {
			ws[i%workers].mine = append(ws[i%workers].mine, m.byID[id])
		}
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(w.run)
		}
		time.Sleep(100*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond))))
		child.kill(t)
		wg.Wait()
		client.CloseIdleConnections()

		acked, pending := 0, 0
		for _, w := range ws {
			acked += w.acked
			for _, b := range w.created {
				m.byID[b.id] = b
			}
			if w.lost != nil {
				m.lost[w.lost.desc] = w.lost
				pending++
			}
			for k, id := range w.keys {
				m.keys[k] = id
			}
		}
		for _, b := range m.byID {
			if b.pending != nil {
				pending++
			}
		}
		totalAcked += acked
		t.Logf("cycle %d: %d writes answered 200, %d without an answer at the kill; %d buttons", cycle, acked, pending, len(m.byID))
		if t.Failed() {
			return
		}
		// Check a copy of the files as the kill left them, so that the next
		// start still has to recover the original from its WAL.
		snapshot := copyDatabase(t, dbPath, filepath.Join(dir, fmt.Sprintf("snapshot%d.db", cycle)))
		db, err := sql.Open("sqlite", snapshot)
		if err != nil {
			t.Fatal(err)
		}
		applied, dropped := checkCrashState(t, db, m, fmt.Sprintf("after kill %d", cycle))
		db.Close()
		t.Logf("cycle %d: of the writes without an answer, %d were stored and %d not", cycle, applied, dropped)
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
	defer st.close()
	for _, want := range m.byID {
		got, err := scanButton(st.reader.QueryRow(`SELECT `+selectButton+` FROM buttons WHERE account = 'acme' AND id = ?`, want.id))
		if err != nil {
			t.Errorf("button %s (%s): %v after restart", want.id, want.desc, err)
			continue
		}
		if d := crashDiff(want, got); d != "" {
			t.Errorf("button %s after restart: %s", want.id, d)
		}
	}
	checkCrashState(t, st.reader, m, "after the last restart")
}

// copyDatabase copies the database file and its WAL (not the shared-memory
// index, which a reader rebuilds) and returns the copy's path.
func copyDatabase(t *testing.T, from, to string) string {
	t.Helper()
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(from + suffix)
		if errors.Is(err, os.ErrNotExist) && suffix != "" {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// crashDiff describes how got differs from what the test knows of the
// button, or returns "".
func crashDiff(want *crashButton, got button) string {
	var diffs []string
	check := func(field string, got, want any) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s got %v, want %v", field, got, want))
		}
	}
	check("account", got.Account, "acme")
	check("productName", got.ProductName, want.name)
	check("description", got.Description, want.desc)
	check("amount", got.AmountMinor, want.amount)
	check("currency", got.Currency, "USD")
	check("billingInterval", got.BillingInterval, "")
	check("paymentMethod", got.PaymentMethod, "Stripe")
	check("paymentType", got.PaymentType, "one_time")
	check("isLive", got.IsLive, false)
	check("fee", got.FeeBasisPoints, int64(0))
	check("state", got.State, want.state)
	check("version", got.Version, want.version)
	check("deletedAt set", !got.DeletedAt.IsZero(), want.state == stateDeleted)
	return strings.Join(diffs, "; ")
}

// checkCrashState compares the database with the model: the file passes
// integrity_check; every known button is there with its last acknowledged
// values, or with its one unanswered change applied whole; every other button
// is an unanswered create, stored whole; the tables beside buttons agree. The
// model then takes the stored state, so the next cycle knows every button
// exactly. It returns how many unanswered writes were stored and how many not.
func checkCrashState(t *testing.T, db *sql.DB, m *crashModel, when string) (applied, dropped int) {
	t.Helper()
	var absentKeys []string // keys of unanswered writes that were not stored
	m.retry = nil
	ctx := context.Background()
	var integrity []string
	rows, err := db.QueryContext(ctx, `PRAGMA integrity_check`)
	if err != nil {
		t.Fatalf("%s: integrity_check: %v", when, err)
	}
	for rows.Next() {
		var line string
		rows.Scan(&line)
		integrity = append(integrity, line)
	}
	rows.Close()
	if len(integrity) != 1 || integrity[0] != "ok" {
		t.Fatalf("%s: integrity_check got %q, want ok", when, integrity)
	}

	rows, err = db.QueryContext(ctx, `SELECT `+selectButton+` FROM buttons`)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	var stored []button
	for rows.Next() {
		b, err := scanButton(rows)
		if err != nil {
			t.Fatalf("%s: scan: %v", when, err)
		}
		stored = append(stored, b)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, got := range stored {
		seen[got.ID] = true
		want, known := m.byID[got.ID]
		if !known {
			lost, ok := m.lost[got.Description]
			if !ok {
				t.Errorf("%s: button %s (%q) matches no create that was sent", when, got.ID, got.Description)
				continue
			}
			// An unanswered create that was committed: it must be whole.
			lost.id = got.ID
			if d := crashDiff(lost, got); d != "" {
				t.Errorf("%s: unanswered create %s stored as %s: %s", when, lost.desc, got.ID, d)
			}
			m.byID[got.ID] = lost
			delete(m.lost, got.Description)
			if lost.idemKey != "" {
				m.keys[lost.idemKey] = got.ID
				m.retry = append(m.retry, lost)
			}
			applied++
			continue
		}
		d := crashDiff(want, got)
		if p := want.pending; p != nil {
			after := want.after(*p)
			switch {
			case d == "":
				dropped++
				if p.idemKey != "" {
					absentKeys = append(absentKeys, p.idemKey)
				}
			case crashDiff(&after, got) == "":
				*want, d = after, ""
				applied++
				if p.idemKey != "" {
					m.keys[p.idemKey] = got.ID
				}
			}
		}
		if d != "" {
			how := "does not have its last acknowledged values"
			if want.pending != nil {
				how = fmt.Sprintf("has neither its last acknowledged values nor those with its unanswered change %+v", *want.pending)
			}
			t.Errorf("%s: button %s (%s) %s: %s", when, got.ID, want.desc, how, d)
		}
		want.pending = nil
	}
	for id, want := range m.byID {
		if !seen[id] {
			t.Errorf("%s: button %s (%s), created with an answer 200, is gone", when, id, want.desc)
		}
	}
	for _, lost := range m.lost {
		dropped++
		if lost.idemKey != "" {
			absentKeys = append(absentKeys, lost.idemKey)
			m.retry = append(m.retry, lost)
		}
	}
	m.lost = map[string]*crashButton{} // the process that could commit them is dead
	checkCrashTables(t, db, m, when, seen, absentKeys)
	return applied, dropped
}

// checkCrashTables checks the tables that are written in the same
// transaction as a button, for those of them the schema has: stored is the
// set of button ids, absentKeys the Idempotency-Keys of writes not stored.
func checkCrashTables(t *testing.T, db *sql.DB, m *crashModel, when string, stored map[string]bool, absentKeys []string) {
	t.Helper()
	tables := map[string]bool{}
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	for rows.Next() {
		var name string
		rows.Scan(&name)
		tables[name] = true
	}
	rows.Close()
	if tables["button_history"] {
		checkCrashHistory(t, db, when)
	}
	m.idempotent = tables["idempotency_keys"]
	if m.idempotent {
		checkCrashAnswers(t, db, m, when, stored, absentKeys)
	}
}

// checkCrashHistory checks that every button has one history row for each
// change after its create, versions 2 to its own, each holding the button as
// it was one version before, with the action that moved it from that state to
// the next (the next row's, or the button's own); and that no row is left of
// a button that is not there.
func checkCrashHistory(t *testing.T, db *sql.DB, when string) {
	t.Helper()
	errs := 0
	fail := func(format string, args ...any) {
		if errs++; errs <= 10 {
			t.Errorf(when+": history: "+format, args...)
		}
	}
	rows, err := db.Query(`SELECT h.button_id, h.change_version, h.action, h.version, h.state, b.version, b.state
		FROM button_history h LEFT JOIN buttons b ON b.account = h.account AND b.id = h.button_id
		ORDER BY h.button_id, h.change_version`)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	type change struct {
		version       int64
		action, state string // state before the change
	}
	type buttonNow struct {
		version int64
		state   string
	}
	changes := map[string][]change{}
	current := map[string]buttonNow{}
	for rows.Next() {
		var id string
		var c change
		var beforeVersion int64
		var version sql.NullInt64
		var state sql.NullString
		if err := rows.Scan(&id, &c.version, &c.action, &beforeVersion, &c.state, &version, &state); err != nil {
			t.Fatal(err)
		}
		if !version.Valid {
			fail("row %s version %d of a button that does not exist", id, c.version)
			continue
		}
		if beforeVersion != c.version-1 {
			fail("button %s: change %d holds version %d, want %d", id, c.version, beforeVersion, c.version-1)
		}
		changes[id] = append(changes[id], c)
		current[id] = buttonNow{version.Int64, state.String}
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	for id, cs := range changes {
		now := current[id]
		if int64(len(cs)) != now.version-1 {
			fail("button %s at version %d has %d changes, want %d", id, now.version, len(cs), now.version-1)
		}
		for i, c := range cs {
			after := now.state
			if i+1 < len(cs) {
				after = cs[i+1].state
			}
			want := "update"
			switch {
			case c.state == stateActive && after == stateDeleted:
				want = "delete"
			case c.state == stateDeleted && after == stateActive:
				want = "restore"
			}
			if c.version != int64(i+2) || c.action != want {
				fail("button %s: got change %d %q, want %d %q", id, c.version, c.action, i+2, want)
			}
		}
	}
	// A button past version 1 without any row lost its changes.
	var missing int
	db.QueryRow(`SELECT count(*) FROM buttons b WHERE b.version > 1 AND NOT EXISTS
		(SELECT 1 FROM button_history h WHERE h.button_id = b.id)`).Scan(&missing)
	if missing > 0 {
		fail("%d buttons past version 1 have no history rows", missing)
	}
}

// checkCrashAnswers checks the answers kept for Idempotency-Keys: every one
// that names a button names one that is stored; every request answered 200
// with a key has its answer kept, naming its button; no write that was not
// stored has its answer kept.
func checkCrashAnswers(t *testing.T, db *sql.DB, m *crashModel, when string, stored map[string]bool, absentKeys []string) {
	t.Helper()
	type answer struct {
		status int
		id     string
	}
	answers := map[string]answer{}
	rows, err := db.Query(`SELECT key, status, body FROM idempotency_keys WHERE account = 'acme'`)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	for rows.Next() {
		var key string
		var a answer
		var body []byte
		if err := rows.Scan(&key, &a.status, &body); err != nil {
			t.Fatal(err)
		}
		var env struct{ Data any }
		if err := json.Unmarshal(body, &env); err != nil {
			t.Errorf("%s: answer kept for %s is not the envelope: %s", when, key, body)
		}
		a.id, _ = env.Data.(string)
		answers[key] = a
		if a.status == 200 && !stored[a.id] {
			t.Errorf("%s: answer kept for %s names button %q, which is not stored", when, key, a.id)
		}
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	for key, id := range m.keys {
		if a, ok := answers[key]; !ok || a.status != 200 || a.id != id {
			t.Errorf("%s: write with Idempotency-Key %s, answered 200 or found stored, for %s: got kept answer %+v (found %v), want status 200 naming it",
				when, key, id, a, ok)
		}
	}
	for _, key := range absentKeys {
		if a, ok := answers[key]; ok {
			t.Errorf("%s: write with Idempotency-Key %s is not stored, but its answer is: %+v", when, key, a)
		}
	}
}

// retryLostCreates sends again, after the restart, every create that got no
// answer and carried an Idempotency-Key: one that was stored must be replayed
// with its button's id, one that was not must now be created.
func retryLostCreates(t *testing.T, client *http.Client, url, key string, m *crashModel) {
	t.Helper()
	if !m.idempotent {
		return
	}
	replays := 0
	for _, b := range m.retry {
		r, err := callAPI(client, "POST", url+"/product-payment/create", key, crashCreateBody(b), "Idempotency-Key", b.idemKey)
		if err != nil || r.status != 200 {
			t.Errorf("retry of create %s after the restart: got %v (%v), want 200", b.desc, r, err)
			continue
		}
		replayed := r.header.Get("Idempotent-Replayed") == "true"
		switch {
		case b.id != "" && (!replayed || r.dataString() != b.id):
			t.Errorf("retry of create %s, stored as %s before the kill: got %s (replayed %v), want a replay of %s", b.desc, b.id, r.dataString(), replayed, b.id)
		case b.id == "" && (replayed || !validButtonID(r.dataString())):
			t.Errorf("retry of create %s, not stored before the kill: got %v (replayed %v), want a new button", b.desc, r, replayed)
		case b.id == "":
			b.id = r.dataString()
			m.byID[b.id] = b
			m.keys[b.idemKey] = b.id
		default:
			replays++
		}
	}
	if len(m.retry) > 0 {
		t.Logf("retried %d unanswered creates after the restart: %d replayed, %d created", len(m.retry), replays, len(m.retry)-replays)
	}
	m.retry = nil
}

// --- SIGTERM ---

// TestShutdownUnderLoadFinishesRequestsInFlight sends SIGTERM to a server
// busy with creates and holding one request whose body has not arrived yet:
// that request still gets its 200, new connections are refused, every create
// stored is one that was answered, the process exits 0 and leaves no WAL.
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
	defer client.CloseIdleConnections()
	var acked sync.Map // description -> id
	var nAcked atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				b := &crashButton{desc: fmt.Sprintf("load%d-%d", w, seq), name: "Load", amount: 1000}
				r, err := callAPI(client, "POST", child.url+"/product-payment/create", key, crashCreateBody(b))
				if err != nil {
					return // refused or closed: the server is going away
				}
				if r.status != 200 {
					t.Errorf("create %s during shutdown: got %v, want 200", b.desc, r)
					return
				}
				acked.Store(b.desc, r.dataString())
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
	slow := crashCreateBody(&crashButton{desc: "in-flight", name: "Slow", amount: 4200})
	fmt.Fprintf(conn, "POST /product-payment/create HTTP/1.1\r\nHost: %s\r\nX-API-KEY: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", child.addr, key, len(slow))
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("got %q (%v) for a request with Expect: 100-continue, want HTTP/1.1 100 Continue", line, err)
	}
	if line, _ := br.ReadString('\n'); line != "\r\n" {
		t.Fatalf("got %q after 100 Continue, want an empty line", line)
	}

	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	refused := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", child.addr)
		if err != nil {
			refused = true
			break
		}
		c.Close()
	}
	if !refused {
		t.Fatal("new connections still accepted 5 s after SIGTERM")
	}
	select {
	case <-child.done:
		t.Fatalf("process exited (%v) with a request in flight:\n%s", child.state, child.log)
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
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("in-flight request: got status %d body %s (%v), want 200", resp.StatusCode, body, err)
	}
	var env struct{ Data string }
	json.Unmarshal(body, &env)
	acked.Store("in-flight", env.Data)

	wg.Wait()
	select {
	case <-child.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("process still running 20 s after SIGTERM:\n%s", child.log)
	}
	if code := child.state.ExitCode(); code != 0 {
		t.Fatalf("got exit status %d (%v), want 0:\n%s", code, child.state, child.log)
	}
	if strings.Contains(child.log.String(), "level=ERROR") {
		t.Errorf("the server logged an error:\n%s", child.log)
	}
	if info, err := os.Stat(dbPath + "-wal"); err == nil && info.Size() != 0 {
		t.Errorf("got a %d-byte WAL after shutdown, want it checkpointed (absent or empty)", info.Size())
	}

	// Stored creates are exactly the answered ones: none was cut off after
	// it was committed.
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT id, description FROM buttons`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	for rows.Next() {
		var id, desc string
		rows.Scan(&id, &desc)
		stored[desc] = id
	}
	rows.Close()
	n := 0
	acked.Range(func(k, v any) bool {
		n++
		if stored[k.(string)] != v.(string) {
			t.Errorf("create %s answered 200 with %s: got %q stored", k, v, stored[k.(string)])
		}
		return true
	})
	if len(stored) != n {
		t.Errorf("got %d buttons stored, want the %d creates answered 200", len(stored), n)
	}
	var integrity string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity); err != nil || integrity != "ok" {
		t.Errorf("integrity_check: got %q (%v), want ok", integrity, err)
	}
	t.Logf("%d creates answered before and during shutdown", n)
}
