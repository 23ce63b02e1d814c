package main

import (
	"bytes"
	"cmp"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Two servers on one file (one through a symlink) and the commands work side by side, reading
// PAYBUTTONS_DB alone. serve never makes a key, and logs how to when the file has no live one.
func TestBesideTwoServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, sym, dest := dir+"/pay.db", dir+"/sym.db", dir+"/copy.db"
	hint := "WARN msg=\"no live API key: make one with `paybuttons keys create -account NAME`\""
	first := startChild(t, db)
	expect(t, strings.Contains(first.output(), hint), "a new file: got log\n%s", first.output())
	env := map[string]string{"PAYBUTTONS_DB": db, "PAYBUTTONS_ACCOUNT": "env", // never read:
		"PAYBUTTONS_READ_ONLY": "1"} // only serve's flags and -db come from the environment
	var secrets, ids [2]string // of acme: read-write, read-only
	t.Run("keys create prints the key alone on stdout", func(t *testing.T) {
		created := regexp.MustCompile(`^paybuttons: created (key_\w+) for account "acme"\n$`)
		for i, args := range [][]string{{"-account", "acme"}, {"-account", "acme", "-read-only"}} {
			stdout, stderr, _ := runCLI(t, env, 0, append([]string{"keys", "create"}, args...)...)
			id := created.FindStringSubmatch(stderr)
			require(t, regexp.MustCompile(`^pbk_[\w-]{43}\n$`).MatchString(stdout) && id != nil,
				"keys create %q: got stdout %q, stderr %q", args, stdout, stderr)
			secrets[i], ids[i] = strings.TrimSpace(stdout), id[1]
		}
	})
	if err := os.Symlink(db, sym); err != nil {
		t.Logf("no symlink here (%v): the second server opens the file by its name", err)
		sym = db
	}
	second := startChild(t, sym)
	expect(t, !strings.Contains(second.output(), "WARN"), "live keys: got\n%s", second.output())
	e1, e2 := &testEnv{t: t, url: first.url}, &testEnv{t: t, url: second.url}
	id := e1.create(secrets[0], createBody(nil))
	t.Run("OPTIONS *", func(t *testing.T) {
		options, _ := http.NewRequest("OPTIONS", first.url, nil)
		options.URL.Opaque = "*" // which net/http answers itself unless serve says not to
		resp, err := http.DefaultClient.Do(options)
		require(t, err == nil, "OPTIONS *: %v", err)
		body, _ := io.ReadAll(resp.Body)
		expect(t, resp.StatusCode == 404 && strings.Contains(string(body), `"code":"not_found"`),
			"OPTIONS *: got %d %s, want the envelope's 404", resp.StatusCode, body)
	})
	t.Run("one of ten If-Match updates across the servers wins", func(t *testing.T) {
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 10 {
			url := []string{e1.url, e2.url}[i%2] + "/product-payment/update/" + id
			wg.Go(func() {
				r, err := callAPI(http.DefaultClient, "POST", url, secrets[0],
					fmt.Sprintf(`{"amount":"%d"}`, i+1), "If-Match", `"1"`)
				if err == nil && r.status == 200 {
					wins.Add(1)
				} else if err != nil || r.status != 412 {
					t.Errorf("%s: got %d %s (%v), want 200 or 412", r.request, r.status, r.raw, err)
				}
			})
		}
		wg.Wait()
		etag := e1.do("GET", "/product-payment/get/"+id, secrets[0], "").header.Get("ETag")
		expect(t, wins.Load() == 1 && etag == `"2"`, "got %d wins, ETag %s; want 1, \"2\"",
			wins.Load(), etag)
	})
	t.Run("backup copies the file and never writes over one", func(t *testing.T) {
		out, _, _ := runCLI(t, env, 0, "backup", dest)
		copied, _ := os.ReadFile(dest)
		runCLI(t, env, 1, "backup", dest)
		now, _ := os.ReadFile(dest)
		held := regexp.MustCompile(`\{"id":"` + id + `".*"version":2,`).Match(copied)
		expect(t, strings.HasPrefix(out, "backup ") && held && bytes.Equal(now, copied),
			"got %q; %s at version 2 copied: %v; kept: %v", out, id, held, bytes.Equal(now, copied))
		out, _, _ = runCLI(t, env, 0, "check", "-db", dest)
		expect(t, out == "ok\n", "check of the copy: got %q, want ok", out)
		dests := []string{db + "-journal"}
		if os.Symlink(dir, dir+"/here") == nil { // the database's directory by a second name
			dests = append(dests, dir+"/here/pay.db-journal")
		}
		for _, dest := range dests {
			_, _, err := runCLI(t, env, 2, "backup", "-db", sym, dest)
			expect(t, strings.Contains(fmt.Sprint(err), "beside it"), "%s: got %v", dest, err)
		}
	})
	t.Run("backup syncs the copy, renames it, then syncs the directory", func(t *testing.T) {
		strace, err := exec.LookPath("strace")
		if err != nil || runtime.GOOS != "linux" {
			t.Skipf("no strace on this %s (%v): the order of syncs is not shown", runtime.GOOS, err)
		}
		cmd := childCommand(t, "backup", "-db", db, dir+"/synced.db")
		cmd.Path, cmd.Args = strace, append([]string{strace, "-f", "-y", "-o", dir + "/trace",
			"-e", "trace=openat,fsync,rename,renameat,renameat2", "-e", "signal=none"}, cmd.Args...)
		out, err := cmd.CombinedOutput()
		text, _ := os.ReadFile(dir + "/trace")
		// strace splits a call another thread interrupts: "<unfinished ...>", "<... resumed>".
		started, trace := map[string]string{}, []byte{}
		for _, line := range strings.SplitAfter(string(text), "\n") {
			pid, rest, _ := strings.Cut(line, " ")
			if call, ok := strings.CutSuffix(rest, " <unfinished ...>\n"); ok {
				started[pid], line = call, ""
			} else if _, returned, ok := strings.Cut(rest, " resumed>"); ok {
				line = pid + " " + started[pid] + returned
			}
			trace = append(trace, line...)
		}
		// The copy as backup opens it (O_EXCL); SQLite writes and syncs it through its own file.
		made := regexp.MustCompile(`synced\.db\.\d+\.partial", \S*O_EXCL.* = (\d+)<`).
			FindSubmatch(trace)
		require(t, err == nil && made != nil, "backup under strace: %v\n%s\n%s", err, out, trace)
		order := regexp.MustCompile(`(?s)fsync\(` + string(made[1]) + `<[^>]*\.partial>\) = 0.*` +
			`rename[^\n]*/synced\.db"\) = 0.*fsync\(\d+<` + regexp.QuoteMeta(dir) + `>\) = 0`)
		expect(t, order.Match(trace), "got\n%s\nwant fsync, rename, then fsync of %s", trace, dir)
	})
	t.Run("a failed backup leaves nothing", func(t *testing.T) {
		damaged := dir + "/damaged.db"
		runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", damaged)
		err := execSQL(damaged, `CREATE TABLE t AS SELECT hex(randomblob(99999)) AS x`)
		file, _ := os.OpenFile(damaged, os.O_WRONLY, 0)
		file.WriteAt(bytes.Repeat([]byte{0xff}, 4096), 20<<12) // a page in the middle of x
		file.Close()
		runCLI(t, nil, 1, "backup", "-db", damaged, dir+"/damaged-copy.db")
		left, _ := filepath.Glob(dir + "/damaged-copy.db*")
		out, _, _ := runCLI(t, nil, 1, "check", "-db", damaged)
		expect(t, err == nil && left == nil && strings.Contains(out, "Page"),
			"got %v left, check said %q (%v)", left, out, err)
	})
	t.Run("keys revoke stops a key at both servers", func(t *testing.T) {
		runCLI(t, env, 0, "keys", "revoke", ids[0])
		e1.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
		e2.do("GET", "/product-payment/get/"+id, secrets[0], "").want(t, 401, "unauthorized")
		list, _, _ := runCLI(t, env, 0, "keys", "list")
		runCLI(t, env, 0, "keys", "revoke", ids[0])
		again, _, _ := runCLI(t, env, 0, "keys", "list")
		runCLI(t, env, 1, "keys", "revoke", "key_UNKNOWN")
		expect(t, again == list, "keys list after a second revoke: got %q, want %q", again, list)
	})
	t.Run("keys list shows every field but the secret", func(t *testing.T) {
		list, _, _ := runCLI(t, env, 0, "keys", "list")
		lines := []string{ids[0] + "\tacme\tread-write\tcreated @\trevoked @\n",
			ids[1] + "\tacme\tread-only\tcreated @\trevoked never\n"}
		slices.Sort(lines) // keys made in one millisecond come in any order
		want := "^" + strings.ReplaceAll(strings.Join(lines, ""), "@", `20[\d-]+T[\d:.]+Z`) + "$"
		list = strings.Join(slices.Sorted(strings.Lines(list)), "")
		expect(t, regexp.MustCompile(want).MatchString(list), "got %q, want %s", list, want)
	})
	t.Run("with every key revoked, serve says how to make one", func(t *testing.T) {
		runCLI(t, env, 0, "keys", "revoke", ids[1])
		third := startChild(t, db).output()
		expect(t, strings.Contains(third, hint) && !strings.Contains(first.output()+third, "pbk_"),
			"got log\n%s", third)
	})
}

