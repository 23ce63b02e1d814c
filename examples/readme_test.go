package examples

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

var update = flag.Bool("update", false, "write this run's outputs into ../README.md")

// command is one "$ " line of a console block (with its continuation lines) and the output the
// README shows after it, at lines [line, end).
type command struct {
	text      string
	output    []string
	line, end int
}

// parse returns the commands of every ```console block, in order.
func parse(readme []string) []command {
	var cmds []command
	inConsole := false
	for i := 0; i < len(readme); i++ {
		switch line := readme[i]; {
		case strings.HasPrefix(line, "```console"):
			inConsole = true
		case strings.HasPrefix(line, "```"):
			inConsole = false
		case inConsole && strings.HasPrefix(line, "$ "):
			// A command goes on over the lines after a backslash, and over indented lines (inside
			// quotes).
			c := command{text: strings.TrimPrefix(line, "$ ")}
			for i+1 < len(readme) && (strings.HasSuffix(c.text, `\`) ||
				strings.HasPrefix(readme[i+1], " ")) {
				i++
				c.text += "\n" + readme[i]
			}
			c.line, c.end = i+1, i+1
			for c.end < len(readme) && !strings.HasPrefix(readme[c.end], "$ ") &&
				!strings.HasPrefix(readme[c.end], "```") {
				c.end++
			}
			c.output = readme[c.line:c.end]
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// masks turn what differs from run to run into fixed text.
var masks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`btn_[0-9A-Z]{26}`), "btn_ID"},
	{regexp.MustCompile(`key_[0-9A-Za-z]{16}`), "key_ID"},
	{regexp.MustCompile(`req_[0-9a-z]+`), "req_ID"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "TIME"},
	{regexp.MustCompile(`duration=\S+`), "duration=D"},
	{regexp.MustCompile(`(127\.0\.0\.1|\[::1\]):\d+`), "127.0.0.1:8080"}, // the address serve logs
}

func mask(lines []string) string {
	s := strings.Join(lines, "\n")
	for _, m := range masks {
		s = m.re.ReplaceAllString(s, m.with)
	}
	return s
}

// TestREADMECommandsRunVerbatim runs the README's walkthrough as a new user would: every command of
// every console block, in order, in one shell, in a fresh copy of the repository, against the
// servers the README starts. Each command's output must be the one the README shows, once ids,
// times, durations and the port are masked (no output shows a secret). With -update, this run's
// outputs are written into the README instead.
func TestREADMECommandsRunVerbatim(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	root, _ := filepath.Abs("..")
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Split(string(text), "\n")
	cmds := parse(readme)
	if len(cmds) < 20 {
		t.Fatalf("found %d commands in README.md's console blocks, want the whole walkthrough",
			len(cmds))
	}

	// The copy holds the files git tracks and the new ones it does not ignore, as they are now. It
	// is a git repository of its own with every file added, so that git tells at the end what the
	// walkthrough left that .gitignore does not ignore: a walkthrough run by hand must leave
	// nothing for the next copy.
	clone := t.TempDir()
	files := git(t, root, "ls-files", "-z", "-co", "--exclude-standard")
	for _, name := range strings.Split(files, "\x00") {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the working tree, or the empty name after the last NUL
		}
		os.MkdirAll(filepath.Join(clone, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(clone, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, clone, "init", "-q")
	git(t, clone, "add", "-A")

	// One shell runs every command, so that variables and the background server carry over, and
	// writes each command's output into a file of its own. The README's port 8080 becomes a free
	// one.
	port, outputs := freePort(t), t.TempDir()
	ports := strings.NewReplacer("localhost:8080", "localhost:"+port)
	var script strings.Builder
	for i, c := range cmds {
		fmt.Fprintf(&script, "{\n%s\n} >%s/%d 2>&1\n", ports.Replace(c.text), outputs, i)
	}
	script.WriteString("kill $(jobs -p) 2>/dev/null; wait\n") // the servers left running
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	shell := exec.CommandContext(ctx, "bash", "-c", script.String())
	shell.Dir = clone
	shell.WaitDelay = time.Second // a server left running may hold the output open
	shell.Env = append(os.Environ(), "PAYBUTTONS_ADDR=localhost:"+port)
	if out, err := shell.CombinedOutput(); ctx.Err() != nil {
		t.Fatalf("the README's commands did not finish in 5 minutes: %v\n%s", err, out)
	}

	got := make([][]string, len(cmds))
	for i, c := range cmds {
		out, _ := os.ReadFile(fmt.Sprintf("%s/%d", outputs, i))
		out = bytes.ReplaceAll(out, []byte("\r\n"), []byte("\n"))
		if out := strings.TrimSuffix(string(out), "\n"); out != "" {
			got[i] = strings.Split(out, "\n") // without the CRs of HTTP headers
		}
		if want, have := mask(c.output), mask(got[i]); want != have && !*update {
			t.Errorf("README.md line %d: $ %s\ngot:\n%s\nwant:\n%s", c.line, c.text, have, want)
		}
	}
	for i := len(cmds) - 1; i >= 0 && *update; i-- { // from the end: earlier line numbers hold
		readme = slices.Replace(readme, cmds[i].line, cmds[i].end, got[i]...)
	}
	if *update {
		text := []byte(strings.Join(readme, "\n"))
		if err := os.WriteFile(filepath.Join(root, "README.md"), text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if left := git(t, clone, "ls-files", "-o", "--exclude-standard"); left != "" {
		t.Errorf("the walkthrough leaves files that git does not ignore: add them to .gitignore, "+
			"or the next copy of a repository where it ran starts from them:\n%s", left)
	}
}

// git runs git in dir and returns what it printed.
func git(t *testing.T, dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// Every body the walkthrough sends to create or update, and the server accepts, matches its request
// schema in openapi.json.
func TestREADMEBodiesMatchTheDocument(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := readDocument(t)
	schemas := map[string]string{"create": "CreateButtonRequest", "update/": "UpdateButtonRequest"}
	bodies, checked := map[string]string{}, 0
	for _, c := range parse(strings.Split(string(readme), "\n")) {
		if v := regexp.MustCompile(`(?s)^(\w+)='(\{.*\})'$`).FindStringSubmatch(c.text); v != nil {
			bodies["$"+v[1]] = v[2] // BODY='...'
		}
		sent := regexp.MustCompile(`(?s)/(create|update/).*? -d (?:'([^']+)'|"(\$\w+)")`).
			FindStringSubmatch(c.text)
		if sent == nil || !strings.Contains(strings.Join(c.output, "\n"), `{"isSuccess":true`) {
			continue
		}
		body, err := jsonschema.UnmarshalJSON(strings.NewReader(sent[2] + bodies[sent[3]]))
		if err == nil {
			err = doc.schema(t, "#/components/schemas/"+schemas[sent[1]]).Validate(body)
		}
		if err != nil {
			t.Errorf("README.md: $ %s\nthe body does not match openapi.json: %v", c.text, err)
		}
		checked++
	}
	if checked < 4 {
		t.Errorf("checked %d bodies of the walkthrough, want every one (4 or more)", checked)
	}
}
