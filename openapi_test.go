package main

// These tests keep openapi.json true to the service: the routes, the served
// bytes, every example, the names, enums and limits of the schemas, and how
// lenient the request schemas are. conformsToDocument checks every answer the
// test suite reads through callAPI against the document.
//
// The document's example conventions (also in its info.description):
//   - Every request body example (requestBody ... examples) is accepted: 200.
//   - The examples of the 400 answer of create and of update are refused
//     requests. Each holds the request body in x-request (an object is sent as
//     JSON, a string as raw text), any request headers in x-headers, and the
//     service's exact answer in value. Such a request stores nothing.
//   - An update example, accepted or refused, names in x-button the create
//     example whose new button it is applied to.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

const (
	createPath = "/product-payment/create"
	updatePath = "/product-payment/update/{id}"
)

// openAPI is the embedded openapi.json, decoded once with numbers kept as
// their text. Nothing may change it.
var openAPI = sync.OnceValue(func() map[string]any {
	doc, err := decodeNumbers(openAPIDocument)
	if err != nil {
		panic(fmt.Sprintf("openapi.json is not JSON: %v", err))
	}
	return doc.(map[string]any)
})

func decodeNumbers(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	return v, dec.Decode(&v)
}

// resolved returns node as an object, following "$ref"s; nil when it is not
// one or a reference leads nowhere.
func resolved(doc map[string]any, node any) map[string]any {
	m, _ := node.(map[string]any)
	for m != nil && m["$ref"] != nil {
		ref, _ := m["$ref"].(string)
		m = doc
		for _, key := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, _ = m[key].(map[string]any)
		}
	}
	return m
}