// A new file another process is making: the switch to WAL waits for its write lock, then finds its
// schema and makes none. The file holds only Litestream's tables at first; its name has # and %41.
func TestNewFileBesideAnotherProcess(t *testing.T) {
	t.Parallel()
	db := t.TempDir() + "/new#%41.db"
	err := execSQL(db, `CREATE TABLE _litestream_seq (id); CREATE TABLE _litestream_lock (id)`)
	require(t, err == nil, "make Litestream's tables: %v", err)
	other, _ := sql.Open("sqlite", sqliteURI(db, "_txlock=immediate&_pragma=busy_timeout(9000)"))
	defer other.Close()
	tx, err := other.Begin() // while it is held, the switch to WAL fails with BUSY at once
	if err == nil {
		_, err = tx.Exec(schema + fmt.Sprintf("; PRAGMA application_id = %d; "+
			"PRAGMA user_version = 1", applicationID))
	}
	require(t, err == nil, "make the schema as another process: %v", err)
	time.AfterFunc(time.Second, func() { tx.Commit() })
	// An account name of 64 characters, the longest:
	runCLI(t, nil, 0, "keys", "create", "-account", strings.Repeat("a", 64), "-db", db)
	plain, _ := sql.Open("sqlite", db) // the file by its name, not read as a URI
	defer plain.Close()
	n := 0
	err = plain.QueryRow(`SELECT count(*) FROM api_keys`).Scan(&n)
	expect(t, err == nil && n == 1, "got %d keys in %s (%v), want 1", n, db, err)
}

