package examples

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A file this process cannot write is refused by serve at start, and read by keys list and check.
// Root writes any file, so as root the commands run as nobody.
func TestReadOnlyFile(t *testing.T) {
	runuser, err := exec.LookPath("runuser")
	if os.Geteuid() == 0 && (err != nil || runtime.GOOS != "linux") {
		t.Skip("running as root without runuser: no user to run the commands as")
	}
	dir, err := os.MkdirTemp("", "paybuttons") // not t.TempDir: its parents admit no other user
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, db := build(t, dir), dir+"/ro.db"
	out, err := exec.Command(bin, "keys", "create", "-account", "a", "-db", db).CombinedOutput()
	if err != nil || os.Chmod(db, 0o444) != nil || os.Chmod(dir, 0o777) != nil {
		t.Fatalf("make a read-only file: %v\n%s", err, out)
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
		t.Run(c.args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a serve not refused
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, c.args...)
			if os.Geteuid() == 0 {
				cmd = exec.CommandContext(ctx, runuser,
					append([]string{"-u", "nobody", "--", bin}, c.args...)...)
			}
			out, _ := cmd.CombinedOutput()
			status := cmd.ProcessState.ExitCode()
			if status != c.status || !strings.Contains(string(out), c.says) {
				t.Errorf("got exit %d, %s; want %d, saying %q", status, out, c.status, c.says)
			}
		})
	}
}
