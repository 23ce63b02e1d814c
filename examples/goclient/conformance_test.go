package goclient_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	_ "modernc.org/sqlite"
)

// TestConformance holds the service and openapi.json to each other both ways. The answer to a
// request of every kind (each route with each status it gives) has the status, Content-Type,
// headers and body the document declares for it, checked by a JSON Schema validator. And the
// document declares no status, error code or header that no answer gives.
func TestConformance(t *testing.T) {
	srv := startServer(t)
	doc := newDocument(t)
	readOnly, other := newKey(t, srv, true), newKey(t, srv, false)
	p, asJSON := "/product-payment/", "Content-Type: application/json"
	create := func(key string) string {
		r := doc.call(t, srv.url, "POST", p+"create", key, `{"productName":"P","amount":"1","currency":"USD",
			"paymentMethod":"Stripe","paymentType":"one_time","isLive":false}`)
		var answer struct{ Data string }
		json.Unmarshal(r, &answer)
		return answer.Data
	}
	id, deleted := create(srv.key), create(srv.key)
	for _, c := range []struct{ method, path, key, body, header string }{
		{"DELETE", p + "delete/" + deleted, srv.key, "", ""},
		{"GET", "/healthz", "", "", ""},
		{"GET", "/openapi.json", "", "", ""},
		{"GET", p + "get/" + id, srv.key, "", ""},
		{"GET", p + "get/" + id, "", "", ""},
		{"GET", p + "get/" + id, other, "", ""}, // another account's: 404
		{"GET", p + "list?limit=1", srv.key, "", ""},
		{"GET", p + "list?limit=0", srv.key, "", ""},
		{"GET", "/nope", srv.key, "", ""},
		{"POST", p + "create", srv.key, "{", asJSON},
		{"POST", p + "create", readOnly, "{}", ""},
		{"POST", p + "create", srv.key, "{}", "Content-Type: text/plain"},
		{"POST", p + "create", srv.key, strings.Repeat(" ", 64<<10+1), ""},
		{"POST", p + "update/" + id, srv.key, `{"amount":"2"}`, `If-Match: "1"`},
		{"POST", p + "update/" + id, srv.key, `{"amount":"3"}`, `If-Match: "1"`},
		{"POST", p + "update/" + deleted, srv.key, `{"amount":"3"}`, ""},
		{"POST", p + "update/btn_01JD0000000000000000000000", srv.key, `{"amount":"3"}`, ""},
		{"DELETE", p + "delete/" + id, srv.key, "", `If-Match: "9"`},
		{"DELETE", p + "delete/" + deleted, srv.key, "", ""},
		{"POST", p + "restore/" + id, srv.key, "", ""},
		{"POST", p + "restore/" + deleted, srv.key, "", ""},
		{"POST", p + "restore/" + deleted, srv.key, "", ""},
	} {
		doc.call(t, srv.url, c.method, c.path, c.key, c.body, c.header)
	}
	for route := range doc.operations() { // every route with another method: a 405
		_, template, _ := strings.Cut(route, " ")
		doc.call(t, srv.url, "PUT", strings.ReplaceAll(template, "{id}", id), srv.key, "")
	}
	// A write behind another process's lock is a 503; SQL that names no table, a 500 (a bug).
	db, _ := sql.Open("sqlite", "file:"+srv.db+"?_txlock=immediate")
	defer db.Close()
	if tx, err := db.Begin(); err == nil {
		doc.call(t, srv.url, "POST", p+"restore/"+id, srv.key, "")
		tx.Rollback()
	}
	db.Exec(`ALTER TABLE buttons RENAME TO gone`)
	doc.call(t, srv.url, "DELETE", p+"delete/"+id, srv.key, "")
	db.Exec(`ALTER TABLE gone RENAME TO buttons`)

	// The other way: every route it declares answers, and every status it declares, some answer gave.
	for route, op := range doc.operations() {
		if !doc.seen[route] {
			t.Errorf("openapi.json declares %s, and the server has no such route", route)
		}
		for status := range doc.deref(op["responses"]) {
			if !doc.seen["status "+status] {
				t.Errorf("openapi.json declares %s for %s, and no answer gave it", status, route)
			}
		}
	}
	codes := doc.deref(doc.deref(doc.deref(doc.root["components"])["schemas"])["ErrorCode"])["enum"]
	for _, code := range codes.([]any) {
		if !doc.seen["code "+code.(string)] {
			t.Errorf("openapi.json names the error code %s, and no answer gave it", code)
		}
	}
	for _, name := range doc.headerNames(doc.root) {
		if !doc.seen["header "+http.CanonicalHeaderKey(name)] && !slices.Contains([]string{"X-API-KEY", "If-Match"},
			name) {
			t.Errorf("openapi.json names the header %s, and no answer carried it", name)
		}
	}
	ifMatch := doc.schema(t, "#/components/parameters/IfMatch/schema")
	for value, valid := range map[string]bool{`"3"`: true, `*`: true, `""`: false, `"0"`: false, `"05"`: false} {
		if (ifMatch.Validate(value) == nil) != valid {
			t.Errorf("If-Match %s: the document's pattern says valid %v, the server %v", value, !valid, valid)
		}
	}
}

// document is openapi.json: decoded, compiled for its schemas, and noting what the answers gave.
type document struct {
	root     map[string]any
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema // by JSON pointer
	mu       sync.Mutex
	seen     map[string]bool // "METHOD /template" that answered, "status 404", "code CODE", "header NAME"
}

