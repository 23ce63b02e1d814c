package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"io"
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

// Two servers on one file (one through a symlink) and the commands work side by side: each sees what the
// others write, one of concurrent If-Match updates wins, and the commands read PAYBUTTONS_DB alone.
func TestBesideTwoServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, sym, dest := dir+"/pay.db", dir+"/sym.db", dir+"/copy.db"
	first := startChild(t, db)
	expect(t, strings.Contains(first.output(), "no API key exists: make one with `paybuttons keys create") &&
		!strings.Contains(first.output(), "pbk_"), "a first start off a terminal: got\n%s", first.output())
	if err := os.Symlink(db, sym); err != nil {
		t.Logf("no symlink here (%v): the second server opens the file by its name", err)
		sym = db
	}
	e1, e2 := &testEnv{t: t, url: first.url}, &testEnv{t: t, url: startChild(t, sym).url}
	env := map[string]string{"PAYBUTTONS_DB": db, "PAYBUTTONS_ACCOUNT": "env", "PAYBUTTONS_READ_ONLY": "1"}
	// keys create prints the key alone on stdout, and the servers take it at once.
	var secrets, ids [2]string // of acme: read-write, read-only
	created := regexp.MustCompile(`^paybuttons: created (key_\w+) for account "acme"\n$`)
	for i, args := range [][]string{{"-account", "acme"}, {"-account", "acme", "-read-only"}} {
		stdout, stderr, _ := runCLI(t, env, 0, append([]string{"keys", "create"}, args...)...)
		id := created.FindStringSubmatch(stderr)
		require(t, regexp.MustCompile(`^pbk_[\w-]{43}\n$`).MatchString(stdout) && id != nil,
			"keys create %q: got stdout %q, stderr %q", args, stdout, stderr)
		secrets[i], ids[i] = strings.TrimSpace(stdout), id[1]
	}
	id := e1.create(secrets[0], createBody(nil))
	e2.do("GET", "/product-payment/get/"+id, secrets[1], "").want(t, 200, "")
	options, _ := http.NewRequest("OPTIONS", first.url, nil)
	options.URL.Opaque = "*" // OPTIONS *, which net/http answers itself unless serve says not to
	resp, err := http.DefaultClient.Do(options)
	require(t, err == nil, "OPTIONS *: %v", err)
	body, _ := io.ReadAll(resp.Body)
	expect(t, resp.StatusCode == 404 && strings.Contains(string(body), `"code":"not_found"`),
		"OPTIONS *: got %d %s, want the envelope's 404", resp.StatusCode, body)
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
	runCLI(t, env, 0, "keys", "revoke", ids[0])
	e1.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
	e2.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
	list, _, _ := runCLI(t, env, 0, "keys", "list")
	runCLI(t, env, 0, "keys", "revoke", ids[0])
	again, _, _ := runCLI(t, env, 0, "keys", "list")
	runCLI(t, env, 1, "keys", "revoke", "key_UNKNOWN")
	expect(t, again == list, "keys list after a second revoke: got %q, want %q", again, list)
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
	out, _, _ := runCLI(t, env, 0, "backup", dest)
	copied, _ := os.ReadFile(dest)
	runCLI(t, env, 1, "backup", dest)
	now, _ := os.ReadFile(dest)
	held := bytes.Contains(copied, []byte(`{"id":"`+id+`"`)) && bytes.Contains(copied, []byte(`"version":2`))
	expect(t, strings.HasPrefix(out, "backup ") && held && bytes.Equal(now, copied), "backup: got %q; "+
		"a copy of %s at version 2: %v; kept by a second backup: %v", out, id, held, bytes.Equal(now, copied))
	// check says ok of the file and its copy, and finds the damage of an index that is not its table's.
	for _, file := range []string{db, dest} {
		out, _, _ := runCLI(t, env, 0, "check", "-db", file)
		expect(t, out == "ok\n", "check of %s: got %q, want ok", file, out)
	}
	err = execSQL(dest, `PRAGMA writable_schema = ON; UPDATE sqlite_schema SET sql = replace(sql,
		'state, id', 'id, state') WHERE name = 'buttons_by_state'`)
	out, _, _ = runCLI(t, env, 1, "check", "-db", dest)
	expect(t, err == nil && strings.Contains(out, "missing from index"), "damaged: got %q (%v)", out, err)
	if err := os.Link(db, dir+"/hard.db"); err != nil || runtime.GOOS == "windows" { // no link count there
		t.Logf("no hard link counted here (%v): that case is left out", err)
	} else {
		_, _, err := runCLI(t, env, 1, "serve", "-db", dir+"/hard.db", "-addr", "127.0.0.1:0")
		expect(t, strings.Contains(fmt.Sprint(err), "has 2 hard links"), "two hard links: got %v", err)
	}
}

