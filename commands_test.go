package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
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
	"testing"
)

// Two servers on one file, one through a symlink, serve together: each reads what the other writes,
// and of concurrent If-Match updates split across them one wins. The commands work beside them and the
// servers see what they change. The commands read PAYBUTTONS_DB, and no other variable.
func TestBesideTwoServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, dest := dir+"/pay.db", dir+"/copy.db"
	first, second := startChild(t, db), (*child)(nil)
	expect(t, strings.Contains(first.output(), "no API key exists: make one with `paybuttons keys create") &&
		!strings.Contains(first.output(), "pbk_"), "a first start off a terminal: got\n%s", first.output())
	if err := os.Symlink(db, dir+"/sym.db"); err != nil {
		t.Logf("no symlink here (%v): the second server opens the file by its name", err)
		second = startChild(t, db)
	} else {
		second = startChild(t, dir+"/sym.db")
	}
	env := map[string]string{"PAYBUTTONS_DB": db, "PAYBUTTONS_ACCOUNT": "env", "PAYBUTTONS_READ_ONLY": "1"}
	// keys create prints the key alone on stdout, and the servers take it at once.
	var secrets, ids [2]string // of acme: read-write, read-only
	for i, args := range [][]string{{"-account", "acme"}, {"-account", "acme", "-read-only"}} {
		stdout, stderr, err := runCLI(t, env, append([]string{"keys", "create"}, args...)...)
		id := regexp.MustCompile(`^paybuttons: created (key_\w+) for account "acme"\n$`).FindStringSubmatch(stderr)
		require(t, err == nil && regexp.MustCompile(`^pbk_[\w-]{43}\n$`).MatchString(stdout) && id != nil,
			"keys create %q: got %v, stdout %q, stderr %q", args, err, stdout, stderr)
		secrets[i], ids[i] = strings.TrimSpace(stdout), id[1]
	}
	e1, e2 := &testEnv{t: t, url: first.url}, &testEnv{t: t, url: second.url}
	id := e1.create(secrets[0], createBody(nil))
	e2.do("GET", "/product-payment/get/"+id, secrets[1], "").want(t, 200, "")
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 10 {
		url := []string{e1.url, e2.url}[i%2]
		wg.Go(func() {
			r, err := callAPI(http.DefaultClient, "POST", url+"/product-payment/update/"+id, secrets[0],
				fmt.Sprintf(`{"amount":"%d"}`, i+1), "If-Match", `"1"`)
			if err == nil && r.status == 200 {
				wins.Add(1)
			} else if err != nil || r.status != 412 {
				t.Errorf("%s: got %d %s (%v), want 200 or 412", r.request, r.status, r.raw, err)
			}
		})
	}
	wg.Wait()
	r := e1.do("GET", "/product-payment/get/"+id, secrets[0], "")
	expect(t, wins.Load() == 1 && r.header.Get("ETag") == `"2"`, "10 updates with If-Match: \"1\": got %d "+
		"wins, then %v; want one, version 2", wins.Load(), r.header)
	// keys revoke: both servers refuse the key at its next request. Revoking it again changes nothing;
	// an unknown id is an error.
	_, _, err := runCLI(t, env, "keys", "revoke", ids[0])
	require(t, err == nil, "keys revoke: %v", err)
	e1.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
	e2.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
	list, _, _ := runCLI(t, env, "keys", "list")
	_, _, err = runCLI(t, env, "keys", "revoke", ids[0])
	again, _, _ := runCLI(t, env, "keys", "list")
	_, _, err2 := runCLI(t, env, "keys", "revoke", "key_UNKNOWN")
	expect(t, err == nil && again == list && exitStatus(err2) == 1, "revoke again: %v; unknown: %v", err, err2)
	// keys list shows every field but the secret, a key a line (keys made in one millisecond come in any
	// order).
	lines := []string{ids[0] + "\tacme\tread-write\tcreated @\trevoked @\n",
		ids[1] + "\tacme\tread-only\tcreated @\trevoked never\n"}
	slices.Sort(lines)
	want := "^" + strings.ReplaceAll(strings.Join(lines, ""), "@", `20[\d-]+T[\d:.]+Z`) + "$"
	list = strings.Join(slices.Sorted(strings.Lines(list)), "")
	expect(t, regexp.MustCompile(want).MatchString(list), "keys list, sorted: got %q, want %s", list, want)
	// backup writes a copy that holds the button, never writes over a file, and passes over what a killed
	// backup left.
	os.WriteFile(dest+".partial", []byte("half a copy"), 0o600)
	out, _, err := runCLI(t, env, "backup", dest)
	expect(t, err == nil && strings.HasPrefix(out, "backup "), "backup: got %q (%v), want a copy", out, err)
	copied, _ := os.ReadFile(dest)
	_, _, err = runCLI(t, env, "backup", dest)
	now, _ := os.ReadFile(dest)
	expect(t, exitStatus(err) == 1 && bytes.Equal(now, copied), "backup over a file: got %v, want 1", err)
	expect(t, bytes.Contains(copied, []byte(`{"id":"`+id+`"`)) && bytes.Contains(copied, []byte(`"version":2`)),
		"the copy does not hold %s at version 2", id)
	// check says ok of the file and its copy, and finds the damage of an index that is not its table's.
	for _, file := range []string{db, dest} {
		out, _, err := runCLI(t, env, "check", "-db", file)
		expect(t, err == nil && out == "ok\n", "check of %s: got %q (%v), want ok", file, out, err)
	}
	damaged, _ := sql.Open("sqlite", dest)
	_, err = damaged.Exec(`PRAGMA writable_schema = ON; UPDATE sqlite_schema SET sql = replace(sql, 'state, id',
		'id, state') WHERE name = 'buttons_by_state'`)
	damaged.Close()
	out, _, err2 = runCLI(t, env, "check", "-db", dest)
	expect(t, err == nil && exitStatus(err2) == 1 && strings.Contains(out, "missing from index"),
		"check of a damaged copy: got %q, %v; want exit status 1 and the damage", out, err2)
	if err := os.Link(db, dir+"/hard.db"); err != nil || runtime.GOOS == "windows" { // no link count there
		t.Logf("no hard link counted here (%v): that case is left out", err)
	} else {
		_, _, err := runCLI(t, env, "serve", "-db", dir+"/hard.db", "-addr", "127.0.0.1:0")
		expect(t, exitStatus(err) == 1 && strings.Contains(fmt.Sprint(err), "has 2 hard links"),
			"serve on a file with two hard links: got %v, want exit status 1 naming them", err)
	}
}

