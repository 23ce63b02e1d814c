package main

import (
	"bytes"
	"cmp"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// The commands work beside a running server, which sees what they change at its next request.
func TestBesideAServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, dest := dir+"/pay.db", dir+"/copy.db"
	srv := startChild(t, db)
	e := &testEnv{t: t, url: srv.url} // for e.do
	minted := regexp.MustCompile(`paybuttons: no API key existed; created (key_\w+) for account ` +
		`"default". It is shown once, here:\n(pbk_[\w-]{43})\n`).FindStringSubmatch(srv.output())
	require(t, minted != nil, "no first key in the first start's output:\n%s", srv.output())
	// keys create prints the key alone on stdout, and the server takes it at once.
	var secrets, ids [2]string // of acme: read-write, read-only
	for i, args := range [][]string{{"-account", "acme"}, {"-account", "acme", "-read-only"}} {
		stdout, stderr, err := runCLI(t, nil, append([]string{"keys", "create", "-db", db}, args...)...)
		id := regexp.MustCompile(`^paybuttons: created (key_\w+) for account "acme"\n$`).FindStringSubmatch(
			stderr)
		require(t, err == nil && regexp.MustCompile(`^pbk_[\w-]{43}\n$`).MatchString(stdout) && id != nil,
			"keys create %q: got %v, stdout %q, stderr %q; want the key alone", args, err, stdout, stderr)
		secrets[i], ids[i] = strings.TrimSpace(stdout), id[1]
	}
	button := e.create(secrets[0], createBody(nil))
	// keys list shows every field but the secret, in lines sorted by id (keys made in one millisecond
	// come in any order); the last use once the server, which writes it after it answers, has.
	lines := []string{minted[1] + "\tdefault\tread-write\tcreated @\tlast used never\trevoked never\n",
		ids[0] + "\tacme\tread-write\tcreated @\tlast used @\trevoked never\n",
		ids[1] + "\tacme\tread-only\tcreated @\tlast used never\trevoked never\n"}
	slices.Sort(lines)
	at := `20[\d-]+T[\d:.]+Z`
	want := regexp.MustCompile("^" + strings.ReplaceAll(strings.Join(lines, ""), "@", at) + "$")
	var list string
	listed := awaitTrue(func() bool {
		out, _, _ := runCLI(t, nil, "keys", "list", "-db", db)
		list = strings.Join(slices.Sorted(strings.Lines(out)), "")
		return want.MatchString(list)
	})
	expect(t, listed, "keys list, sorted: got %q, want it to match %s", list, want)
	// keys revoke: the server refuses the key at its next request; an unknown id is an error.
	_, _, err := runCLI(t, nil, "keys", "revoke", "-db", db, ids[0])
	require(t, err == nil, "keys revoke: %v", err)
	e.do("GET", "/product-payment/get/"+button, secrets[0], "").want(t, 401, "unauthorized")
	_, _, err = runCLI(t, nil, "keys", "revoke", "-db", db, "key_UNKNOWN")
	expect(t, exitStatus(err) == 1, "keys revoke of an unknown id: got %v, want exit status 1", err)
	// backup writes a copy that holds the button, and never writes over a file.
	out, _, err := runCLI(t, nil, "backup", "-db", db, dest)
	expect(t, err == nil && strings.HasPrefix(out, "backup "), "backup: got %q (%v), want a copy", out, err)
	copied, _ := os.ReadFile(dest)
	_, _, err = runCLI(t, nil, "backup", "-db", db, dest)
	now, _ := os.ReadFile(dest)
	expect(t, exitStatus(err) == 1 && bytes.Equal(now, copied), "backup over a file: got %v, want 1", err)
	copyDB, _ := sql.Open("sqlite", sqliteURI(dest, "mode=ro"))
	var name string
	err = copyDB.QueryRow(`SELECT button->>'productName' FROM buttons WHERE id = ?`, button).Scan(&name)
	copyDB.Close()
	expect(t, err == nil && name == "Pro plan", "the copy's button: got %q (%v), want Pro plan", name, err)
	// check says ok of the file and its copy, and finds the copy damaged.
	for _, file := range []string{db, dest} {
		out, _, err := runCLI(t, nil, "check", "-db", file)
		expect(t, err == nil && out == "ok\n", "check of %s: got %q (%v), want ok", file, out, err)
	}
	for i := 4096; i < 2*4096; i += 7 { // page 2, a table's root
		copied[i] ^= 0x5a
	}
	os.WriteFile(dest, copied, 0o600)
	_, _, err = runCLI(t, nil, "check", "-db", dest)
	expect(t, exitStatus(err) == 1 && regexp.MustCompile(`damaged|malformed`).MatchString(fmt.Sprint(err)),
		"check of a damaged copy: got %v, want exit status 1 naming the damage", err)
	// A second server, by the file's name, a symlink or a hard link, is refused at once while the first
	// serves on. It runs in this process: on 192.0.2.1, no address here, it could never serve.
	secondServer := func(name, says string) {
		start := time.Now()
		_, _, err := runCLI(t, nil, "serve", "-db", name, "-addr", "192.0.2.1:1")
		took := time.Since(start)
		expect(t, exitStatus(err) == 1 && strings.Contains(fmt.Sprint(err), says) && took < 5*time.Second,
			"serve on %s: got %v after %v, want exit status 1 at once saying %q", name, err, took, says)
		e.do("GET", "/healthz", "", "").want(t, 200, "")
	}
	secondServer(db, "is in use by another server")
	if err := os.Symlink(db, dir+"/sym.db"); err != nil {
		t.Logf("no symlink here (%v): that case is left out", err)
	} else {
		secondServer(dir+"/sym.db", "is in use by another server")
	}
	if err := os.Link(db, dir+"/hard.db"); err != nil || runtime.GOOS == "windows" { // no link count there
		t.Logf("no hard link counted here (%v): that case is left out", err)
	} else {
		secondServer(dir+"/hard.db", "has 2 hard links")
	}
}

