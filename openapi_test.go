package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// openAPI is openapi.json, decoded once for every answer the suite checks (nil unless an object); nothing changes it.
var openAPI = sync.OnceValue(func() map[string]any { m, _ := decodeJSON[map[string]any](openAPIDocument); return m })

// decodeJSON decodes exactly one JSON value (anything after it breaks an answer), numbers as json.Number: no floats.
func decodeJSON[T any](b []byte) (v T, err error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	err = cmp.Or(dec.Decode(&v), map[bool]error{false: errors.New("not one JSON value")}[json.Valid(b)])
	return v, err
}

// deref returns node as an object or, for a {"$ref": "#/a/b"}, what that names (one hop); nil if it is none.
func deref(node any) map[string]any {
	m, _ := node.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		m = openAPI()
		for _, key := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, _ = m[key].(map[string]any)
		}
	}
	return m
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

// found returns the "$1 $2" of each match of re in text, sorted and joined by ", ".
func found(re, text string) string {
	r := regexp.MustCompile(re)
	return strings.Join(slices.Sorted(strings.SplitSeq(r.ReplaceAllString(strings.Join(r.FindAllString(text, -1), "\n"),
		"$1 $2"), "\n")), ", ")
}

// matchSchema checks value (decoded with UseNumber), named where, against a schema of openapi.json in the subset of
// JSON Schema the document uses. Any other keyword is an error: the document must promise nothing unchecked.
func matchSchema(node, value any, where string) error {
	s, _ := node.(map[string]any)
	if s == nil && node != true { // additionalProperties: false, or a $ref to nothing
		return fmt.Errorf("%s: got %.120s, want nothing here (schema %s)", where, jsonOf(value), jsonOf(node))
	}
	object, isObject := value.(map[string]any)
	text, isText := value.(string)
	got := map[byte]string{'{': "object", '[': "array", '"': "string", 't': "boolean", 'f': "boolean", 'n': "null"}[jsonOf(value)[0]]
	got = cmp.Or(got, map[bool]string{true: "number", false: "integer"}[strings.ContainsAny(jsonOf(value), ".eE")])
	same := func(v any) bool { return jsonOf(v) == jsonOf(value) }
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(s)) {
		ok, want := true, s[key]
		list, _ := want.([]any)
		switch key {
		case "description", "format", "examples", "default": // annotations
		case "$ref":
			errs = append(errs, matchSchema(deref(map[string]any{"$ref": want}), value, where))
		case "type": // a name or a list of them
			ok = slices.ContainsFunc(append([]any{want}, list...), func(t any) bool { return t == got || t == "number" && got == "integer" })
		case "const", "enum":
			ok = key == "const" && same(want) || key == "enum" && slices.ContainsFunc(list, same)
		case "required":
			want = slices.DeleteFunc(slices.Clone(list), func(p any) bool { _, in := object[fmt.Sprint(p)]; return in })
			ok = !isObject || len(want.([]any)) == 0
		case "properties", "additionalProperties":
			declared, _ := s["properties"].(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(object)) {
				if sub, ok := declared[name]; ok == (key == "properties") {
					errs = append(errs, matchSchema(cmp.Or(sub, want), object[name], where+"."+name))
				}
			}
		case "items":
			items, _ := value.([]any)
			for i, item := range items {
				errs = append(errs, matchSchema(want, item, fmt.Sprintf("%s[%d]", where, i)))
			}
		case "pattern":
			re, err := regexp.Compile(fmt.Sprint(want))
			ok = err == nil && (!isText || re.MatchString(text))
		case "minLength", "maxLength", "minimum", "maximum": // a string's JSON is in quotes: no number
			measure := map[bool]string{true: strconv.Itoa(len([]rune(text))), false: "-"}[isText]
			n, err := strconv.ParseFloat(map[bool]string{true: measure, false: jsonOf(value)}[key[3:] == "Length"], 64)
			bound, errBound := strconv.ParseFloat(jsonOf(want), 64)
			ok = errBound == nil && (err != nil || n == bound || (n > bound) == (key[:3] == "min"))
		case "anyOf", "allOf":
			failed := slices.DeleteFunc(slices.Clone(list), func(part any) bool { return matchSchema(part, value, where) == nil })
			ok = len(failed) == 0 || key == "anyOf" && len(failed) < len(list)
		default:
			errs = append(errs, fmt.Errorf("%s: matchSchema does not know keyword %s", where, key))
		}
		if !ok {
			errs = append(errs, fmt.Errorf("%s: got %.120s, want %s %.200s", where, jsonOf(value), key, jsonOf(want)))
		}
	}
	return errors.Join(errs...)
}

