// Package readme runs the README's walkthrough as a new user would: every command of every console block, in order,
// in one shell, in a fresh copy of the repository, against the real server the README starts. Each command's output
// must be the one the README shows, once ids, secrets, times and durations are masked.
//
//	go test ./readme                   # check
//	go test ./readme -update           # write the outputs of this run into the README
package readme

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
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

var update = flag.Bool("update", false, "write this run's outputs into ../../README.md")

// command is one "$ " line of a console block (with its continuation lines) and the output the README shows.
type command struct {
	text   string
	output []string
	line   int // where its output starts in the README, 0-based
	end    int // the line after its output
}

// parse returns the commands of every ```console block, in order.
func parse(readme []string) []command {
	var cmds []command
	inConsole := false
	for i := 0; i < len(readme); i++ {
		line := readme[i]
		switch {
		case strings.HasPrefix(line, "```console"):
			inConsole = true
		case strings.HasPrefix(line, "```"):
			inConsole = false
		case inConsole && strings.HasPrefix(line, "$ "):
			// A command goes on over the lines after a backslash, and over indented lines (inside quotes).
			c := command{text: strings.TrimPrefix(line, "$ ")}
			for i+1 < len(readme) && (strings.HasSuffix(c.text, `\`) || strings.HasPrefix(readme[i+1], " ")) {
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
	{regexp.MustCompile(`pbk_[0-9A-Za-z_-]{43}`), "pbk_SECRET"},
	{regexp.MustCompile(`req_[0-9a-z]+`), "req_ID"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "TIME"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`), "TIME"},
	{regexp.MustCompile(`(?m)^Date: .*$`), "Date: DATE"},
	{regexp.MustCompile(`duration=\S+`), "duration=D"},
	{regexp.MustCompile(`go1\.\d+(\.\d+)?`), "goVERSION"},
	{regexp.MustCompile(`localhost:\d+`), "localhost:8080"},
	{regexp.MustCompile(`(127\.0\.0\.1|\[::1\]):\d+`), "127.0.0.1:8080"}, // the address serve logs
}

func mask(s string) string {
	for _, m := range masks {
		s = m.re.ReplaceAllString(s, m.with)
	}
	return s
}

func TestREADMECommandsRunVerbatim(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	root, _ := filepath.Abs("../..")
	readmePath := filepath.Join(root, "README.md")
	text, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Split(string(text), "\n")
	cmds := parse(readme)
	if len(cmds) < 20 {
		t.Fatalf("found %d commands in README.md's console blocks, want the whole walkthrough", len(cmds))
	}

	// A fresh copy: the files git tracks, and the new ones it does not ignore, as they are now. What the walkthrough
	// leaves (demo.log, created.json, its databases) is ignored, so a walkthrough run in the repository itself leaves
	// nothing here for this one to trip over; the end of the test holds every such file to that.
	clone := t.TempDir()
	files, err := exec.Command("git", "-C", root, "ls-files", "-z", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	copied := map[string]bool{}
	for _, name := range strings.Split(strings.TrimSuffix(string(files), "\x00"), "\x00") {
		copied[name] = true
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the working tree
		}
		os.MkdirAll(filepath.Join(clone, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(clone, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// One shell runs every command, so that variables and the background server carry over; a marker line before
	// each says where its output starts. The ports 8080 and 8081 of the README become free ones.
	port := freePort(t)
	ports := strings.NewReplacer("localhost:8080", "localhost:"+port, "localhost:8081", "localhost:"+freePort(t))
	var script strings.Builder
	script.WriteString("exec 2>&1\nset +e\n")
	for i, c := range cmds {
		fmt.Fprintf(&script, "printf '\\n@@ %d\\n'\n%s\n", i, ports.Replace(c.text))
	}
	script.WriteString("printf '\\n@@ end\\n'\nkill $(jobs -p) 2>/dev/null; wait\n") // servers left running
	shell := exec.Command("bash", "-c", script.String())
	shell.Dir = clone
	shell.Env = append(os.Environ(), "PAYBUTTONS_ADDR=localhost:"+port)
	var out bytes.Buffer
	shell.Stdout, shell.Stderr = &out, &out
	done := make(chan error, 1)
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- shell.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		shell.Process.Kill()
		t.Fatalf("the README's commands did not finish in 5 minutes; output so far:\n%s", out.String())
	}

	got := splitOutputs(t, out.String(), len(cmds))
	for i := len(cmds) - 1; i >= 0; i-- { // from the end: replacing lines keeps earlier line numbers
		c := cmds[i]
		if *update {
			readme = append(readme[:c.line], append(got[i], readme[c.end:]...)...)
			continue
		}
		if want, have := mask(strings.Join(c.output, "\n")), mask(strings.Join(got[i], "\n")); want != have {
			t.Errorf("README.md line %d: $ %s\ngot:\n%s\nwant:\n%s", c.line, c.text, have, want)
		}
	}
	if *update {
		if err := os.WriteFile(readmePath, []byte(strings.Join(readme, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if left := notIgnored(t, root, clone, copied); len(left) > 0 {
		t.Errorf("the walkthrough leaves %q, which git does not ignore: add them to .gitignore, or the next copy of a "+
			"repository where the walkthrough ran starts from them", left)
	}
}

// notIgnored returns the files in clone that are not in copied and that root's .gitignore does not ignore.
func notIgnored(t *testing.T, root, clone string, copied map[string]bool) []string {
	var left []string
	filepath.WalkDir(clone, func(path string, d fs.DirEntry, err error) error {
		name, _ := filepath.Rel(clone, path)
		if err == nil && !d.IsDir() && !copied[filepath.ToSlash(name)] {
			left = append(left, filepath.ToSlash(name))
		}
		return nil
	})
	if len(left) == 0 {
		return nil
	}
	// check-ignore names the ignored ones; it exits 1 when there are none.
	check := exec.Command("git", "-C", root, "check-ignore", "-z", "--stdin", "--no-index")
	check.Stdin = strings.NewReader(strings.Join(left, "\x00"))
	out, err := check.Output()
	if exit, ok := err.(*exec.ExitError); err != nil && (!ok || exit.ExitCode() != 1) {
		t.Fatalf("git check-ignore: %v", err)
	}
	ignored := strings.Split(string(out), "\x00")
	return slices.DeleteFunc(left, func(name string) bool { return slices.Contains(ignored, name) })
}

// splitOutputs cuts the shell's output at the marker lines into each command's output lines. A marker starts with a
// line break, so that it is on a line of its own after an output that does not end with one (curl's JSON); the empty
// line that leaves after an output that does is dropped, and so are the CRs of HTTP headers.
func splitOutputs(t *testing.T, out string, n int) [][]string {
	outputs := make([][]string, n)
	current := -1
	out = strings.ReplaceAll(out, "\r\n", "\n")
	out = regexp.MustCompile(`\n\n(@@ )`).ReplaceAllString(out, "\n$1")
	for _, line := range strings.Split(strings.Trim(out, "\n"), "\n") {
		var i int
		if _, err := fmt.Sscanf(line, "@@ %d", &i); err == nil && strings.HasPrefix(line, "@@ ") {
			current = i
			continue
		}
		if line == "@@ end" {
			break
		}
		if current < 0 {
			t.Fatalf("output before the first command: %q", line)
		}
		outputs[current] = append(outputs[current], line)
	}
	return outputs
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

// Every body the walkthrough sends and the server accepts matches its request schema in openapi.json.
func TestREADMEBodiesMatchTheDocument(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	document, err := os.Open("../../openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer document.Close()
	compiler, schemas := jsonschema.NewCompiler(), map[string]*jsonschema.Schema{}
	doc, err := jsonschema.UnmarshalJSON(document)
	if err == nil {
		err = compiler.AddResource("openapi.json", doc)
	}
	for op, schema := range map[string]string{"create": "CreateButtonRequest", "update/": "UpdateButtonRequest"} {
		if err == nil {
			schemas[op], err = compiler.Compile("openapi.json#/components/schemas/" + schema)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	bodies, checked := map[string]string{}, 0
	for _, c := range parse(strings.Split(string(readme), "\n")) {
		if v := regexp.MustCompile(`(?s)^(\w+)='(\{.*\})'$`).FindStringSubmatch(c.text); v != nil {
			bodies["$"+v[1]] = v[2] // BODY='...'
		}
		sent := regexp.MustCompile(`(?s)/(create|update/).*? -d (?:'([^']+)'|"(\$\w+)")`).FindStringSubmatch(c.text)
		if sent == nil || !strings.Contains(strings.Join(c.output, "\n"), `{"isSuccess":true`) {
			continue
		}
		body, err := jsonschema.UnmarshalJSON(strings.NewReader(sent[2] + bodies[sent[3]]))
		if err == nil {
			err = schemas[sent[1]].Validate(body)
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
