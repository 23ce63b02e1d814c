package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// openAPI is openapi.json, decoded once for every answer the suite checks; nothing changes it.
var openAPI, _ = decodeJSON[map[string]any](openAPIDocument)

// decodeJSON decodes exactly one JSON value, its numbers as json.Number: no floats.
func decodeJSON[T any](b []byte) (v T, err error) {
	if !json.Valid(b) {
		return v, errors.New("not one JSON value")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	err = dec.Decode(&v)
	return v, err
}

// deref returns node as an object or, for {"$ref": "#/a/b"}, what that names; nil for neither.
func deref(node any) map[string]any {
	object, _ := node.(map[string]any)
	if ref, ok := object["$ref"].(string); ok {
		object = openAPI
		for _, key := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			object, _ = object[key].(map[string]any)
		}
	}
	return object
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

// matchSchema checks value, named where, against a schema in the subset of JSON Schema openapi.json
// uses: any other keyword is an error, so that the document promises nothing unchecked.
func matchSchema(node, value any, where string) error {
	s, isSchema := node.(map[string]any)
	if !isSchema && node != true { // additionalProperties: false, or a $ref to nothing
		return fmt.Errorf("%s: got %.120s, want nothing here", where, jsonOf(value))
	}
	object, isObject := value.(map[string]any)
	text, isText := value.(string)
	typ := map[byte]string{'{': "object", '[': "array", '"': "string", 't': "boolean", 'f': "boolean",
		'n': "null"}[jsonOf(value)[0]]
	if typ == "" && strings.ContainsAny(jsonOf(value), ".eE") {
		typ = "number"
	} else if typ == "" {
		typ = "integer"
	}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(s)) {
		want, ok := s[key], true
		list, _ := want.([]any)
		switch key {
		case "description", "format", "examples", "default": // annotations
		case "$ref":
			errs = append(errs, matchSchema(deref(s), value, where))
		case "type":
			types := append(list, want) // a name, or a list of names
			ok = slices.Contains(types, any(typ)) || typ == "integer" && slices.Contains(types, any("number"))
		case "const":
			ok = jsonOf(want) == jsonOf(value)
		case "enum":
			ok = slices.ContainsFunc(list, func(v any) bool { return jsonOf(v) == jsonOf(value) })
		case "required":
			for _, name := range list {
				_, in := object[name.(string)]
				ok = ok && (in || !isObject)
			}
		case "properties", "additionalProperties": // each member: its declared schema or that one
			declared, _ := s["properties"].(map[string]any)
			for name, v := range object {
				if schema, in := declared[name]; in == (key == "properties") {
					errs = append(errs, matchSchema(cmp.Or(schema, want), v, where+"."+name))
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
		case "minLength", "maxLength": // of a string, in characters
			bound, _ := want.(json.Number).Int64()
			n := int64(utf8.RuneCountInString(text))
			ok = !isText || key == "minLength" && n >= bound || key == "maxLength" && n <= bound
		case "minimum", "maximum": // of a number
			bound, _ := want.(json.Number).Float64()
			n, err := strconv.ParseFloat(jsonOf(value), 64) // fails for all but a number
			ok = err != nil || key == "minimum" && n >= bound || key == "maximum" && n <= bound
		case "anyOf":
			ok = slices.ContainsFunc(list, func(s any) bool { return matchSchema(s, value, where) == nil })
		default:
			errs = append(errs, fmt.Errorf("%s: matchSchema does not know keyword %s", where, key))
		}
		if !ok {
			errs = append(errs, fmt.Errorf("%s: got %.120s, want %s %.200s", where, jsonOf(value), key,
				jsonOf(want)))
		}
	}
	return errors.Join(errs...)
}

// operation is what openapi.json declares for method on the URL path p ("//", "." and ".." make no
// path, as in withBasics), and the path's template: nil and "" for none.
func operation(method, p string) (map[string]any, string) {
	paths, template := deref(openAPI["paths"]), ""
	for t := range paths {
		match, _ := path.Match(strings.ReplaceAll(t, "{id}", "*"), p)
		if match && path.Clean(p) == p {
			template = t
		}
	}
	return deref(deref(paths[template])[strings.ToLower(method)]), template
}

// conformsToDocument checks an answer against the response openapi.json declares for it: its
// Content-Type, the headers it requires and its body's schema.
func conformsToDocument(method string, u *url.URL, status int, header http.Header, body []byte) error {
	op, template := operation(method, u.EscapedPath())
	responses := deref(op["responses"])
	if responses == nil && template == "" { // the mux's own answers
		responses = map[string]any{"404": map[string]any{"$ref": "#/components/responses/NotFound"}}
	} else if responses == nil {
		responses = map[string]any{"405": map[string]any{"$ref": "#/components/responses/MethodNotAllowed"}}
	}
	r := deref(responses[strconv.Itoa(status)])
	var errs []error
	if ct := header.Get("Content-Type"); ct != "application/json" {
		errs = append(errs, fmt.Errorf("got Content-Type %q, want application/json", ct))
	}
	if r == nil {
		errs = append(errs, fmt.Errorf("no such answer; only %v", slices.Collect(maps.Keys(responses))))
	}
	for name, h := range deref(r["headers"]) {
		h, got := deref(h), header.Get(name)
		switch {
		case got == "" && h["required"] == true:
			errs = append(errs, fmt.Errorf("got no %s header, which is required", name))
		case got != "" && deref(h["schema"])["type"] == "integer":
			n, _ := decodeJSON[any]([]byte(got)) // no number: null, which the schema refuses
			errs = append(errs, matchSchema(h["schema"], n, name))
		case got != "":
			errs = append(errs, matchSchema(h["schema"], got, name))
		}
	}
	value, err := decodeJSON[any](body)
	schema := deref(deref(r["content"])["application/json"])["schema"]
	errs = append(errs, cmp.Or(err, matchSchema(schema, value, "body")))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s answered %d: %w\nbody: %.300s", method, u.Path, status, err, body)
	}
	return nil
}

// The document and the server agree both ways: conformsToDocument refuses what breaks the document, and
// the document names no route, header or code the server lacks; served, it names -provider-name.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	e := newTestServer(t)
	g := "/product-payment/get/" + e.create(e.key, createBody(nil))
	get := e.do("GET", g, e.key, "")
	good, header := string(get.raw), get.header
	edit := func(old, new string) string { return strings.Replace(good, old, new, 1) }
	refusal := `{"isSuccess":false,"data":"","message":"m","code":"%s"}`
	bare, text := http.Header{"Content-Type": {"application/json"}}, http.Header{"Content-Type": {"text/x"}}
	for _, c := range []struct {
		method, path string
		status       int
		header       http.Header
		body         string
	}{
		{"GET", g, 200, header, edit(`"isLive"`, `"extra":1,"isLive"`)},
		{"GET", g, 200, header, edit(`"metadata":{},`, ``)},
		{"GET", g, 200, header, edit(`"version":1`, `"version":"1"`)},
		{"GET", g, 200, header, good + "{}"},
		{"GET", g, 200, bare, good}, // no ETag
		{"GET", g, 418, header, good},
		{"GET", g, 404, text, fmt.Sprintf(refusal, "not_found")},
		{"GET", g, 404, header, fmt.Sprintf(refusal, "gone")},
		{"GET", "/nope", 200, header, good},
		{"POST", "/healthz", 405, bare, fmt.Sprintf(refusal, "method_not_allowed")},         // no Allow
		{"POST", "/product-payment/create", 503, bare, fmt.Sprintf(refusal, "unavailable")}, // no Retry-After
	} {
		err := conformsToDocument(c.method, &url.URL{Path: c.path}, c.status, c.header, []byte(c.body))
		expect(t, err != nil, "%s %s %d: got no error for %s", c.method, c.path, c.status, c.body)
	}
	err := matchSchema(map[string]any{"minItems": 1}, []any{}, "")
	expect(t, err != nil, "matchSchema with minItems: got no error, want one for a keyword it does not check")
	// Every operation it names is routed; every code it names is sent; it names the headers served.
	for template, item := range deref(openAPI["paths"]) {
		for method := range deref(item) {
			if !slices.Contains([]string{"get", "post", "delete"}, method) {
				continue // the path's parameters
			}
			p := strings.ReplaceAll(template, "{id}", "btn_01JD0000000000000000000000")
			r := e.do(strings.ToUpper(method), p, e.key, "{}")
			expect(t, r.status != 405 && r.env.Message != errNoPath.message, "%s: got %s", r.request, r.raw)
		}
	}
	var codes []string
	for _, code := range deref(deref(deref(openAPI["components"])["schemas"])["ErrorCode"])["enum"].([]any) {
		codes = append(codes, code.(string))
	}
	slices.Sort(codes)
	expect(t, slices.Equal(codes, slices.Sorted(maps.Keys(statusOf))), "got codes %v, want statusOf's", codes)
	for _, name := range headerNames(openAPI) {
		expect(t, slices.Contains([]string{"X-API-KEY", "If-Match", "ETag", "Allow", "Retry-After",
			"X-Request-Id"}, name), "openapi.json names the header %s, which the server does not have", name)
	}
	ifMatch := deref(deref(deref(openAPI["components"])["parameters"])["IfMatch"])["schema"]
	for value, ok := range map[string]bool{`"3"`: true, `*`: true, `""`: false, `"0"`: false, `"05"`: false} {
		err := matchSchema(ifMatch, value, "If-Match")
		expect(t, (err == nil) == ok, "If-Match %s: got %v, want valid %v", value, err, ok)
	}
	// The served document names -provider-name where the file says "the service".
	rec := httptest.NewRecorder()
	newServer(nil, slog.New(slog.DiscardHandler), "Acme Pay").ServeHTTP(rec, httptest.NewRequest("GET",
		"/openapi.json", nil))
	served, err := decodeJSON[map[string]any](rec.Body.Bytes())
	methods := deref(deref(deref(served["components"])["schemas"])["PaymentMethod"])["enum"]
	expect(t, err == nil && jsonOf(methods) == `["Acme Pay","Stripe","StripeConnect"]`,
		"-provider-name \"Acme Pay\": got paymentMethod %v (%v)", methods, err)
}

// headerNames returns every header node names: the name of a header parameter, a key of "headers".
func headerNames(node any) []string {
	var names []string
	object, _ := node.(map[string]any)
	if object["in"] == "header" {
		names = append(names, fmt.Sprint(object["name"]))
	}
	for key, value := range object {
		if key == "headers" {
			names = slices.AppendSeq(names, maps.Keys(deref(value)))
		}
		names = append(names, headerNames(value)...)
	}
	return names
}
