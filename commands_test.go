package main

import (
	"bytes"
	"cmp"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// runChild runs cmd (see childCommand), killed after 5 s, and returns "exit STATUS: " (-1 if killed) and its output.
func runChild(cmd *exec.Cmd) string {
	defer time.AfterFunc(5*time.Second, func() { cmd.Process.Kill() }).Stop()
	out, _ := cmd.CombinedOutput()
	return fmt.Sprintf("exit %d: %s", cmd.ProcessState.ExitCode(), out)
}

// Beside a server that minted the first key: keys create prints only a key, at once usable; keys list shows scopes,
// last uses, revocations, no secret; a revoked key fails its next request; backup writes a sound copy, never over a
// file; check finds damage; a second server, by any name of the file, is refused; after a SIGKILL, serve starts as is.
func TestBesideAServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, dest, symlink, hardLink := dir+"/pay.db", dir+"/copy.db", dir+"/sym.db", dir+"/hard.db"
	cli := func(args ...string) (string, error) { out, _, err := runCLI(t, nil, args...); return out, err }
	srv := startChild(t, db)
	minted := regexp.MustCompile(`paybuttons: no API key existed; created (key_\w+) for account "default". It is ` +
		`shown once, here:\n(pbk_[\w-]{43})\n`).FindStringSubmatch(srv.output())
	if minted == nil {
		t.Fatalf("no first key in the first start's output:\n%s", srv.output())
	}
	api := func(method, path, key string, want int) string {
		t.Helper()
		r, err := callAPI(http.DefaultClient, method, srv.url+path, key, map[bool]string{true: createBody(nil)}[method == "POST"])
		if err != nil || r.status != want {
			t.Errorf("%s: got %d %s (%v), want %d", r.request, r.status, r.raw, err, want)
		}
		return r.dataString()
	}
	var secrets, ids [2]string // of acme: read-write, read-only
	for i, args := range [][]string{{"-account", "acme"}, {"-account", "acme", "-read-only"}} {
		stdout, stderr, err := runCLI(t, nil, append([]string{"keys", "create", "-db", db}, args...)...)
		id := regexp.MustCompile(`^paybuttons: created (key_\w+) for account "acme"\n$`).FindStringSubmatch(stderr)
		if !regexp.MustCompile(`^pbk_[\w-]{43}\n$`).MatchString(stdout) || err != nil || id == nil {
			t.Fatalf("keys create %q: got %v, stdout %q, stderr %q; want only the key on stdout", args, err, stdout, stderr)
		}
		secrets[i], ids[i] = strings.TrimSpace(stdout), id[1]
	}
	button := api("POST", "/product-payment/create", secrets[0], 200) // at once: the server asks the file each time
	// Every field pinned, so no secret; sorted, as keys made in one millisecond come in any order. The server writes a
	// last use after it answers: keys list shows it once written.
	lines := []string{minted[1] + "\tdefault\tread-write\tcreated @\tlast used never\trevoked never\n", ids[0] +
		"\tacme\tread-write\tcreated @\tlast used @\trevoked never\n", ids[1] +
		"\tacme\tread-only\tcreated @\tlast used never\trevoked never\n"}
	slices.Sort(lines)
	want, list := regexp.MustCompile("^"+strings.ReplaceAll(strings.Join(lines, ""), "@", `20\d\d-[\d-]+T[\d:.]+Z`)+"$"), ""
	sorted := func(out string, _ error) string { return strings.Join(slices.Sorted(strings.Lines(out)), "") }
	if !awaitTrue(func() bool { list = sorted(cli("keys", "list", "-db", db)); return want.MatchString(list) }) {
		t.Errorf("keys list, sorted: got %q, want it to match %s", list, want)
	}
	_, err := cli("keys", "revoke", "-db", db, ids[0])
	api("GET", "/product-payment/get/"+button, secrets[0], 401) // the server's next request
	_, unknown := cli("keys", "revoke", "-db", db, "key_UNKNOWN")
	if list, _ = cli("keys", "list", "-db", db); err != nil || unknown == nil || exitStatus(unknown) != 1 ||
		!regexp.MustCompile(ids[0]+`\t.*\trevoked 20\S+\n`).MatchString(list) {
		t.Errorf("keys revoke: got %v, then %q; an unknown id: %v; want it revoked, and exit 1", err, list, unknown)
	}
	out, err := cli("backup", "-db", db, dest)
	copied, _ := os.ReadFile(dest)
	_, again := cli("backup", "-db", db, dest)
	var name string
	copyDB, _ := sql.Open("sqlite", sqliteURI(dest, "mode=ro"))
	copyDB.QueryRow(`SELECT button->>'productName' FROM buttons WHERE id = ?`, button).Scan(&name)
	if now, _ := os.ReadFile(dest); copyDB.Close() != nil || name != "Pro plan" || err != nil || again == nil ||
		exitStatus(again) != 1 || !bytes.Equal(now, copied) || !regexp.MustCompile(`^backup of .+ written to .+\n$`).
		MatchString(out) {
		t.Errorf("backup: got %q (%v), its button %q, then %v; want a copy with it, then exit 1", out, err, name, again)
	}
	sound, err1 := cli("check", "-db", db)
	soundCopy, err2 := cli("check", "-db", dest)
	for i := 4096; i < 2*4096; i += 7 { // page 2, a table's root
		copied[i] ^= 0x5a
	}
	os.WriteFile(dest, copied, 0o600)
	if out, err = cli("check", "-db", dest); sound+soundCopy != "ok\nok\n" || err1 != nil || err2 != nil ||
		out == "ok\n" || exitStatus(err) != 1 || !regexp.MustCompile(`damaged|malformed`).MatchString(fmt.Sprint(err)) {
		t.Errorf("check of the file, its copy, the copy damaged: got %q %q %q (%v, %v, %v); want ok, ok, exit 1 "+
			"naming the damage", sound, soundCopy, out, err1, err2, err)
	}
	inUse := "is in use by another server"
	for _, c := range [][2]string{{db, inUse}, {symlink, inUse}, {hardLink, "has 2 hard links"}} {
		if c[0] == symlink && os.Symlink(db, symlink) != nil || c[0] == hardLink && (runtime.GOOS == "windows" ||
			os.Link(db, hardLink) != nil) { // Windows: paybuttons counts no hard links
			t.Logf("no %s here: that case is left out", c[0])
			continue
		}
		start := time.Now() // the first server is another process: this one may try, on 192.0.2.1, which never serves
		if _, _, err := runCLI(t, nil, "serve", "-db", c[0], "-addr", "192.0.2.1:1"); exitStatus(err) != 1 ||
			!strings.Contains(fmt.Sprint(err), c[1]) || time.Since(start) > 5*time.Second {
			t.Errorf("serve on %s: got %v after %v, want exit 1 within 5 s saying %q", c[0], err, time.Since(start), c[1])
		}
		api("GET", "/healthz", "", 200)
	}
	if os.Remove(hardLink); srv.cmd.Process.Kill() != nil || !awaitTrue(srv.gone.Load) {
		t.Fatal("the server stopped before its SIGKILL, or still runs 20 s after it")
	}
	startChild(t, db) // fails the test unless it listens
}