// Commands making one new file at once all succeed: one makes the schema, under its lock, and each
// retries the switch to WAL while another makes it (a race lost about once in 30 rounds of 16, so
// the long tests run 100). A file holding only Litestream's tables is new; '#' and '%41' are part of a
// file's name.
func TestNewFileMadeAtOnce(t *testing.T) {
	t.Parallel()
	rounds, dir := 1, t.TempDir()
	if os.Getenv("PAYBUTTONS_LONG_TESTS") == "1" {
		rounds = 100
	}
	for round := range rounds {
		db := fmt.Sprintf("%s/%d#%%41.db", dir, round)
		if round == 0 {
			err := execSQL(db, `CREATE TABLE _litestream_seq (id INTEGER); CREATE TABLE _litestream_lock (id INTEGER)`)
			require(t, err == nil, "make Litestream's tables: %v", err)
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() { runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", db) })
		}
		wg.Wait()
		keys, _, _ := runCLI(t, nil, 0, "keys", "list", "-db", db)
		plain, _ := sql.Open("sqlite", db) // the file by its name, not read as a URI
		n := 0
		err := plain.QueryRow(`SELECT count(*) FROM api_keys`).Scan(&n)
		plain.Close()
		expect(t, strings.Count(keys, "\n") == 16 && n == 16, "16 keys create at once: got keys %q, "+
			"%d in the file (%v)", keys, n, err)
	}
}

// Command-line mistakes exit 2 and unusable files 1, in one line, and leave no file behind.
func TestCommandLineRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	never, foreign, garbage, future := dir+"/never.db", dir+"/foreign.db", dir+"/not.db", dir+"/v2.db"
	// Its table's name is Litestream's prefix but for its first character.
	err := execSQL(foreign, `CREATE TABLE xlitestream (body TEXT); INSERT INTO xlitestream VALUES ('mine')`)
	err2 := os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", future)
	err3 := execSQL(future, `PRAGMA user_version = 2`) // a later paybuttons made it
	busy, err4 := net.Listen("tcp", "127.0.0.1:0")
	require(t, cmp.Or(err, err2, err3, err4) == nil, "%v", cmp.Or(err, err2, err3, err4))
	defer busy.Close()
	before, _ := os.ReadFile(foreign)
	serve := func(args ...string) []string {
		return append([]string{"serve", "-addr", "127.0.0.1:0", "-db"}, args...)
	}
	for _, c := range []struct {
		status    int
		env, says string // NAME=value; what the error says
		args      []string
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
		{1, "PAYBUTTONS_LOG_FORMAT=xml", "address already in use", // the flag beats the variable
			serve(never, "-log-format", "json", "-addr", busy.Addr().String())},
		{1, "", "not a paybuttons database", serve(foreign)},
		{1, "", "not a paybuttons database", []string{"check", "-db", foreign}},
		{1, "", "not a database", serve(garbage)},
		{1, "", "schema version 2", serve(future)},
		{1, "", "does not exist", serve(dir + "/none/x.db")},
		{1, "", "no database at", []string{"keys", "list", "-db", never}},
		{1, "", "no database at", []string{"keys", "revoke", "-db", never, "key_X"}},
		{1, "", "no database at", []string{"check", "-db", never}},
		{1, "", `directory "` + dir + `/none" does not exist`,
			[]string{"backup", "-db", never, dir + "/none/c.db"}},
	} {
		name, value, _ := strings.Cut(c.env, "=")
		_, stderr, err := runCLI(t, map[string]string{name: value}, c.status, c.args...)
		says := fmt.Sprint(err)
		expect(t, strings.Contains(says, c.says) && !strings.Contains(says, "\n") && stderr == "",
			"%q: got %q, then %q; want an error saying %q in a line", c.args, says, stderr, c.says)
	}
	files, _ := os.ReadDir(dir)
	after, _ := os.ReadFile(foreign)
	expect(t, len(files) == 3 && bytes.Equal(before, after), "got %v, foreign.db changed: %v; want the "+
		"three files made here, as they were", files, !bytes.Equal(before, after))
}

// On a terminal (here a pseudo-terminal's master) serve mints a first key, once; never to /dev/null.
func TestFirstKeyOnATerminal(t *testing.T) {
	tty, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil || !isTerminal(tty) {
		t.Skipf("no pseudo-terminal here (%v)", err)
	}
	defer tty.Close()
	null, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer null.Close()
	st, err := openStore(t.TempDir()+"/new.db", true)
	require(t, err == nil, "%v", err)
	defer st.close()
	for i, stderr := range []*os.File{null, tty, tty} {
		err = firstKey(context.Background(), st, stderr, slog.New(slog.DiscardHandler))
		keys, _ := listKeys(context.Background(), st.reader)
		expect(t, err == nil && len(keys) == min(i, 1) && (i == 0 || keys[0].Account == "default" &&
			!keys[0].ReadOnly), "to %s: got %v, keys %v; want %d read-write key for default", stderr.Name(), err,
			keys, min(i, 1))
	}
}

// A file this process cannot write is refused by serve at start, and read by keys list and check.
func TestReadOnlyFile(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "paybuttons") // not t.TempDir: its parents admit no other user
	require(t, err == nil, "%v", err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	db := dir + "/ro.db"
	runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", db)
	require(t, os.Chmod(db, 0o444) == nil && os.Chmod(dir, 0o777) == nil, "chmod %s", db)
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
		status := cmd.ProcessState.ExitCode()
		expect(t, status == c.status && strings.Contains(string(out), c.says), "%q on a read-only file: "+
			"got exit %d, %s; want %d, saying %q", c.args, status, out, c.status, c.says)
	}
}
