//go:build unix

package main

// A database file the server cannot write is refused at start. Root may write any file, so as root the server runs
// as the user nobody.

import (
	"cmp"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A server started on a database file it may read but not write exits 1 at once with one line, instead of answering
// /healthz 200 and every write 500.
func TestUnwritableDatabaseIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "ro.db")
	mintKeyCLI(t, dbPath, "acme")
	cmd := childCommand("serve", "-addr", "127.0.0.1:0", "-db", dbPath)
	if os.Geteuid() != 0 {
		os.Chmod(dbPath, 0o444)
	} else {
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Skipf("root writes any file, and there is no user nobody to run the server as: %v", err)
		}
		uid, _ := strconv.ParseUint(nobody.Uid, 10, 32)
		gid, _ := strconv.ParseUint(nobody.Gid, 10, 32)
		// nobody reaches a copy of this test binary, and may make files in the directory (the lock file), but may
		// only read the database, which root owns.
		os.Chmod(filepath.Dir(dir), 0o755)
		os.Chmod(dir, 0o777)
		os.Chmod(dbPath, 0o644)
		binary, err := os.ReadFile(cmd.Path)
		if err = cmp.Or(err, os.WriteFile(filepath.Join(dir, "paybuttons.test"), binary, 0o755)); err != nil {
			t.Fatal(err)
		}
		cmd.Path = filepath.Join(dir, "paybuttons.test")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	ran := runChild(cmd)
	if ran.code == -1 && ran.took == 0 {
		t.Skipf("cannot start the server as another user: %s", ran.stderr)
	}
	ran.wantRefused(t, "serve on a file it cannot write", "cannot be opened for reading and writing")
	if list, _ := runCLI(t, nil, "keys", "list", "-db", dbPath); strings.Count(list, "\n") != 1 {
		t.Errorf("keys list after the refused start: got %q, want the one key made before, none minted", list)
	}
}