// docNode walks keys down from node, following "$ref"s, and fails the test
// when a key is missing or a node is not an object.
func docNode(t *testing.T, doc map[string]any, node any, keys ...string) map[string]any {
	t.Helper()
	m := resolved(doc, node)
	for i, key := range keys {
		if m = resolved(doc, m[key]); m == nil {
			t.Fatalf("openapi.json: %s is missing or not an object", strings.Join(keys[:i+1], "/"))
		}
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// strs returns the strings of a JSON array, such as an enum or a required list.
func strs(list any) []string {
	var out []string
	for _, v := range list.([]any) {
		out = append(out, v.(string))
	}
	return out
}

// sameSet fails unless got and want hold the same strings, in any order and
// counting repeats once.
func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = slices.Compact(slices.Sorted(slices.Values(got))), slices.Compact(slices.Sorted(slices.Values(want)))
	if !slices.Equal(got, want) {
		t.Errorf("%s:\ngot  %q\nwant %q", what, got, want)
	}
}

var muxPattern = regexp.MustCompile(`mux\.Handle(?:Func)?\(\s*"([A-Z]+) ([^"\s]+)"`)

// TestOpenAPIRoutesMatchTheMux checks the operations both ways against the
// mux patterns; the mux answers HEAD for every GET route, so the document
// has a head operation for each.
func TestOpenAPIRoutesMatchTheMux(t *testing.T) {
	src, err := os.ReadFile("handlers.go")
	if err != nil {
		t.Fatal(err)
	}
	var routes, documented []string
	for _, m := range muxPattern.FindAllStringSubmatch(string(src), -1) {
		if routes = append(routes, m[1]+" "+m[2]); m[1] == "GET" {
			routes = append(routes, "HEAD "+m[2])
		}
	}
	if len(routes) == 0 {
		t.Fatal("found no mux.Handle or mux.HandleFunc pattern in handlers.go")
	}
	doc := openAPI()
	for path, item := range docNode(t, doc, doc, "paths") {
		for method := range item.(map[string]any) {
			if method != "parameters" {
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sameSet(t, "operations in openapi.json vs routes in handlers.go", documented, routes)
}

// TestOpenAPIDocumentAndOtherAnswers checks the served document, that
// conformsToDocument refuses what breaks the document, and what callAPI
// cannot read: the bodiless HEAD answers and the metrics text.
func TestOpenAPIDocumentAndOtherAnswers(t *testing.T) {
	on, off := newTestServer(t), newTestServer(t, func(c *config) { c.metrics = false })
	r := on.do("GET", "/openapi.json", "", "") // checked against its own Document answer
	if want, err := os.ReadFile("openapi.json"); err != nil || r.status != 200 || !bytes.Equal(r.raw, want) {
		t.Errorf("GET /openapi.json without a key: got %d and %d bytes, want 200 and the %d of openapi.json (%v)",
			r.status, len(r.raw), len(want), err)
	}
	id := on.create(on.key, createBody(nil))
	// The check can fail: each answer below breaks the document in one way.
	get, path := on.do("GET", "/product-payment/get/"+id, on.key, ""), &url.URL{Path: "/product-payment/get/" + id}
	noETag := get.header.Clone()
	noETag.Del("ETag")
	for _, c := range []struct {
		status int
		header http.Header
		body   string
	}{
		{200, noETag, string(get.raw)}, {200, get.header, strings.Replace(string(get.raw), `"metadata":{},`, ``, 1)},
		{200, get.header, strings.Replace(string(get.raw), `"active"`, `"gone"`, 1)}, {418, get.header, `{}`},
		{404, get.header, `{"isSuccess":false,"data":"","message":"x","code":"unauthorized"}`},
		{429, get.header, `{"isSuccess":false,"data":"","message":"x","code":"rate_limited"}`}, // without Retry-After
	} {
		if err := conformsToDocument("GET", path, c.status, c.header, []byte(c.body)); err == nil {
			t.Errorf("got no error for %d %s", c.status, c.body)
		}
	}
	for _, c := range []struct {
		url, method string
		status      int
	}{
		{on.url + "/product-payment/get/" + id, "HEAD", 200}, {on.url + "/product-payment/list?limit=0", "HEAD", 400},
		{on.url + "/healthz", "HEAD", 200}, {on.url + "/metrics", "GET", 200}, {off.url + "/metrics", "GET", 404},
	} {
		req, _ := http.NewRequest(c.method, c.url, nil)
		req.Header.Set("X-API-KEY", on.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := conformsToDocument(c.method, req.URL, resp.StatusCode, resp.Header, body); err != nil || resp.StatusCode != c.status {
			t.Errorf("%s %s: got %d (%v), want %d as openapi.json says", c.method, c.url, resp.StatusCode, err, c.status)
		}
	}
}

// exampleBody is the body an example describes: a string as it is, anything
// else as JSON.
func exampleBody(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// examplesOf returns the request body examples of the POST at path, or with
// refused those of its 400 answer.
func examplesOf(t *testing.T, doc map[string]any, path string, refused bool) map[string]any {
	t.Helper()
	op := docNode(t, doc, doc, "paths", path, "post")
	if refused {
		return docNode(t, doc, op, "responses", "400", "content", "application/json", "examples")
	}
	return docNode(t, doc, op, "requestBody", "content", "application/json", "examples")
}

// TestOpenAPIRequestExamples sends every create and update example to a real
// server: the accepted ones are, the refused ones get exactly their documented
// answer and change nothing.
func TestOpenAPIRequestExamples(t *testing.T) {
	e := newTestServer(t)
	doc := openAPI()
	buttons := examplesOf(t, doc, createPath, false)
	for _, path := range []string{createPath, updatePath} {
		for _, refused := range []bool{false, true} {
			for name, v := range examplesOf(t, doc, path, refused) {
				example, target, id := v.(map[string]any), path, ""
				if path == updatePath { // on a new button of the create example x-button names
					create, ok := buttons[fmt.Sprint(example["x-button"])].(map[string]any)
					if !ok {
						t.Fatalf("%s: got x-button %v, want the name of a create example", name, example["x-button"])
					}
					id = e.create(e.key, exampleBody(create["value"]))
					target = "/product-payment/update/" + id
				}
				state := func() any { b, _ := e.stored("acme", id); return []any{e.countButtons(), b} }
				before, body, headers := state(), example["value"], []string{}
				if refused {
					body = example["x-request"]
					given, _ := example["x-headers"].(map[string]any)
					for _, header := range sortedKeys(given) {
						headers = append(headers, header, given[header].(string))
					}
				}
				r := e.do("POST", target, e.key, exampleBody(body), headers...)
				if !refused {
					r.want(t, 200, "")
					if message := map[string]string{createPath: "created", updatePath: "updated"}[path]; r.env.Message != message {
						t.Errorf("%s: %s\ngot message %q, want %q", name, r.request, r.env.Message, message)
					}
					continue
				}
				if got, _ := decodeNumbers(r.raw); body == nil || r.status != 400 || !reflect.DeepEqual(got, example["value"]) {
					wantJSON, _ := json.Marshal(example["value"])
					t.Errorf("%s: %s\ngot  %d %s\nwant 400 %s (the refused request in x-request)", name, r.request, r.status, r.raw, wantJSON)
				}
				if after := state(); !reflect.DeepEqual(after, before) {
					t.Errorf("%s: %s\ngot %v after it, want nothing changed: %v", name, r.request, after, before)
				}
			}
		}
	}
}

// TestOpenAPIExamplesMatchTheirSchemas checks every example: a schema's own,
// and those of every parameter, header and media type. Ids must be ids: a
// reader who copies one gets a 404 for a missing button, not a malformed id.
func TestOpenAPIExamplesMatchTheirSchemas(t *testing.T) {
	doc := openAPI()
	check := func(schema, example any) {
		if err := matchSchema(doc, schema, example, "example"); err != nil {
			t.Errorf("%v\nin %s", err, exampleBody(schema))
		}
	}
	var walk func(node any)
	walk = func(node any) {
		switch node := node.(type) {
		case []any:
			for _, child := range node {
				walk(child)
			}
		case string:
			if strings.HasPrefix(node, "btn_") && !validButtonID(node) {
				t.Errorf("got example id %q, want one validButtonID accepts", node)
			}
		case map[string]any:
			own, _ := node["examples"].([]any) // a schema's
			for _, example := range own {
				check(node, example)
			}
			if schema, ok := node["schema"]; ok { // a parameter's, header's or media type's
				if example, ok := node["example"]; ok {
					check(schema, example)
				}
				examples, _ := node["examples"].(map[string]any)
				for _, example := range examples {
					check(schema, resolved(doc, example)["value"])
				}
			}
			for _, child := range node {
				walk(child)
			}
		}
	}
	walk(doc)
}

// quotedWords returns the "quoted" words of a message, such as the allowed values
// in `must be one of "a", "b"`.
func quotedWords(message string) []string {
	var words []string
	for _, m := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(message, -1) {
		words = append(words, m[1])
	}
	return words
}

// problemsOf returns the field -> why of an invalid_request error.
func problemsOf(t *testing.T, err error) map[string]string {
	t.Helper()
	var invalid *apiError
	if !errors.As(err, &invalid) || invalid.code != "invalid_request" {
		t.Fatalf("got error %v, want invalid_request", err)
	}
	return invalid.fields
}

// errorOf returns the error of a call that is expected to fail.
func errorOf[T any](_ T, err error) error { return err }

// jsonNames returns the JSON field names of struct v.
func jsonNames(v any) []string {
	var names []string
	for field := range reflect.TypeOf(v).Fields() {
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

// queryDecoders decode the query of each operation that reads one, into the
// value of each whole-number parameter.
var queryDecoders = map[string]func(string) (map[string]int64, error){
	"/product-payment/list": func(q string) (map[string]int64, error) {
		f, err := decodeListQuery(q, "the service")
		return map[string]int64{"limit": int64(f.Limit)}, err
	},
	"/product-payment/history/{id}": func(q string) (map[string]int64, error) {
		limit, after, err := decodeHistoryQuery(q)
		return map[string]int64{"limit": limit, "after": after}, err
	},
	"/product-payment/changes": func(q string) (map[string]int64, error) {
		since, limit, wait, err := decodeChangesQuery(q)
		return map[string]int64{"since": since, "limit": limit, "wait": int64(wait / time.Second)}, err
	},
}

func TestOpenAPISchemasMatchValidation(t *testing.T) {
	doc := openAPI()
	schema := func(keys ...string) map[string]any {
		return docNode(t, doc, doc, append([]string{"components", "schemas"}, keys...)...)
	}
	refused := func(err error, field string) []string { return quotedWords(problemsOf(t, err)[field]) }

	t.Run("fields, limits and enums", func(t *testing.T) {
		sameSet(t, "CreateButtonRequest properties vs createFields", sortedKeys(schema("CreateButtonRequest", "properties")), createFields)
		sameSet(t, "UpdateButtonRequest properties vs updateFields", sortedKeys(schema("UpdateButtonRequest", "properties")), updateFields)
		var required []string
		for field, why := range problemsOf(t, errorOf(decodeCreate([]byte(`{}`), "the service"))) {
			if why == "is required" {
				required = append(required, field)
			}
		}
		sameSet(t, "CreateButtonRequest required vs decodeCreate's", strs(schema("CreateButtonRequest")["required"]), required)
		for _, field := range fixedFields {
			if !strings.Contains(schema("UpdateButtonRequest")["description"].(string), "`"+field+"`") {
				t.Errorf("got UpdateButtonRequest description without `%s`, want every fixed field named", field)
			}
		}
		// The other limits are held to validate.go's by the lenience probes.
		if got := schema("Metadata")["maxProperties"]; got != json.Number(strconv.Itoa(maxMetadataKeys)) {
			t.Errorf("got Metadata maxProperties %v, want %d", got, maxMetadataKeys)
		}
		create := func(body string) error { return errorOf(decodeCreate([]byte(body), "the service")) }
		sameSet(t, "PaymentType enum", strs(schema("PaymentType")["enum"]), refused(create(`{"paymentType":"?"}`), "paymentType"))
		sameSet(t, "PaymentMethod enum", strs(schema("PaymentMethod")["enum"]), refused(create(`{"paymentMethod":"?"}`), "paymentMethod"))
		sameSet(t, "list paymentMethod enum", strs(schema("PaymentMethod")["enum"]),
			refused(errorOf(decodeListQuery("paymentMethod=%3F", "the service")), "paymentMethod"))
		sameSet(t, "list state enum", strs(docNode(t, doc, doc, "components", "parameters", "State", "schema")["enum"]),
			refused(errorOf(decodeListQuery("state=%3F", "the service")), "state"))
		sameSet(t, "BillingInterval enum vs what billingIntervals stores", strs(schema("BillingInterval")["enum"]),
			slices.Collect(maps.Values(billingIntervals)))
		sameSet(t, "ButtonState enum", strs(schema("ButtonState")["enum"]), []string{stateActive, stateDeleted})
		for spelling := range billingIntervals { // the request pattern takes every spelling, in any case
			for _, s := range []string{spelling, strings.ToUpper(spelling), strings.ToUpper(spelling[:1]) + spelling[1:]} {
				if err := matchSchema(doc, schema("BillingIntervalInput"), s, "billingInterval"); err != nil {
					t.Error(err)
				}
			}
		}
	})

	t.Run("query parameters", func(t *testing.T) {
		want := map[string][]string{"/product-payment/list": {"limit", "after", "state", "isLive", "paymentMethod", "metadata"},
			"/product-payment/history/{id}": {"limit", "after"}, "/product-payment/changes": {"since", "limit", "wait"}}
		for path, decode := range queryDecoders {
			var names []string
			defaults, _ := decode("")
			for _, p := range docNode(t, doc, doc, "paths", path, "get")["parameters"].([]any) {
				param, s := docNode(t, doc, p), docNode(t, doc, p, "schema")
				name := param["name"].(string)
				if names = append(names, name); param["style"] == "deepObject" {
					name += "[key]"
				}
				if _, err := decode(name + "=x"); err != nil && strings.HasPrefix(problemsOf(t, err)[name], "unknown") {
					t.Errorf("%s: the decoder does not know the documented parameter %s", path, name)
				} else if s["type"] == "integer" && s["default"] != json.Number(strconv.FormatInt(defaults[name], 10)) {
					t.Errorf("%s %s: got default %v, want %d, the decoder's", path, name, s["default"], defaults[name])
				}
				for key, beyond := range map[string]int64{"minimum": -1, "maximum": 1} {
					if bound, ok := s[key].(json.Number); ok {
						n, _ := bound.Int64()
						_, at := decode(fmt.Sprintf("%s=%d", name, n))
						if _, past := decode(fmt.Sprintf("%s=%d", name, n+beyond)); at != nil || past == nil {
							t.Errorf("%s %s: %s %d: got %v at it and %v past it, want it accepted, past it refused", path, name, key, n, at, past)
						}
					}
				}
			}
			sameSet(t, path+" query parameters", names, want[path])
		}
	})

	t.Run("read views", func(t *testing.T) {
		for name, view := range map[string]any{"Button": buttonView{}, "ButtonPage": page[buttonView, *string]{},
			"HistoryPage": page[historyItem, *int64]{}, "ChangesPage": page[buttonView, int64]{}, "HistoryEntry": historyItem{},
			"TextChange": change{}, "FlagChange": change{}} {
			sameSet(t, name+" properties vs its Go view", sortedKeys(schema(name, "properties")), jsonNames(view))
			sameSet(t, name+" required vs its Go view", strs(schema(name)["required"]), jsonNames(view))
		}
		audited, changes := auditedFields(button{Metadata: metadata{"orderRef": "A-17"}}), map[string]any{}
		sameSet(t, "HistoryChanges properties and a metadata key vs auditedFields",
			append(sortedKeys(schema("HistoryChanges", "properties")), "metadata.orderRef"), sortedKeys(audited))
		for name := range audited {
			changes[name] = map[string]any{"from": nil, "to": "x"}
		}
		changes["isLive"] = map[string]any{"from": nil, "to": false}
		if err := matchSchema(doc, schema("HistoryChanges"), changes, "changes"); err != nil {
			t.Error(err)
		}
	})

	t.Run("error codes", func(t *testing.T) {
		codes := strs(schema("ErrorCode")["enum"])
		sameSet(t, "ErrorCode enum vs statusOf", codes, sortedKeys(statusOf))
		var answered []string
		for path, item := range docNode(t, doc, doc, "paths") {
			for method, op := range item.(map[string]any) {
				responses, _ := resolved(doc, op)["responses"].(map[string]any)
				for status, r := range responses {
					content, _ := resolved(doc, r)["content"].(map[string]any)
					for _, code := range responseCodes(doc, resolved(doc, content["application/json"])["schema"]) {
						if answered = append(answered, code); strconv.Itoa(statusOf[code]) != status {
							t.Errorf("%s %s: status %s answers code %s, which is %d", method, path, status, code, statusOf[code])
						}
					}
				}
			}
		}
		// No client receives canceled: the access log records it when the client went away.
		sameSet(t, "codes the operations answer", answered, slices.DeleteFunc(codes, func(c string) bool { return c == "canceled" }))
		if !strings.Contains(docNode(t, doc, doc, "info")["description"].(string), "`499 canceled`") {
			t.Error("got info.description without `499 canceled`, want it said that no client receives it")
		}
	})
}

// responseCodes returns the error codes an answer's schema allows: the code
// const or enum of the schema or of its allOf parts.
func responseCodes(doc map[string]any, node any) []string {
	s := resolved(doc, node)
	code, _ := resolved(doc, s["properties"])["code"].(map[string]any)
	enum, _ := code["enum"].([]any)
	var codes []string
	for _, v := range append(enum, code["const"]) {
		if c, ok := v.(string); ok {
			codes = append(codes, c)
		}
	}
	parts, _ := s["allOf"].([]any)
	for _, part := range parts {
		codes = append(codes, responseCodes(doc, part)...)
	}
	return codes
}

// TestOpenAPIRequestsAreAsLenientAsTheServer holds the request schemas to the
// server's rules value by value: a schema that refused what the server accepts
// would make a generated client refuse good requests. Where a rule needs more
// than a schema can say (an amount's places in its currency, the currency
// list, the keys left after a merge), the schema is the more lenient.
func TestOpenAPIRequestsAreAsLenientAsTheServer(t *testing.T) {
	doc := openAPI()
	x := func(n int) string { return strings.Repeat("x", n) }
	decode := func(text string) any { v, _ := decodeNumbers([]byte(text)); return v }
	keys := func(n int, value string) string { // "k0": value, "k1": value, ...
		entries := make([]string, n)
		for i := range entries {
			entries[i] = fmt.Sprintf(`"k%d":%s`, i, value)
		}
		return strings.Join(entries, ",")
	}
	for _, p := range []struct {
		kind, value    string // create (fields that replace createBody's), update (a body), If-Match (the header)
		server, schema bool   // whether each accepts it
	}{
		{"create", `{"productName":"\tPro\n","currency":"usd","description":null,"metadata":null}`, true, true},
		{"create", `{"productName":" ` + strings.Repeat("é", maxNameRunes) + `\u00a0\u3000"}`, true, true},
		{"create", `{"productName":"` + x(maxNameRunes+1) + `"}`, false, false},
		{"create", `{"productName":"a\u0001b"}`, false, false},
		{"create", `{"productName":"   "}`, false, true},
		{"create", `{"amount":19.9,"description":"a\tb\r\n` + x(maxDescriptionRunes-5) + `"}`, true, true},
		{"create", `{"description":"` + x(maxDescriptionRunes+1) + `"}`, false, false},
		{"create", `{"amount":"1e3"}`, false, false},
		{"create", `{"amount":1e3}`, false, true},
		{"create", `{"amount":"19.999","currency":"XAU"}`, false, true},
		{"create", `{"paymentType":"subscription","billingInterval":"Annually"}`, true, true},
		{"create", `{"paymentType":"subscription","billingInterval":"fortnightly"}`, false, false},
		{"create", `{"billingInterval":"","ApplicationFeePercentage":null,"isLive":true}`, true, true},
		{"create", `{"paymentMethod":"StripeConnect","ApplicationFeePercentage":"2.500"}`, true, true},
		{"create", `{"paymentMethod":"StripeConnect","ApplicationFeePercentage":"2.505"}`, false, false},
		{"create", `{"paymentMethod":"stripe","isLive":"true","productname":"Pro"}`, false, false},
		{"create", `{"metadata":{"a.b-c_D":"x","gone":null,"empty":"","` + x(maxMetadataKeyBytes) + `":"` + x(maxMetadataRunes) + `"}}`, true, true},
		{"create", `{"metadata":{"` + x(maxMetadataKeyBytes+1) + `":"x"}}`, false, false},
		{"create", `{"metadata":{"k":"` + x(maxMetadataRunes+1) + `"}}`, false, false},
		{"update", `{"productName":null,"amount":"5","description":null}`, true, true},
		{"update", `{"metadata":{` + keys(maxMetadataKeys+10, "null") + `}}`, true, true},
		{"update", `{"metadata":{` + keys(maxMetadataKeys+1, `"v"`) + `}}`, false, true},
		{"update", `{"metadata":null}`, false, true},
		{"update", `{"isLive":true}`, false, false},
		{"If-Match", `"3"`, true, true},
		{"If-Match", `*`, true, true},
		{"If-Match", `"\x31\u0032\063"`, true, true},
		{"If-Match", `W/"3"`, false, false},
		{"If-Match", `"0"`, false, true},
	} {
		var server error
		var schema, value any = docNode(t, doc, doc, "components", "parameters", "IfMatch", "schema"), p.value
		switch p.kind {
		case "create": // numbers keep their text
			body := decode(createBody(nil)).(map[string]any)
			maps.Copy(body, decode(p.value).(map[string]any))
			text, _ := json.Marshal(body)
			_, server = decodeCreate(text, "the service")
			schema, value = docNode(t, doc, doc, "components", "schemas", "CreateButtonRequest"), decode(string(text))
		case "update":
			_, server = decodeUpdate([]byte(p.value))
			schema, value = docNode(t, doc, doc, "components", "schemas", "UpdateButtonRequest"), decode(p.value)
		default:
			_, server = parseIfMatch(p.value)
		}
		refusal := matchSchema(doc, schema, value, p.kind)
		if (server == nil) != p.server || (refusal == nil) != p.schema || server == nil && refusal != nil {
			t.Errorf("%s %.80s:\ngot server %v, schema %v; want server accepts: %v, schema accepts: %v (it must, if the server does)",
				p.kind, p.value, server, refusal, p.server, p.schema)
		}
	}
}

// --- every answer against the document ---

// conformsToDocument checks one answer against openapi.json: the operation
// for method and path (a known path with another method: its 405; an unknown
// path: the 404 of NoSuchPath), the response for status (or default), its
// required headers, its media type and its body's schema.
func conformsToDocument(method string, u *url.URL, status int, header http.Header, body []byte) error {
	doc := openAPI()
	what := fmt.Sprintf("%s %s answered %d", method, u.Path, status)
	r := documentedResponse(doc, strings.ToLower(method), u.Path, strconv.Itoa(status))
	if r == nil {
		return fmt.Errorf("%s: openapi.json declares no such answer", what)
	}
	headers, _ := r["headers"].(map[string]any)
	for _, name := range sortedKeys(headers) {
		h, values := resolved(doc, headers[name]), header.Values(name)
		if len(values) == 0 && h["required"] == true {
			return fmt.Errorf("%s: no %s header, which openapi.json requires", what, name)
		}
		for _, v := range values {
			var value any = v
			if _, err := strconv.ParseInt(v, 10, 64); err == nil && resolved(doc, h["schema"])["type"] == "integer" {
				value = json.Number(v)
			}
			if err := matchSchema(doc, h["schema"], value, name+" header"); err != nil {
				return fmt.Errorf("%s: %v", what, err)
			}
		}
	}
	content, _ := r["content"].(map[string]any)
	mediaType, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	media := resolved(doc, content[mediaType])
	switch value, err := decodeNumbers(body); {
	case len(content) == 0 || method == "HEAD":
		if len(body) > 0 {
			return fmt.Errorf("%s: got a body, openapi.json declares none", what)
		}
	case media == nil:
		return fmt.Errorf("%s: got Content-Type %q, openapi.json declares %q", what, mediaType, sortedKeys(content))
	case mediaType != "application/json": // the metrics text, any string
	case err != nil:
		return fmt.Errorf("%s: the body is not JSON: %v", what, err)
	default:
		if err := matchSchema(doc, media["schema"], value, "body"); err != nil {
			return fmt.Errorf("%s: %v\nbody: %s", what, err, body)
		}
	}
	return nil
}

// documentedResponse returns the response openapi.json declares for method,
// path and status, nil for none.
func documentedResponse(doc map[string]any, method, path, status string) map[string]any {
	for template, item := range doc["paths"].(map[string]any) {
		if !matchesTemplate(template, path) {
			continue
		}
		item := item.(map[string]any)
		methods := []string{method}
		if item[method] == nil { // a known path, another method
			methods = sortedKeys(item)
		}
		for _, m := range methods {
			responses, _ := resolved(doc, item[m])["responses"].(map[string]any)
			for _, key := range []string{status, "default"} {
				if r := resolved(doc, responses[key]); r != nil {
					return r
				}
			}
		}
		return nil
	}
	if status != "404" {
		return nil
	}
	return resolved(doc, map[string]any{"$ref": "#/components/responses/NoSuchPath"})
}

// matchesTemplate reports whether path fits a path template such as
// /product-payment/get/{id}, whose {name} stands for one non-empty segment.
func matchesTemplate(template, path string) bool {
	want, got := strings.Split(template, "/"), strings.Split(path, "/")
	for i := range want {
		if len(want) != len(got) || want[i] != got[i] && (!strings.HasPrefix(want[i], "{") || got[i] == "") {
			return false
		}
	}
	return true
}

var schemaPatterns sync.Map // pattern -> *regexp.Regexp

// matchSchema checks value against node, a schema of openapi.json, in the
// subset of JSON Schema the document uses. Any other keyword is an error, so
// that the document cannot say more than is checked. at names the value.
func matchSchema(doc map[string]any, node, value any, at string) error {
	s := resolved(doc, node)
	if s == nil {
		return fmt.Errorf("%s: openapi.json has no schema here", at)
	}
	object, isObject := value.(map[string]any)
	text, isText := value.(string)
	number, isNumber := value.(json.Number)
	for _, key := range sortedKeys(s) {
		var err error
		switch want := s[key]; key {
		case "description", "title", "examples", "format", "default": // annotations
		case "type":
			types, got := want, jsonType(value)
			if name, ok := want.(string); ok {
				types = []any{name}
			}
			if !slices.ContainsFunc(types.([]any), func(t any) bool { return t == got || t == "number" && got == "integer" }) {
				err = fmt.Errorf("%s: got %s, want type %v", at, got, want)
			}
		case "enum", "const":
			if allowed, _ := want.([]any); key == "const" && !reflect.DeepEqual(want, value) ||
				key == "enum" && !slices.ContainsFunc(allowed, func(v any) bool { return reflect.DeepEqual(v, value) }) {
				err = fmt.Errorf("%s: got %#v, want %s %v", at, value, key, want)
			}
		case "required":
			for _, name := range strs(want) {
				if _, ok := object[name]; isObject && !ok && err == nil {
					err = fmt.Errorf("%s: property %q is missing", at, name)
				}
			}
		case "properties", "additionalProperties", "propertyNames":
			declared, _ := s["properties"].(map[string]any)
			for _, name := range sortedKeys(object) {
				_, isDeclared := declared[name]
				switch {
				case err != nil:
				case key == "propertyNames":
					err = matchSchema(doc, want, name, at+" key "+strconv.Quote(name))
				case key == "properties" && isDeclared:
					err = matchSchema(doc, declared[name], object[name], at+"."+name)
				case key == "additionalProperties" && !isDeclared && want == false:
					err = fmt.Errorf("%s: got property %q, which openapi.json does not declare", at, name)
				case key == "additionalProperties" && !isDeclared:
					err = matchSchema(doc, want, object[name], at+"."+name)
				}
			}
		case "minProperties", "maxProperties", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum":
			bound, _ := strconv.ParseFloat(want.(json.Number).String(), 64)
			n, measured := float64(len(object)), isObject
			if strings.HasSuffix(key, "Length") {
				n, measured = float64(utf8.RuneCountInString(text)), isText
			} else if !strings.HasSuffix(key, "Properties") {
				n, _ = strconv.ParseFloat(number.String(), 64)
				measured = isNumber
			}
			if measured && (strings.HasPrefix(key, "min") && n < bound || strings.HasPrefix(key, "max") && n > bound ||
				key == "exclusiveMinimum" && n <= bound) {
				err = fmt.Errorf("%s: got %#v, past its %s %v", at, value, key, want)
			}
		case "pattern":
			re, ok := schemaPatterns.Load(want)
			if !ok {
				compiled, cerr := regexp.Compile(want.(string))
				if cerr != nil {
					return fmt.Errorf("%s: pattern %q does not read alike in Go: %v", at, want, cerr)
				}
				re, _ = schemaPatterns.LoadOrStore(want, compiled)
			}
			if isText && !re.(*regexp.Regexp).MatchString(text) {
				err = fmt.Errorf("%s: got %q, which does not match %s", at, text, want)
			}
		case "items":
			list, _ := value.([]any)
			for i, item := range list {
				if err == nil {
					err = matchSchema(doc, want, item, fmt.Sprintf("%s[%d]", at, i))
				}
			}
		case "allOf", "anyOf", "oneOf":
			var failures []error
			for _, part := range want.([]any) {
				if perr := matchSchema(doc, part, value, at); perr != nil {
					failures = append(failures, perr)
				}
			}
			switch passed := len(want.([]any)) - len(failures); {
			case key == "allOf" && len(failures) > 0:
				err = failures[0]
			case key != "allOf" && passed == 0:
				err = fmt.Errorf("%s: matches none of %s:\n%v", at, key, errors.Join(failures...))
			case key == "oneOf" && passed > 1:
				err = fmt.Errorf("%s: got %#v, which matches %d of oneOf, want one", at, value, passed)
			}
		default:
			return fmt.Errorf("%s: the test does not check the keyword %q: teach matchSchema or leave it out", at, key)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// jsonType is the JSON Schema type of a value decoded with UseNumber.
func jsonType(v any) string {
	if n, ok := v.(json.Number); ok {
		return map[bool]string{true: "integer", false: "number"}[errorOf(n.Int64()) == nil]
	}
	return map[string]string{"<nil>": "null", "bool": "boolean", "string": "string", "[]interface {}": "array",
		"map[string]interface {}": "object"}[fmt.Sprintf("%T", v)]
}
