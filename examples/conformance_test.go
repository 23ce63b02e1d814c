// Package examples tests the built binary as a user runs it: TestConformance holds its answers to
// openapi.json route by route, the TestREADME tests hold the README's walkthrough to what it
// prints, TestReadOnlyFile runs its commands on a file they cannot write (as nobody, when run as
// root), and TestMemoryUnderListLoad (a long test) holds its memory under load. It is a module of
// its own so that the JSON Schema validator stays out of the service's go.mod.
package examples

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	_ "modernc.org/sqlite"
)

// request is one request, and the status it must get.
type request struct {
	method, path, key, body string
	header                  string // "Name: value", or ""
	want                    int
}

// TestConformance sends a request of every kind to the real service. Each answer's status must be
// one that openapi.json declares for its route (method and path template), with the headers and
// body declared there, checked by a JSON Schema validator. And each status the document declares
// for a route, and each error code it names, must be one that a request here got.
func TestConformance(t *testing.T) {
	doc, srv := readDocument(t), startServer(t)
	key, readOnly := srv.newKey(t, "shop"), srv.newKey(t, "shop", "-read-only")
	other := srv.newKey(t, "other") // another account's
	const p, body = "/product-payment/", `{"productName":"P","amount":"1","currency":"USD",
		"paymentMethod":"Stripe","paymentType":"one_time","isLive":false}`
	huge, text := strings.Repeat(" ", 64<<10+1), "Content-Type: text/plain"
	missing := "btn_06H27KTFCGG4V12GX25X0A96ZG" // no button has this id
	create := func() string {
		var created struct{ Data string }
		_, answer := doc.send(t, srv, request{"POST", p + "create", key, body, "", 200})
		json.Unmarshal(answer, &created)
		return created.Data
	}
	id, gone := create(), create() // the first request deletes gone; id stays active
	for _, r := range []request{
		{"DELETE", p + "delete/" + gone, key, "", "", 200},
		{"POST", p + "create", key, "{", "", 400},
		{"POST", p + "create", "", body, "", 401},
		{"POST", p + "create", readOnly, body, "", 403},
		{"POST", p + "create", key, huge, "", 413},
		{"POST", p + "create", key, body, text, 415},
		{"GET", p + "get/" + id, key, "", "", 200},
		{"GET", p + "get/" + id, "", "", "", 401},
		{"GET", p + "get/" + id, other, "", "", 404},
		{"GET", p + "list?limit=1", key, "", "", 200},
		{"GET", p + "list?limit=0", key, "", "", 400},
		{"GET", p + "list", "pbk_wrong", "", "", 401},
		{"POST", p + "update/" + id, key, `{"amount":"2"}`, `If-Match: "1"`, 200},
		{"POST", p + "update/" + id, key, `{}`, "", 400},
		{"POST", p + "update/" + id, "", `{"amount":"3"}`, "", 401},
		{"POST", p + "update/" + id, readOnly, `{"amount":"3"}`, "", 403},
		{"POST", p + "update/" + missing, key, `{"amount":"3"}`, "", 404},
		{"POST", p + "update/" + gone, key, `{"amount":"3"}`, "", 409},
		{"POST", p + "update/" + id, key, `{"amount":"3"}`, `If-Match: "1"`, 412},
		{"POST", p + "update/" + id, key, huge, "", 413},
		{"POST", p + "update/" + id, key, `{"amount":"3"}`, text, 415},
		{"DELETE", p + "delete/" + id, key, "", "Idempotency-Key: k1", 400},
		{"DELETE", p + "delete/" + id, "", "", "", 401},
		{"DELETE", p + "delete/" + id, readOnly, "", "", 403},
		{"DELETE", p + "delete/" + missing, key, "", "", 404},
		{"DELETE", p + "delete/" + gone, key, "", "", 409},
		{"DELETE", p + "delete/" + id, key, "", `If-Match: "1"`, 412},
		{"POST", p + "restore/" + gone, key, "", "Idempotency-Key: k1", 400},
		{"POST", p + "restore/" + gone, "", "", "", 401},
		{"POST", p + "restore/" + gone, readOnly, "", "", 403},
		{"POST", p + "restore/" + missing, key, "", "", 404},
		{"POST", p + "restore/" + id, key, "", "", 409},
		{"POST", p + "restore/" + gone, key, "", `If-Match: "1"`, 412},
		{"POST", p + "restore/" + gone, key, "", "", 200},
		{"GET", "/healthz", "", "", "", 200},
		{"GET", "/openapi.json", "", "", "", 200},
		{"GET", "/nope", key, "", "", 404},
	} {
		t.Run(doc.name(r), func(t *testing.T) { doc.send(t, srv, r) })
	}
	ifMatch := doc.schema(t, "#/components/parameters/IfMatch/schema")
	for _, value := range []string{`"3"`, `*`, `3`, `"0"`, `"05"`, `W/"3"`, `"3", "4"`} {
		r := request{"DELETE", p + "delete/" + missing, key, "", "If-Match: " + value, 404}
		if ifMatch.Validate(value) != nil {
			r.want = 400 // what the document's pattern refuses, the server refuses
		}
		t.Run("If-Match "+value, func(t *testing.T) { doc.send(t, srv, r) })
	}

	// Faults made from another connection, only one, so that BEGIN and its ROLLBACK share it. While
	// it holds the write lock, each write waits its 5 s, then is a 503; while the buttons table has
	// another name, each button route is a 500; while api_keys has, /healthz is a 503.
	db, err := sql.Open("sqlite", srv.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	rename := func(from, to string) string { return "ALTER TABLE " + from + " RENAME TO " + to }
	for _, fault := range []struct {
		do, undo string
		requests []request
	}{
		{"BEGIN IMMEDIATE", "ROLLBACK", []request{
			{"POST", p + "create", key, body, "", 503},
			{"POST", p + "update/" + id, key, `{"amount":"4"}`, "", 503},
			{"DELETE", p + "delete/" + id, key, "", "", 503},
			{"POST", p + "restore/" + gone, key, "", "", 503},
		}},
		{rename("buttons", "renamed"), rename("renamed", "buttons"), []request{
			{"POST", p + "create", key, body, "", 500},
			{"GET", p + "get/" + id, key, "", "", 500},
			{"GET", p + "list", key, "", "", 500},
			{"POST", p + "update/" + id, key, `{"amount":"4"}`, "", 500},
			{"DELETE", p + "delete/" + id, key, "", "", 500},
			{"POST", p + "restore/" + gone, key, "", "", 500},
		}},
		{rename("api_keys", "renamed"), rename("renamed", "api_keys"), []request{
			{"GET", "/healthz", "", "", "", 503},
		}},
	} {
		if _, err := db.Exec(fault.do); err != nil {
			t.Fatal(err)
		}
		t.Run(fault.do, func(t *testing.T) {
			for _, r := range fault.requests {
				t.Run(doc.name(r), func(t *testing.T) { t.Parallel(); doc.send(t, srv, r) })
			}
		})
		if _, err := db.Exec(fault.undo); err != nil {
			t.Fatal(err)
		}
	}

	for _, route := range slices.Sorted(maps.Keys(doc.routes)) {
		t.Run(route, func(t *testing.T) {
			method, template, _ := strings.Cut(route, " ")
			r := request{"PUT", strings.ReplaceAll(template, "{id}", id), key, "", "", 405}
			allow := strings.Replace(method, "GET", "GET, HEAD", 1) // another method: 405
			if header, _ := doc.send(t, srv, r); header.Get("Allow") != allow {
				t.Errorf("PUT %s: got Allow %q, want %q", template, header.Get("Allow"), allow)
			}
			for _, status := range doc.routes[route] {
				if !doc.sent[route+" "+status] {
					t.Errorf("openapi.json declares %s, and no request here got it", status)
				}
			}
		})
	}
	codes, _ := doc.at("#/components/schemas/ErrorCode")
	for _, code := range codes["enum"].([]any) {
		if !doc.sent["code "+code.(string)] {
			t.Errorf("openapi.json names the error code %s, and no answer carried it", code)
		}
	}
}

// document is openapi.json, and what the answers so far gave.
type document struct {
	root     map[string]any
	routes   map[string][]string // "METHOD /template" to the statuses it declares
	mu       sync.Mutex          // for compiler and sent
	compiler *jsonschema.Compiler
	sent     map[string]bool // "METHOD /template STATUS" and "code CODE" of each answer
}

func readDocument(t *testing.T) *document {
	text, err := os.ReadFile("../openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	d := &document{routes: map[string][]string{}, compiler: jsonschema.NewCompiler(),
		sent: map[string]bool{}}
	value, err := jsonschema.UnmarshalJSON(bytes.NewReader(text))
	if err == nil {
		err = d.compiler.AddResource("openapi.json", value)
	}
	if err != nil {
		t.Fatal(err)
	}
	d.root = value.(map[string]any)
	paths, _ := d.at("#/paths")
	for template, item := range paths {
		for method, op := range item.(map[string]any) {
			op, _ := op.(map[string]any) // nil for the path's parameters
			if responses, ok := op["responses"].(map[string]any); ok {
				d.routes[strings.ToUpper(method)+" "+template] = slices.Sorted(maps.Keys(responses))
			}
		}
	}
	return d
}

// at returns the object at the JSON pointer p ("#/a/b"), or where its $ref leads, and that pointer.
func (d *document) at(p string) (map[string]any, string) {
	node := d.root
	for _, key := range strings.Split(strings.TrimPrefix(p, "#/"), "/") {
		node, _ = node[strings.ReplaceAll(key, "~1", "/")].(map[string]any)
	}
	if ref, ok := node["$ref"].(string); ok {
		return d.at(ref)
	}
	return node, p
}

// schema compiles the schema at the JSON pointer p.
func (d *document) schema(t *testing.T, p string) *jsonschema.Schema {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.compiler.Compile("openapi.json" + p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// route is method and the template of the document's path that p matches, or p when none does.
func (d *document) route(method, p string) string {
	p, _, _ = strings.Cut(p, "?")
	for route := range d.routes {
		_, template, _ := strings.Cut(route, " ")
		if match, _ := path.Match(strings.ReplaceAll(template, "{id}", "*"), p); match {
			p = template
		}
	}
	return method + " " + p
}

func (d *document) name(r request) string {
	return d.route(r.method, r.path) + " " + strconv.Itoa(r.want)
}

// send sends r and checks the answer against the document. It returns the answer's header and body.
func (d *document) send(t *testing.T, srv *server, r request) (http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(r.method, srv.url+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.key != "" {
		req.Header.Set("X-API-KEY", r.key)
	}
	if name, value, ok := strings.Cut(r.header, ": "); ok {
		req.Header.Set(name, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	route, status := d.route(r.method, r.path), strconv.Itoa(resp.StatusCode)
	var envelope struct{ Code string }
	json.Unmarshal(body, &envelope)
	d.mu.Lock()
	d.sent[route+" "+status], d.sent["code "+envelope.Code] = true, true
	d.mu.Unlock()
	if resp.StatusCode != r.want {
		t.Errorf("%s %s: got %s, want %d\n%s", r.method, r.path, status, r.want, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: got Content-Type %q, want application/json", r.method, r.path, ct)
	}

	method, template, _ := strings.Cut(route, " ")
	response, at := d.at("#/paths/" + strings.ReplaceAll(template, "/", "~1") + "/" +
		strings.ToLower(method) + "/responses/" + status)
	bodySchema := at + "/content/application~1json/schema"
	if d.routes[route] == nil && (status == "404" || status == "405") { // in info, not per route
		response, bodySchema = map[string]any{}, "#/components/schemas/ErrorEnvelope"
	}
	if response == nil {
		t.Errorf("%s %s: got %s, which openapi.json does not declare for %s", r.method, r.path,
			status, route)
		return resp.Header, body
	}
	headers, _ := response["headers"].(map[string]any)
	for name := range headers {
		header, at := d.at(at + "/headers/" + name)
		schema, _ := d.at(at + "/schema")
		got := resp.Header.Get(name)
		var value any = got
		if n, err := strconv.Atoi(got); err == nil && schema["type"] == "integer" {
			value = n
		}
		if got == "" && header["required"] == true {
			t.Errorf("%s %s: got %s without %s", r.method, r.path, status, name)
		} else if err := d.schema(t, at+"/schema").Validate(value); got != "" && err != nil {
			t.Errorf("%s %s: got %s with %s: %v", r.method, r.path, status, name, err)
		}
	}
	value, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err == nil {
		err = d.schema(t, bodySchema).Validate(value)
	}
	if err != nil {
		t.Errorf("%s %s: got %s with a body that openapi.json does not declare: %v\n%.300s",
			r.method, r.path, status, err, body)
	}
	return resp.Header, body
}

// server is the service, built from the repository's root, serving a new database.
type server struct {
	url, bin, db string
	pid          int
}

func startServer(t *testing.T) *server {
	dir := t.TempDir()
	s := &server{bin: build(t, dir), db: filepath.Join(dir, "pb.db")}
	logFile := filepath.Join(dir, "stderr.log")
	stderr, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd := exec.Command(s.bin, "-addr", "127.0.0.1:0", "-db", s.db)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.pid = cmd.Process.Pid
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for s.url == "" {
		logged, _ := os.ReadFile(logFile) // serve logs "msg=listening url=http://HOST:PORT ..."
		if _, url, ok := strings.Cut(string(logged), " url="); ok && strings.Contains(url, "\n") {
			s.url = strings.Fields(url)[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("the server logged no address in 30 s:\n%s", logged)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// build builds the service from the repository's root into dir, and returns the binary's path.
func build(t *testing.T, dir string) string {
	bin := filepath.Join(dir, "paybuttons")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".." // the service's own module
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// newKey makes a key for account with the service's own command, which prints only the secret.
func (s *server) newKey(t *testing.T, account string, flags ...string) string {
	args := append([]string{"keys", "create", "-account", account, "-db", s.db}, flags...)
	out, err := exec.Command(s.bin, args...).Output()
	if err != nil {
		t.Fatalf("paybuttons %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}