// Command-line mistakes exit 2 and unusable files 1, in one line, changing no file; flags beat variables.
func TestCommandLineRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	never, busy, foreign, garbage := dir+"/never.db", dir+"/busy.db", dir+"/foreign.db", dir+"/not.db"
	other, _ := sql.Open("sqlite", foreign)
	_, err := other.Exec(`CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine')`)
	other.Close()
	err2 := os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	require(t, cmp.Or(err, err2) == nil, "%v", cmp.Or(err, err2))
	before, _ := os.ReadFile(foreign)
	// 192.0.2.1 is no address of this machine: a serve that wrongly started would fail, never serve.
	serve := func(args ...string) []string {
		return append([]string{"serve", "-addr", "192.0.2.1:1", "-db"}, args...)
	}
	for _, c := range []struct {
		status int
		rate   string // PAYBUTTONS_RATE
		says   string // in the error
		args   []string
	}{
		{2, "", "frobnicate", []string{"frobnicate"}},
		{2, "", "-metrics", serve(never, "-metrics")},             // removed
		{2, "", "-max-conns", serve(never, "-max-conns", "9")},    // removed
		{2, "", "-log-level", serve(never, "-log-level", "warn")}, // removed
		{2, "", "-addr", serve(never, "-addr", ":99999")},
		{2, "", "-rate", serve(never, "-rate", "NaN")},
		{2, "", "-burst", serve(never, "-burst", "0")},
		{2, "", "-tls-key", serve(never, "-tls-cert", "c.pem")},
		{2, "", "-account", []string{"keys", "create", "-db", never}},
		{2, "fast", "PAYBUTTONS_RATE", serve(never)},
		{1, "1e-9", "192.0.2.1:1", serve(busy, "-rate", "5")}, // the flag beats the variable
		{1, "", "not a paybuttons database", serve(foreign)},
		{1, "", "not a database", serve(garbage)},
		{1, "", "does not exist", serve(dir + "/none/x.db")},
	} {
		_, stderr, err := runCLI(t, map[string]string{"PAYBUTTONS_RATE": c.rate}, c.args...)
		expect(t, exitStatus(err) == c.status && strings.Contains(fmt.Sprint(err), c.says),
			"%q: got %v, want exit status %d saying %q", c.args, err, c.status, c.says)
		expect(t, stderr == "" && !strings.Contains(fmt.Sprint(err), "\n"),
			"%q: got %q, then stderr %q; want one line, nothing else", c.args, err, stderr)
	}
	_, err = os.Stat(never)
	expect(t, err != nil, "got %s made by refused commands", never)
	after, _ := os.ReadFile(foreign)
	expect(t, bytes.Equal(before, after), "got %s changed by a refused serve", foreign)
	list, _, err := runCLI(t, nil, "keys", "list", "-db", busy)
	expect(t, list == "" && err == nil, "got keys %q (%v) after failed starts, want none minted", list, err)
}

// Two commands making a new file at once both succeed: the schema is made once, under the lock.
func TestFirstOpensAtOnce(t *testing.T) {
	for round := range 3 {
		db, errs := fmt.Sprint(t.TempDir(), "/new", round, ".db"), make(chan error, 2)
		create := []string{"keys", "create", "-account", "a", "-db", db}
		for range 2 {
			go func() { _, _, err := runCLI(t, nil, create...); errs <- err }()
		}
		err, err2 := <-errs, <-errs
		list, _, _ := runCLI(t, nil, "keys", "list", "-db", db)
		expect(t, err == nil && err2 == nil && strings.Count(list, "\n") == 2, "round %d: got %v and %v, "+
			"then keys %q; want two keys", round, err, err2, list)
	}
}

// A file this process cannot write is refused at start, not at its first write.
func TestUnwritableFileIsRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "paybuttons") // not t.TempDir: its parents admit no other user
	require(t, err == nil, "%v", err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	db := dir + "/ro.db"
	_, _, err = runCLI(t, nil, "keys", "create", "-account", "a", "-db", db)
	require(t, err == nil && os.Chmod(db, 0o444) == nil && os.Chmod(dir, 0o777) == nil, "%v", err)
	cmd := childCommand("serve", "-addr", "192.0.2.1:1", "-db", db)
	if os.Geteuid() == 0 { // root writes any file: the server runs as nobody
		runuser, err := exec.LookPath("runuser")
		if err != nil || runtime.GOOS != "linux" {
			t.Skip("running as root without runuser: no user to run the server as")
		}
		binary, err := os.ReadFile(os.Args[0]) // in a folder nobody may read
		require(t, err == nil && os.WriteFile(dir+"/test", binary, 0o755) == nil, "%v", err)
		cmd.Args[0] = dir + "/test"
		cmd = exec.Command(runuser, append([]string{"-u", "nobody", "--"}, cmd.Args...)...)
		cmd.Env = childCommand().Env
	}
	out, _ := cmd.CombinedOutput()
	expect(t, cmd.ProcessState.ExitCode() == 1 && strings.Contains(string(out), "readonly"),
		"serve on a read-only file: got exit %d, %s; want 1, naming it", cmd.ProcessState.ExitCode(), out)
}