// Command-line mistakes exit 2 and unusable files 1, in one line, and leave no file behind.
func TestCommandLineRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	never, foreign, garbage, future := dir+"/never.db", dir+"/foreign.db", dir+"/not.db", dir+"/v2.db"
	other, _ := sql.Open("sqlite", foreign)
	_, err := other.Exec(`CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine')`)
	other.Close()
	err2 := os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	_, _, err3 := runCLI(t, nil, "keys", "create", "-account", "a", "-db", future)
	other, _ = sql.Open("sqlite", future)
	_, err4 := other.Exec(`PRAGMA user_version = 2`) // a later paybuttons made it
	other.Close()
	busy, err5 := net.Listen("tcp", "127.0.0.1:0")
	require(t, cmp.Or(err, err2, err3, err4, err5) == nil, "%v", cmp.Or(err, err2, err3, err4, err5))
	defer busy.Close()
	before, _ := os.ReadFile(foreign)
	serve := func(args ...string) []string {
		return append([]string{"serve", "-addr", "127.0.0.1:0", "-db"}, args...)
	}
	for _, c := range []struct {
		status int
		env    string // NAME=value
		says   string // in the error
		args   []string
	}{
		{2, "", "frobnicate", []string{"frobnicate"}},
		{2, "", "keys create, keys list or keys revoke", []string{"keys"}},
		{2, "", "-rate", serve(never, "-rate", "5")},   // removed
		{2, "", "-burst", serve(never, "-burst", "5")}, // removed
		{2, "", "-addr", serve(never, "-addr", ":99999")},
		{2, "", "-tls-key", serve(never, "-tls-cert", "c.pem")},
		{2, "PAYBUTTONS_LOG_FORMAT=xml", "-log-format", serve(never)},
		{2, "PAYBUTTONS_PROVIDER_NAME=Stripe", "-provider-name", serve(never)},
		{2, "", "-provider-name", serve(never, "-provider-name", "StripeConnect")},
		{2, "", "-account", []string{"keys", "create", "-db", never}},
		{2, "", "-account", []string{"keys", "create", "-account", "a b", "-db", never}},
		{2, "", "-account", []string{"keys", "create", "-account", strings.Repeat("a", 65), "-db", never}},
		{2, "", "takes 1 argument", []string{"keys", "revoke", "-db", never}},
		{2, "", "takes 1 argument", []string{"keys", "revoke", "-db", never, "key_A", "key_B"}},
		{1, "PAYBUTTONS_LOG_FORMAT=xml", "address already in use",
			serve(never, "-log-format", "json", "-addr", busy.Addr().String())}, // the flag beats the variable
		{1, "", "not a paybuttons database", serve(foreign)},
		{1, "", "not a paybuttons database", []string{"check", "-db", foreign}},
		{1, "", "not a database", serve(garbage)},
		{1, "", "schema version 2", serve(future)},
		{1, "", "does not exist", serve(dir + "/none/x.db")},
		{1, "", "no database at", []string{"keys", "list", "-db", never}},
		{1, "", "no database at", []string{"keys", "revoke", "-db", never, "key_X"}},
		{1, "", "no database at", []string{"check", "-db", never}},
		{1, "", `directory "` + dir + `/none" does not exist`, []string{"backup", "-db", never, dir + "/none/c.db"}},
	} {
		name, value, _ := strings.Cut(c.env, "=")
		_, stderr, err := runCLI(t, map[string]string{name: value}, c.args...)
		expect(t, exitStatus(err) == c.status && strings.Contains(fmt.Sprint(err), c.says) && stderr == "" &&
			!strings.Contains(fmt.Sprint(err), "\n"), "%q: got %v, then %q; want exit status %d saying %q in a line",
			c.args, err, stderr, c.status, c.says)
	}
	files, _ := os.ReadDir(dir)
	after, _ := os.ReadFile(foreign)
	expect(t, len(files) == 3 && bytes.Equal(before, after), "got %v, foreign.db changed: %v; want the three files "+
		"made here, as they were", files, !bytes.Equal(before, after))
}

