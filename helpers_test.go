package main

// The helpers every test uses: a real server on a real file, requests, checks, and the program run
// in this process or as a child process.

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testEnv is a real server on a real SQLite file, with a key for accounts "acme" and "other".
type testEnv struct {
	t          testing.TB
	url, db    string
	log        string // the server's log file
	store      *store
	key, keyID string // of account acme
	otherKey   string
}

// newTestServer serves a new database file until the test ends.
func newTestServer(t testing.TB) *testEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := openStore(dir+"/test.db", true)
	logFile, err2 := os.Create(dir + "/log")
	require(t, cmp.Or(err, err2) == nil, "%v", cmp.Or(err, err2))
	srv := httptest.NewServer(newServer(st, slog.New(slog.NewTextHandler(logFile, nil))))
	e := &testEnv{t: t, url: srv.URL, db: dir + "/test.db", log: dir + "/log", store: st}
	e.key, e.keyID, err = st.createKey(context.Background(), "acme", false)
	e.otherKey, _, err2 = st.createKey(context.Background(), "other", false)
	require(t, cmp.Or(err, err2) == nil, "createKey: %v", cmp.Or(err, err2))
	t.Cleanup(func() {
		srv.Close()
		expect(t, st.close() == nil, "close the store")
		logFile.Close()
	})
	return e
}

// response is what a test reads back from one request.
type response struct {
	request string // "METHOD url body", for failure messages
	status  int
	header  http.Header
	raw     []byte
	id      string // the envelope's data when it is a string: the id a write answers
	env     struct {
		IsSuccess     bool
		Data          json.RawMessage
		Message, Code string
		Errors        map[string]string
	}
}

// do sends a request with key as X-API-KEY ("" for none) and headers as name, value pairs. It
// fails the test unless the answer is the envelope.
func (e *testEnv) do(method, path, key, body string, headers ...string) response {
	e.t.Helper()
	r, err := callAPI(http.DefaultClient, method, e.url+path, key, body, headers...)
	require(e.t, err == nil, "%s: %v", r.request, err)
	return r
}

// callAPI is do for any client, URL and goroutine: an answer that is not the envelope is an error.
func callAPI(c *http.Client, method, url, key, body string, headers ...string) (response, error) {
	r := response{request: fmt.Sprintf("%s %s %.300s", method, url, body)}
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.GetBody = nil // the transport must never send a request twice by itself
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.status, r.header = resp.StatusCode, resp.Header
	r.raw, err = io.ReadAll(resp.Body)
	if err != nil || method == "HEAD" {
		return r, err
	}
	if err := json.Unmarshal(r.raw, &r.env); err != nil {
		return r, fmt.Errorf("the body is not the envelope: %v: %s", err, r.raw)
	}
	json.Unmarshal(r.env.Data, &r.id)
	return r, nil
}

// want checks status, isSuccess and code together.
func (r response) want(t testing.TB, status int, code string) {
	t.Helper()
	require(t, r.status == status && r.env.IsSuccess == (status == 200) && r.env.Code == code,
		"%s\ngot %d %s\nwant %d %q", r.request, r.status, r.raw, status, code)
}

// wantFields checks a 400 that names exactly fields.
func (r response) wantFields(t testing.TB, fields ...string) {
	t.Helper()
	r.want(t, 400, "invalid_request")
	got, want := slices.Sorted(maps.Keys(r.env.Errors)), slices.Sorted(slices.Values(fields))
	expect(t, slices.Equal(got, want), "%s\ngot errors %v, want exactly %q", r.request,
		r.env.Errors, fields)
}