// Mistakes in the command line exit 2, and files that cannot be used 1, with one line, changing no file; a start on
// a taken port mints no key; a flag beats its variable; two processes opening a new file at once both succeed.
func TestRefusalsAndFirstOpens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	never, busy, foreign, garbage, readOnly := dir+"/never.db", dir+"/busy.db", dir+"/foreign.db", dir+"/not.db", dir+"/ro.db"
	other, _ := sql.Open("sqlite", foreign)
	_, err := other.Exec(`CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine')`)
	other.Close()
	_, _, err2 := runCLI(t, nil, "keys", "create", "-account", "acme", "-db", readOnly)
	ln, err3 := net.Listen("tcp", "127.0.0.1:0")
	if err = cmp.Or(err, err2, err3, os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	before, _ := os.ReadFile(foreign)
	// 192.0.2.1 is no address of this machine: a serve that wrongly started would fail, never serve.
	serve := func(a ...string) []string { return append([]string{"serve", "-addr", "192.0.2.1:1", "-db"}, a...) }
	for _, c := range []struct {
		status     int
		rate, says string // PAYBUTTONS_RATE; what the error says
		args       []string
	}{{2, "", "frobnicate", []string{"frobnicate"}}, {2, "", "-bogus", serve(never, "-bogus")},
		{2, "", "-metrics", serve(never, "-metrics")}, {2, "", "-max-conns", serve(never, "-max-conns", "9")},
		{2, "", "-log-level", serve(never, "-log-level", "warn")}, {2, "", "-addr", serve(never, "-addr", ":99999")},
		{2, "", "-rate", serve(never, "-rate", "NaN")}, {2, "", "-rate", serve(never, "-rate", "-1")},
		{2, "", "-burst", serve(never, "-burst", "0")}, {2, "", "-tls-key", serve(never, "-tls-cert", "c.pem")},
		{2, "", "-account", []string{"keys", "create", "-db", never}}, {2, "fast", "PAYBUTTONS_RATE", serve(never)},
		{2, "NaN", "-rate", serve(never)}, {1, "1e-9", "192.0.2.1:1", serve(busy, "-rate", "5")},
		{1, "", ln.Addr().String(), serve(busy, "-addr", ln.Addr().String())},
		{1, "", "not a paybuttons database", serve(foreign)}, {1, "", "not a database", serve(garbage)},
		{1, "", "does not exist", serve(dir + "/none/x.db")}} {
		_, stderr, err := runCLI(t, map[string]string{"PAYBUTTONS_RATE": c.rate}, c.args...)
		if exitStatus(err) != c.status || !strings.Contains(fmt.Sprint(err), c.says) || stderr != "" ||
			strings.Contains(fmt.Sprint(err), "\n") {
			t.Errorf("%q: got %v (stderr %q), want exit %d, one line saying %q", c.args, err, stderr, c.status, c.says)
		}
	}
	// A file this process cannot write: read-only, or, as root on Linux, who writes any file, the server runs as
	// nobody, from a copy of this binary in a directory nobody may write.
	cmd, binary := childCommand("serve", "-db", readOnly, "-addr", "127.0.0.1:0"), dir+"/pb.test"
	runuser, err := exec.LookPath("runuser")
	if os.Geteuid() > 0 {
		err = os.Chmod(readOnly, 0o444)
	} else if text, _ := os.ReadFile(cmd.Path); err == nil {
		err = cmp.Or(os.WriteFile(binary, text, 0o755), os.Chmod(dir, 0o777), os.Chmod(dir+"/..", 0o755))
		cmd.Path, cmd.Args = runuser, append([]string{runuser, "-u", "nobody", "--", binary}, cmd.Args[1:]...)
	}
	if err != nil {
		t.Logf("no way to take write access away here (%v): that case is left out", err)
	} else if out := runChild(cmd); !regexp.MustCompile(`^exit 1: paybuttons: .*readonly database.*\n$`).MatchString(out) {
		t.Errorf("serve on a file it cannot write: got %q, want exit 1 and one line saying so", out)
	}
	_, statErr := os.Stat(never)
	list, _, err := runCLI(t, nil, "keys", "list", "-db", busy)
	if after, _ := os.ReadFile(foreign); statErr == nil || list != "" || err != nil || !bytes.Equal(before, after) {
		t.Errorf("got %s (%v), keys %q (%v) after a start on a taken port, %s changed: %v; want none", never, statErr,
			list, err, foreign, !bytes.Equal(before, after))
	}
	for round := range map[bool]int{false: 3, true: 100}[os.Getenv("PAYBUTTONS_LONG_TESTS") == "1"] {
		db, ran := fmt.Sprint(dir, "/new", round, ".db"), make(chan string, 2)
		for range 2 {
			go func() { ran <- runChild(childCommand("keys", "create", "-account", "a", "-db", db)) }()
		}
		first, second := <-ran, <-ran
		if list, _, _ := runCLI(t, nil, "keys", "list", "-db", db); first[:7]+second[:7] != "exit 0:exit 0:" ||
			strings.Count(list, "\n") != 2 {
			t.Errorf("round %d, two keys create at once on a new file: got %q and %q, then keys %q", round, first, second, list)
		}
	}
}