// Commands making a new file at once all succeed: the schema is made once, under the lock.
func TestFirstOpensAtOnce(t *testing.T) {
	t.Parallel()
	for round := range 4 {
		db, errs := fmt.Sprint(t.TempDir(), "/new", round, ".db"), make(chan error, 6)
		for range 6 {
			go func() { _, _, err := runCLI(t, nil, "keys", "create", "-account", "a", "-db", db); errs <- err }()
		}
		err := errors.Join(<-errs, <-errs, <-errs, <-errs, <-errs, <-errs)
		list, _, _ := runCLI(t, nil, "keys", "list", "-db", db)
		expect(t, err == nil && strings.Count(list, "\n") == 6, "round %d: got %v, then keys %q", round, err, list)
	}
}

// On a terminal (to the standard library, a character device) serve mints a first key, once; off one,
// TestBesideTwoServers sees it mint none.
func TestFirstKeyOnATerminal(t *testing.T) {
	st, err := openStore(t.TempDir()+"/new.db", true)
	tty, err2 := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require(t, cmp.Or(err, err2) == nil && isTerminal(tty), "%s: no character device here (%v)", os.DevNull,
		cmp.Or(err, err2))
	defer st.close()
	defer tty.Close()
	for range 2 {
		err = firstKey(context.Background(), st, tty, slog.New(slog.DiscardHandler))
		keys, _ := listKeys(context.Background(), st.reader)
		expect(t, err == nil && len(keys) == 1 && keys[0].Account == "default" && !keys[0].ReadOnly,
			"on a terminal: got %v, keys %v; want one read-write key for default", err, keys)
	}
}

// A file this process cannot write is refused by serve at start, and read by keys list and check.
func TestReadOnlyFile(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "paybuttons") // not t.TempDir: its parents admit no other user
	require(t, err == nil, "%v", err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	db := dir + "/ro.db"
	_, _, err = runCLI(t, nil, "keys", "create", "-account", "a", "-db", db)
	require(t, err == nil && os.Chmod(db, 0o444) == nil && os.Chmod(dir, 0o777) == nil, "%v", err)
	binary, err := os.ReadFile(os.Args[0]) // in a folder any user may read
	require(t, err == nil && os.WriteFile(dir+"/test", binary, 0o755) == nil, "%v", err)
	runuser, err := exec.LookPath("runuser")
	if os.Geteuid() == 0 && (err != nil || runtime.GOOS != "linux") {
		t.Skip("running as root without runuser: no user to run the commands as")
	}
	for _, c := range []struct {
		status int
		says   string
		args   []string
	}{
		{1, "readonly", []string{"serve", "-addr", "127.0.0.1:0", "-db", db}},
		{0, "\ta\tread-write\t", []string{"keys", "list", "-db", db}},
		{0, "ok\n", []string{"check", "-db", db}},
	} {
		cmd := childCommand(t, c.args...)
		cmd.Path, cmd.Args[0] = dir+"/test", dir+"/test"
		if os.Geteuid() == 0 { // root writes any file: the command runs as nobody
			cmd.Path, cmd.Args = runuser, append([]string{runuser, "-u", "nobody", "--"}, cmd.Args...)
		}
		out, _ := cmd.CombinedOutput()
		expect(t, cmd.ProcessState.ExitCode() == c.status && strings.Contains(string(out), c.says),
			"%q on a read-only file: got exit %d, %s; want %d, saying %q", c.args, cmd.ProcessState.ExitCode(),
			out, c.status, c.says)
	}
}