// expect fails the test, which goes on, unless ok; the message says what was got and wanted.
func expect(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

// require is expect for a check the rest of the test needs: it stops the test.
func require(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

type m = map[string]any

// createBody is a valid create body (19.90 USD, one time, Stripe) with changes.
func createBody(changes m) string {
	body := m{"productName": "Pro plan", "description": "Monthly access", "amount": "19.90",
		"currency": "USD", "paymentMethod": "Stripe", "paymentType": "one_time", "isLive": false}
	maps.Copy(body, changes)
	return jsonOf(body)
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

// create makes a button with key and returns its id.
func (e *testEnv) create(key, body string) string {
	e.t.Helper()
	r := e.do("POST", "/product-payment/create", key, body)
	r.want(e.t, 200, "")
	return r.id
}

// stored reads account's button id from the database, or fails the test.
func (e *testEnv) stored(account, id string) (b button) {
	e.t.Helper()
	text, _, err := e.store.get(context.Background(), account, id)
	require(e.t, err == nil && json.Unmarshal(text, &b) == nil, "read back %s: %v", id, err)
	return b
}

// buttons counts the buttons of every account.
func (e *testEnv) buttons() (n int) {
	e.store.reader.QueryRow(`SELECT count(*) FROM buttons`).Scan(&n)
	return n
}

func (e *testEnv) logged() string { text, _ := os.ReadFile(e.log); return string(text) }

// awaitTrue polls cond until it holds, and returns false if it does not within 20 s.
func awaitTrue(cond func() bool) bool {
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// runCLI runs the program in this process and fails the test unless it exits with status. A
// serve that should have been refused stops after 10 s, exit status 0.
func runCLI(t testing.TB, env map[string]string, status int, args ...string) (stdout,
	stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err = run(ctx, append([]string{"paybuttons"}, args...),
		func(name string) string { return env[name] }, &out, &errOut)
	expect(t, exitStatus(err) == status, "%q: got %v, stdout %q, stderr %q; want exit status %d",
		args, err, out.String(), errOut.String(), status)
	return out.String(), errOut.String(), err
}

// execSQL runs statements on the SQLite file at path, as another program would.
func execSQL(path, statements string) error {
	db, _ := sql.Open("sqlite", path)
	defer db.Close()
	_, err := db.Exec(statements)
	return err
}

// TestHelperServerProcess is not a test: started by childCommand, it is the program (the
// arguments after "--"), and it exits when the test that started it ends, however it ends.
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv("PAYBUTTONS_TEST_CHILD") != "1" {
		t.Skip("the program itself, run as a child process by other tests")
	}
	go func() { io.Copy(io.Discard, os.Stdin); os.Exit(3) }() // the parent's end of stdin closed
	os.Args = append([]string{"paybuttons"}, os.Args[slices.Index(os.Args, "--")+1:]...)
	main() // which exits with the status of an error
	os.Exit(0)
}

// childCommand is the program as a child process that dies with this test process, or at 30 s,
// without PAYBUTTONS_ variables or -race's exit sleep.
func childCommand(t *testing.T, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	args = append([]string{"-test.run=^TestHelperServerProcess$", "--"}, args...)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.WaitDelay = time.Second // a grandchild (strace's) holding the output cannot hang the test
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(v string) bool {
		return strings.HasPrefix(v, "PAYBUTTONS_")
	}), "PAYBUTTONS_TEST_CHILD=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	cmd.StdinPipe() // its other end is this process's: the system closes it when this one ends
	return cmd
}

// child is `paybuttons serve` as a child process, its output going to the file log.
type child struct {
	cmd      *exec.Cmd
	log, url string
	gone     atomic.Bool // it has exited, and cmd.ProcessState is set
}

func (c *child) output() string { text, _ := os.ReadFile(c.log); return string(text) }

// startChild serves db in a child process, killed when the test ends; it returns once it listens.
func startChild(t *testing.T, db string) *child {
	t.Helper()
	c := &child{cmd: childCommand(t, "serve", "-addr", "127.0.0.1:0", "-db", db),
		log: t.TempDir() + "/log"}
	out, err := os.Create(c.log)
	require(t, err == nil, "%v", err)
	defer out.Close() // the child has its own
	c.cmd.Stdout, c.cmd.Stderr = out, out
	require(t, c.cmd.Start() == nil, "cannot start the server")
	go func() { c.cmd.Wait(); c.gone.Store(true) }()
	t.Cleanup(func() { c.cmd.Process.Kill(); awaitTrue(c.gone.Load) })
	listening := regexp.MustCompile(`msg=listening url=(\S+) `) // the space: the whole port
	awaitTrue(func() bool { return listening.MatchString(c.output()) || c.gone.Load() })
	url := listening.FindStringSubmatch(c.output())
	require(t, url != nil, "the server exited, or did not listen within 20 s:\n%s", c.output())
	c.url = url[1]
	return c
}