// Command-line mistakes exit 2 and unusable files 1, in one line, and leave no file behind.
func TestCommandLineRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	never, foreign, garbage, none := dir+"/never.db", dir+"/foreign.db", dir+"/not.db", dir+"/none"
	empty, versioned, future := dir+"/empty.db", dir+"/versioned.db", dir+"/v2.db"
	// Its table's name is Litestream's prefix but for its first character.
	err := execSQL(foreign, `CREATE TABLE xlitestream AS SELECT 'mine' AS body`)
	err2 := execSQL(versioned, `PRAGMA user_version = 7`) // no table, but a version of its own
	err3 := cmp.Or(os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 1000), 0o600),
		os.WriteFile(empty, nil, 0o600))
	runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", future)
	err4 := execSQL(future, `PRAGMA user_version = 2`) // a later paybuttons made it
	busy, err5 := net.Listen("tcp", "127.0.0.1:0")
	err = cmp.Or(err, err2, err3, err4, err5)
	require(t, err == nil, "%v", err)
	defer busy.Close()
	files := map[string][]byte{}
	for _, file := range []string{foreign, versioned, garbage, empty, future} {
		files[file], _ = os.ReadFile(file)
	}
	serve := "serve -addr 127.0.0.1:0 -db "
	for _, c := range []struct {
		status         int
		env, says, cmd string // env: NAME=value; says: what the error says
	}{
		{2, "", "frobnicate", "frobnicate"},
		{2, "", "keys create, keys list or keys revoke", "keys"},
		{2, "", "-provider-name", serve + never + " -provider-name Acme"}, // a removed flag
		{2, "", "-addr", serve + never + " -addr :99999"},
		{2, "", "must be host:port", "-db " + never + " -addr :99999"}, // serve, by default
		{2, "PAYBUTTONS_LOG_FORMAT=xml", "-log-format", serve + never},
		{2, "", "-account", "keys create -db " + never},
		{2, "", "-account", "keys create -account a/b -db " + never},
		{2, "", "-account", "keys create -account " + strings.Repeat("a", 65) + " -db " + never},
		{2, "", "takes 1 argument", "keys revoke -db " + never},
		{2, "", "takes 1 argument", "keys revoke -db " + never + " key_A key_B"},
		{2, "", "needs a DEST_FILE", "backup -db " + future + " "}, // the empty name
		{2, "", "SQLite keeps beside it", "backup -db " + future + " " + future},
		{2, "", "SQLite keeps beside it", "backup -db " + future + " " + future + "-journal"},
		{2, "", "SQLite keeps beside it", "backup -db " + future + " " + dir + "/./v2.db-wal"},
		{1, "PAYBUTTONS_LOG_FORMAT=xml", "address already in use", // the flag beats the variable
			serve + never + " -log-format json -addr " + busy.Addr().String()},
		{1, "", "not a paybuttons database", serve + foreign},
		{1, "", "not a paybuttons database", serve + versioned},
		{1, "", "not a paybuttons database", "check -db " + foreign},
		{1, "", "not a paybuttons database", "keys list -db " + empty},
		{1, "", "not a database", serve + garbage},
		{1, "", "schema version 2", serve + future},
		{1, "", "schema version 2", "keys list -db " + future},
		{1, "", "schema version 2", "check -db " + future},
		{1, "", "schema version 2", "backup -db " + future + " " + dir + "/copy.db"},
		{1, "", "does not exist", serve + none + "/x.db"},
		{1, "", "no database at", "keys list -db " + never},
		{1, "", "no database at", "keys revoke -db " + never + " key_X"},
		{1, "", "no database at", "check -db " + never},
		{1, "", none + `" does not exist`, "backup -db " + never + " " + none + "/c.db"},
	} {
		t.Run(c.cmd, func(t *testing.T) {
			name, value, _ := strings.Cut(c.env, "=")
			_, stderr, err := runCLI(t, map[string]string{name: value}, c.status,
				strings.Split(c.cmd, " ")...)
			says := fmt.Sprint(err)
			expect(t, strings.Contains(says, c.says) && !strings.Contains(says, "\n") &&
				stderr == "", "got %q, then %q; want one line saying %q", says, stderr, c.says)
		})
	}
	left, _ := filepath.Glob(dir + "/*.db") // and a -wal and -shm the read-only commands leave
	expect(t, len(left) == len(files), "got %v, want only the files made here", left)
	for file, before := range files {
		after, _ := os.ReadFile(file)
		expect(t, bytes.Equal(before, after), "%s changed", file)
	}
}