// conformsToDocument checks an answer against openapi.json: the operation for method and the URL's path
// (paths with {id} templates match /product-payment/get/<anything>), the response declared for status
// (or "default"), its schema (the body decoded with UseNumber), and the headers it declares as required.
func conformsToDocument(method string, u *url.URL, status int, header http.Header, body []byte) error {
	op := strings.ToLower(cmp.Or(map[string]string{"HEAD": "GET"}[method], method)) // a HEAD is its GET with no body
	template, paths := "", deref(openAPI()["paths"])
	for p := range paths { // {id} is one segment, as in the mux; "//", "." or ".." make no path, as in withBasics
		if ok, _ := path.Match(strings.ReplaceAll(p, "{id}", "*"), u.EscapedPath()); ok && path.Clean(u.Path) == u.Path {
			template = p
		}
	}
	responses := deref(deref(deref(paths[template])[op])["responses"]) // none: an unknown path, or method
	if name := map[bool]string{true: "404NotFound", false: "405MethodNotAllowed"}[template == ""]; responses == nil {
		responses = map[string]any{name[:3]: map[string]any{"$ref": "#/components/responses/" + name[3:]}}
	}
	r, ct := deref(cmp.Or(responses[strconv.Itoa(status)], responses["default"])), header.Get("Content-Type")
	errs := []error{map[bool]error{false: fmt.Errorf("got Content-Type %q, want application/json", ct)}[ct == "application/json"]}
	if r == nil {
		errs = append(errs, fmt.Errorf("openapi.json declares no such answer, only %v", slices.Sorted(maps.Keys(responses))))
	}
	for name, h := range deref(r["headers"]) { // one missing is null, which no header's schema takes
		h, v := deref(h), header.Get(name)
		value, err := decodeJSON[any]([]byte(v)) // an integer header as a JSON number, any other as text
		if integer := err == nil && deref(h["schema"])["type"] == "integer"; v != "" || h["required"] == true {
			errs = append(errs, matchSchema(h["schema"], map[bool]any{true: value, false: v}[integer || v == ""], name))
		}
	}
	if r != nil && method != "HEAD" && (template != "/openapi.json" || status != 200) { // not the document itself
		value, err := decodeJSON[any](body)
		errs = append(errs, cmp.Or(err, matchSchema(deref(deref(r["content"])["application/json"])["schema"], value, "body")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s answered %d: %w\nbody: %.300s", method, u.Path, status, err, body)
	}
	return nil
}

// TestOpenAPIDocument checks that openapi.json is served as it is, its operations are handlers.go's routes and are
// served, and that conformsToDocument refuses each answer that breaks it once (or it would take anything).
func TestOpenAPIDocument(t *testing.T) {
	e, want := newTestServer(t), "DELETE /product-payment/delete/{id}, GET /healthz, GET /openapi.json, "+
		"GET /product-payment/get/{id}, GET /product-payment/history/{id}, GET /product-payment/list, "+
		"POST /product-payment/create, POST /product-payment/restore/{id}, POST /product-payment/update/{id}"
	if r := e.do("GET", "/openapi.json", "", ""); r.status != 200 || string(r.raw) != string(openAPIDocument) {
		t.Fatalf("GET /openapi.json: got %d, %d bytes; want 200, openapi.json's %d", r.status, len(r.raw), len(openAPIDocument))
	}
	src, err := os.ReadFile("handlers.go")
	var documented []string
	for p, item := range deref(openAPI()["paths"]) {
		for op, o := range deref(item) {
			documented = append(documented, map[bool]string{true: strings.ToUpper(op) + " " + p}[deref(o) != nil])
		}
	}
	ops, routes := found(`(\S+) (\S+)`, strings.Join(documented, "\n")), found(`\broute\("(\w+)", "(\S*)"`, string(src))
	if ops != want || routes != want || err != nil {
		t.Fatalf("got operations %q\nand routes in handlers.go %q (%v)\nwant both %q", ops, routes, err, want)
	}
	id := e.create(e.key, createBody(nil))
	get, g := e.do("GET", "/product-payment/get/"+id, e.key, ""), "GET /product-payment/get/"+id
	bodies := map[string]string{"/product-payment/create": createBody(nil), "/product-payment/update/{id}": `{"amount":"1"}`}
	for _, op := range regexp.MustCompile(`(\w+) ([^,]+)`).FindAllStringSubmatch(want, -1) { // sorted: delete before restore
		if r := e.do(op[1], strings.Replace(op[2], "{id}", id, 1), e.key, bodies[op[2]]); r.status != 200 ||
			op[1] == "GET" && conformsToDocument("HEAD", &url.URL{Path: op[2]}, 200, r.header, nil) != nil {
			t.Errorf("%s: got %d %s, want 200, and for HEAD no body", r.request, r.status, r.raw)
		}
	}
	edit := func(old, new string) string { return strings.Replace(string(get.raw), old, new, 1) }
	refusal, ok, j := `{"isSuccess":false,"data":"","message":"m","code":"%s"}`, string(get.raw), "application/json"
	for _, c := range [][3]string{ // each breaks the document once: request, Content-Type (the only header), body
		{g + " 200", "", edit(`"isLive"`, `"extra":1,"isLive"`)}, {g + " 200", "", edit(`"metadata":{},`, ``)},
		{g + " 200", "", edit(`"version":1`, `"version":"1"`)}, {g + " 200", "", edit(`"USD"`, `"usd"`)},
		{g + " 200", "", ok + "{}"}, {g + " 200", j, ok}, {"HEAD" + g[3:] + " 200", j}, {g + " 418", "", ok},
		{g + " 404", "text/plain", fmt.Sprintf(refusal, "not_found")}, {g + " 404", "", fmt.Sprintf(refusal, "gone")},
		{"GET /nope 200", "", ok}, {g + "/ 200", "", ok}, {"POST /healthz 200", "", ok},
		{"POST /product-payment/create 200", j, `{"isSuccess":true,"data":"` + id + `","message":"created"}`},
		{"GET /product-payment/list 429", j, fmt.Sprintf(refusal, "rate_limited")},
		{"POST /healthz 405", j, fmt.Sprintf(refusal, "method_not_allowed")},
	} {
		request, header := strings.Fields(c[0]), map[bool]http.Header{true: get.header, false: {"Content-Type": {c[1]}}}[c[1] == ""]
		status, _ := strconv.Atoi(request[2])
		if conformsToDocument(request[0], &url.URL{Path: request[1]}, status, header, []byte(c[2])) == nil {
			t.Errorf("%s, Content-Type %q: got no error for %s", c[0], c[1], c[2])
		}
	}
	if err := matchSchema(map[string]any{"minItems": 1}, []any{}, ""); err == nil { // it says more than is checked
		t.Errorf("matchSchema with minItems: got no error, want one")
	}
}

// TestOpenAPIErrorCodesAndMoney checks that ErrorCode is what store.go can send, and that money in requests is text.
func TestOpenAPIErrorCodesAndMoney(t *testing.T) {
	want := "forbidden 403, idempotency_in_flight 409, idempotency_mismatch 422, internal 500, invalid_request 400, " +
		"method_not_allowed 405, not_found 404, payload_too_large 413, precondition_failed 412, rate_limited 429, " +
		"unauthorized 401, unavailable 503, unsupported_media_type 415, wrong_state 409"
	src, err := os.ReadFile("store.go")
	schema := deref(deref(deref(openAPI()["components"])["schemas"])["ErrorCode"])
	defined, enum := found(`errorCode\{"(\w+)", (\d+)\}`, string(src)), found(`(\w+)()`, fmt.Sprint(schema["enum"]))
	if described := found("`(\\w+)` \\((\\d+)\\)", fmt.Sprint(schema["description"])); defined != want ||
		described != want || enum != found(`(\w+) ()\d+`, want) || strings.Count(string(src), "errorCode{") != 14 {
		t.Errorf("got codes %q in store.go (%v), %q in ErrorCode, %q described; want %q", defined, err, enum, described, want)
	}
	for _, f := range strings.Fields("Create/amount Update/amount Create/ApplicationFeePercentage Update/ApplicationFeePercentage") {
		s := deref(map[string]any{"$ref": "#/components/schemas/" + strings.Replace(f, "/", "ButtonRequest/properties/", 1)})
		if s == nil || matchSchema(s, "19.90", "") != nil || matchSchema(s, json.Number("19"), "") == nil {
			t.Errorf("%s: got %s, want a string schema: \"19.90\" but no number, never a float", f, jsonOf(s))
		}
	}
}