func newDocument(t *testing.T) *document {
	text, err := os.ReadFile("../../openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	d := &document{compiler: jsonschema.NewCompiler(), schemas: map[string]*jsonschema.Schema{},
		seen: map[string]bool{}}
	value, err := jsonschema.UnmarshalJSON(strings.NewReader(string(text)))
	if err == nil {
		err = d.compiler.AddResource("openapi.json", value)
	}
	if err == nil {
		err = json.Unmarshal(text, &d.root)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// deref is node as an object or, for {"$ref": "#/a/b"}, what that names; nil for neither.
func (d *document) deref(node any) map[string]any {
	object, _ := node.(map[string]any)
	if ref, ok := object["$ref"].(string); ok {
		object = d.root
		for _, key := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			object, _ = object[key].(map[string]any)
		}
	}
	return object
}

// pointer is where node is in the document, following $ref: the pointer given, or the one it names.
func pointer(node any, at string) string {
	object, _ := node.(map[string]any)
	if ref, ok := object["$ref"].(string); ok {
		return ref
	}
	return at
}

// schema compiles the schema at pointer (#/...) once.
func (d *document) schema(t *testing.T, pointer string) *jsonschema.Schema {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.schemas[pointer] == nil {
		s, err := d.compiler.Compile("openapi.json" + pointer)
		if err != nil {
			t.Fatal(err)
		}
		d.schemas[pointer] = s
	}
	return d.schemas[pointer]
}

// operations are the document's operations by "METHOD /template".
func (d *document) operations() map[string]map[string]any {
	ops := map[string]map[string]any{}
	for template, item := range d.deref(d.root["paths"]) {
		for method, op := range d.deref(item) {
			if method != "parameters" {
				ops[strings.ToUpper(method)+" "+template] = d.deref(op)
			}
		}
	}
	return ops
}

// call sends a request (key as X-API-KEY, header as "Name: value") and checks its answer against
// the document; it returns the body.
func (d *document) call(t *testing.T, url, method, p, key, body string, header ...string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, url+p, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for _, h := range header {
		if name, value, ok := strings.Cut(h, ": "); ok {
			req.Header.Set(name, value)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, p, err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	status := strconv.Itoa(resp.StatusCode)
	// The operation: the path's template, and its method; an unknown path, or another method, is the
	// mux's own 404 or 405, which the document declares as components.
	route, at := "", ""
	for r := range d.operations() {
		template := strings.SplitN(r, " ", 2)[1]
		if match, _ := path.Match(strings.ReplaceAll(template, "{id}", "*"), strings.Split(p, "?")[0]); match {
			route, at = method+" "+template, "#/paths/"+strings.ReplaceAll(template, "/", "~1")+"/"+
				strings.ToLower(method)+"/responses/"+status
		}
	}
	op := d.operations()[route]
	if op == nil && route == "" {
		at = "#/components/responses/NotFound"
	} else if op == nil {
		at, route = "#/components/responses/MethodNotAllowed", ""
	}
	response := d.deref(d.deref(op["responses"])[status])
	if op == nil {
		response = d.deref(map[string]any{"$ref": at})
	} else {
		at = pointer(d.deref(op["responses"])[status], at)
	}
	d.mu.Lock()
	d.seen["status "+status] = true
	if op != nil && status != "405" {
		d.seen[route] = true
	}
	for name := range resp.Header {
		d.seen["header "+http.CanonicalHeaderKey(name)] = true
	}
	var envelope struct{ Code string }
	if json.Unmarshal(text, &envelope) == nil && envelope.Code != "" {
		d.seen["code "+envelope.Code] = true
	}
	d.mu.Unlock()
	if response == nil {
		t.Errorf("%s %s answered %d, which openapi.json does not declare\n%s", method, p, resp.StatusCode, text)
		return text
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: got Content-Type %q, want application/json", method, p, ct)
	}
	for name, h := range d.deref(response["headers"]) {
		value, header := resp.Header.Get(name), d.deref(h)
		if value == "" && header["required"] == true {
			t.Errorf("%s %s answered %d without the header %s, which it requires", method, p, resp.StatusCode, name)
		} else if value != "" {
			var v any = value
			if n, err := strconv.Atoi(value); err == nil && d.deref(header["schema"])["type"] == "integer" {
				v = n
			}
			if err := d.schema(t, pointer(h, at+"/headers/"+name)+"/schema").Validate(v); err != nil {
				t.Errorf("%s %s answered %d with %s: %q: %v", method, p, resp.StatusCode, name, value, err)
			}
		}
	}
	value, err := jsonschema.UnmarshalJSON(strings.NewReader(string(text)))
	if err == nil {
		err = d.schema(t, at+"/content/application~1json/schema").Validate(value)
	}
	if err != nil {
		t.Errorf("%s %s answered %d: the body does not match openapi.json: %v\n%.300s", method, p,
			resp.StatusCode, err, text)
	}
	return text
}

// headerNames returns every header node names: a header parameter's name, a key of "headers".
func (d *document) headerNames(node any) []string {
	var names []string
	object, _ := node.(map[string]any)
	if object["in"] == "header" {
		names = append(names, fmt.Sprint(object["name"]))
	}
	for key, value := range object {
		if key == "headers" {
			names = slices.AppendSeq(names, maps.Keys(d.deref(value)))
		}
		names = append(names, d.headerNames(value)...)
	}
	return names
}
