package main

// These tests keep openapi.json true to the service, and conformsToDocument checks every answer the test suite reads
// through callAPI against it. How the examples are sent (x-request, x-headers, x-button) is in its info.description.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
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
)

// openAPI is the embedded openapi.json, decoded once, numbers as text (it panics unless that is a JSON object).
// Nothing may change it.
var openAPI = sync.OnceValue(func() map[string]any { return valueOf(decodeNumbers(openAPIDocument)).(map[string]any) })

func decodeNumbers(raw []byte) (v any, err error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	err = dec.Decode(&v)
	return v, err
}

// resolved returns node as an object, following "$ref"s; nil if it is none.
func resolved(node any) map[string]any {
	m, _ := node.(map[string]any)
	for m != nil && m["$ref"] != nil {
		ref, _ := m["$ref"].(string)
		m = openAPI()
		for _, key := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, _ = m[key].(map[string]any)
		}
	}
	return m
}

// docNode walks keys down from the document, following "$ref"s, to an object.
func docNode(t *testing.T, keys ...string) map[string]any {
	t.Helper()
	m := openAPI()
	for i, key := range keys {
		if m = resolved(m[key]); m == nil {
			t.Fatalf("openapi.json: %s is missing or not an object", strings.Join(keys[:i+1], "/"))
		}
	}
	return m
}

// operations returns the document's operations by "METHOD /path".
var operations = sync.OnceValue(func() map[string]map[string]any {
	ops := map[string]map[string]any{}
	for path, item := range openAPI()["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			if method != "parameters" {
				ops[strings.ToUpper(method)+" "+path] = resolved(op)
			}
		}
	}
	return ops
})

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// errorOf and valueOf return the error or the value of a call.
func errorOf[T any](_ T, err error) error { return err }
func valueOf[T any](v T, _ error) T       { return v }

// names returns, sorted and each once, the strings of v: a list of them, or the names of an object (in JSON).
func names(v any) []string {
	var list []string
	if b, _ := json.Marshal(v); json.Unmarshal(b, &list) != nil {
		var object map[string]any
		json.Unmarshal(b, &object)
		list = sortedKeys(object)
	}
	return slices.Compact(slices.Sorted(slices.Values(list)))
}

// sameSet fails unless got and want hold the same names.
func sameSet(t *testing.T, what string, got, want any) {
	t.Helper()
	if got, want := names(got), names(want); !slices.Equal(got, want) {
		t.Errorf("%s:\ngot  %q\nwant %q", what, got, want)
	}
}

// exampleBody is the body an example describes: a string as it is, anything else as JSON.
func exampleBody(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestOpenAPIDocumentAndOtherAnswers checks the served document, that conformsToDocument refuses what breaks the
// document, what callAPI cannot read (HEAD answers and the metrics text), and the document's examples.
func TestOpenAPIDocumentAndOtherAnswers(t *testing.T) {
	on, off := newTestServer(t), newTestServer(t, func(c *config) { c.metrics = false })
	r := on.do("GET", "/openapi.json", "", "") // checked against its own Document answer
	if want, err := os.ReadFile("openapi.json"); err != nil || r.status != 200 || !bytes.Equal(r.raw, want) {
		t.Errorf("GET /openapi.json: got %d, %d bytes; want 200, its %d (%v)", r.status, len(r.raw), len(want), err)
	}
	id := on.create(on.key, createBody(nil))
	get, path := on.do("GET", "/product-payment/get/"+id, on.key, ""), &url.URL{Path: "/product-payment/get/" + id}
	noETag, body, refusal := get.header.Clone(), string(get.raw), `{"isSuccess":false,"data":"","message":"x","code":"%s"}`
	noETag.Del("ETag")
	broken := func(status int, header http.Header, body string) { // breaks the document in one way
		if conformsToDocument("GET", path, status, header, []byte(body)) == nil {
			t.Errorf("got no error for %d %s", status, body)
		}
	}
	broken(200, noETag, body)
	broken(200, get.header, strings.Replace(body, `"metadata":{},`, ``, 1))
	broken(200, get.header, strings.Replace(body, `"active"`, `"gone"`, 1))
	broken(418, get.header, `{}`)
	broken(404, get.header, fmt.Sprintf(refusal, codeUnauthorized))
	broken(429, get.header, fmt.Sprintf(refusal, codeRateLimited)) // without Retry-After
	for request, status := range map[string]int{"HEAD " + on.url + "/product-payment/get/" + id: 200,
		"HEAD " + on.url + "/product-payment/list?limit=0": 400, "HEAD " + on.url + "/healthz": 200,
		"GET " + on.url + "/metrics": 200, "GET " + off.url + "/metrics": 404} {
		method, target, _ := strings.Cut(request, " ")
		r, _ := callAPI(http.DefaultClient, method, target, on.key, "") // whose error says it is not the envelope
		if err := conformsToDocument(method, valueOf(url.Parse(target)), r.status, r.header, r.raw); err != nil ||
			r.status != status || strings.Contains(target, "/get/") && r.header.Get("ETag") != get.header.Get("ETag") {
			t.Errorf("%s: got %d ETag %q (%v), want %d as openapi.json says, and get's ETag", request, r.status,
				r.header.Get("ETag"), err, status)
		}
	}
	// Every example matches its schema. Ids must be ids: a reader who copies one gets a 404 for a missing button, not
	// a malformed id.
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
			schema := cmp.Or(node["schema"], any(node)) // a parameter's, header's or media type's; else a schema's own
			examples, _ := node["examples"].([]any)
			for _, example := range resolved(node["examples"]) { // named ones
				examples = append(examples, resolved(example)["value"])
			}
			if example, ok := node["example"]; ok {
				examples = append(examples, example)
			}
			for _, example := range examples {
				if err := matchSchema(schema, example, "example"); err != nil {
					t.Errorf("%v\nin %s", err, exampleBody(schema))
				}
			}
			walk(slices.Collect(maps.Values(node)))
		}
	}
	walk(openAPI())
}

// TestOpenAPIRequestExamples sends every create and update example to a real server (an update to a new button of the
// create example its x-button names): the accepted ones are, with the version they left as ETag; the refused ones get
// exactly their documented answer and change nothing.
func TestOpenAPIRequestExamples(t *testing.T) {
	e := newTestServer(t)
	examples := func(path string, at ...string) map[string]any {
		return docNode(t, slices.Concat([]string{"paths", path, "post"}, at, []string{"content", "application/json",
			"examples"})...)
	}
	buttons := examples("/product-payment/create", "requestBody")
	for path, message := range map[string]string{"/product-payment/create": "created",
		"/product-payment/update/{id}": "updated"} {
		for _, at := range [][]string{{"requestBody"}, {"responses", "400"}} { // the accepted and the refused ones
			for name, v := range examples(path, at...) {
				example, target, id, refused := v.(map[string]any), path, "", at[0] == "responses"
				if message == "updated" { // x-button names a create example
					id = e.create(e.key, exampleBody(resolved(buttons[fmt.Sprint(example["x-button"])])["value"]))
					target = "/product-payment/update/" + id
				}
				state := func() any { return []any{e.countButtons(), valueOf(e.stored("acme", id))} }
				before, body, headers := state(), example["value"], []string{}
				if refused {
					body = example["x-request"]
					given, _ := example["x-headers"].(map[string]any)
					for _, header := range sortedKeys(given) {
						headers = append(headers, header, given[header].(string))
					}
				}
				r := e.do("POST", target, e.key, exampleBody(body), headers...)
				switch got := valueOf(decodeNumbers(r.raw)); {
				case !refused && (r.status != 200 || r.env.Message != message):
					t.Errorf("%s: %s\ngot %d %s, want 200 %q", name, r.request, r.status, r.raw, message)
				case !refused && r.header.Get("ETag") != fmt.Sprintf(`"%d"`, e.mustStored("acme", r.dataString()).Version):
					t.Errorf("%s: %s\ngot ETag %s, want the version the write left", name, r.request, r.header.Get("ETag"))
				case refused && (body == nil || r.status != 400 || !reflect.DeepEqual(got, example["value"])):
					t.Errorf("%s: %s\ngot  %d %s\nwant 400 %s", name, r.request, r.status, r.raw, exampleBody(example["value"]))
				case refused && !reflect.DeepEqual(state(), before):
					t.Errorf("%s: %s\nchanged what is stored", name, r.request)
				}
			}
		}
	}
}

// problemsOf returns the field -> why of an invalid_request error, nil for any other.
func problemsOf(err error) map[string]string {
	if invalid := (*apiError)(nil); errors.As(err, &invalid) && invalid.code == codeInvalid {
		return invalid.fields
	}
	return nil
}

// mentioned returns those of words that text, a description, names in `backquotes`.
func mentioned(text any, words ...string) []string {
	unnamed := func(w string) bool { return !strings.Contains(text.(string), "`"+w+"`") }
	return slices.DeleteFunc(slices.Clone(words), unnamed)
}

// queryDecoders decode the query of each operation that reads one.
var queryDecoders = map[string]func(q string) (any, error){
	"/product-payment/list":         func(q string) (any, error) { return decodeListQuery(q, "the service") },
	"/product-payment/history/{id}": func(q string) (any, error) { return pair(decodeHistoryQuery(q)) },
	"/product-payment/changes":      func(q string) (any, error) { return pair(decodeChangesQuery(q)) },
}

func pair(a, b int64, err error) (any, error) { return [2]int64{a, b}, err }

// TestOpenAPIMatchesTheCode holds the document's routes (a head operation for every GET, as the mux answers HEAD),
// names, enums, limits, query parameters and error codes to the code.
func TestOpenAPIMatchesTheCode(t *testing.T) {
	schema := func(keys ...string) map[string]any {
		return docNode(t, slices.Concat([]string{"components", "schemas"}, keys)...)
	}
	refused := func(err error, field string) []string { // the values of its `must be one of "a", "b"`
		_, values, _ := strings.Cut(problemsOf(err)[field], "one of ")
		return names(valueOf(decodeNumbers([]byte("[" + values + "]"))))
	}
	create := func(body string) error { return errorOf(decodeCreate([]byte(body), "the service")) }
	list := func(query string) error { return errorOf(decodeListQuery(query, "the service")) }
	src, _ := os.ReadFile("handlers.go")
	var routes, required, answered []string
	for _, m := range regexp.MustCompile(`route\(\s*"([A-Z]+) ([^"\s]+)"`).FindAllStringSubmatch(string(src), -1) {
		if routes = append(routes, m[1]+" "+m[2]); m[1] == "GET" {
			routes = append(routes, "HEAD "+m[2])
		}
	}
	for field, why := range problemsOf(create(`{}`)) {
		if why == "is required" {
			required = append(required, field)
		}
	}
	codes := names(schema("ErrorCode")["enum"])
	for name, op := range operations() {
		for status, r := range resolved(op["responses"]) {
			for _, code := range codes { // those whose error bodies the answer's schema takes
				body := map[string]any{"isSuccess": false, "data": "", "message": "m", "code": code}
				if code == codeInvalid {
					body["errors"] = map[string]any{"body": "m"}
				}
				if matchSchema(resolved(resolved(resolved(r)["content"])["application/json"])["schema"], body, "") != nil {
					continue
				}
				if answered = append(answered, code); strconv.Itoa(statusOf[code]) != status {
					t.Errorf("%s: status %s answers code %s, which is %d", name, status, code, statusOf[code])
				}
			}
		}
	}
	audited := auditedFields(button{Metadata: metadata{"orderRef": "A-17"}})
	sameSet(t, "operations vs the routes in handlers.go", operations(), routes)
	sameSet(t, "CreateButtonRequest properties", schema("CreateButtonRequest", "properties"), createFields)
	sameSet(t, "UpdateButtonRequest properties", schema("UpdateButtonRequest", "properties"), updateFields)
	sameSet(t, "CreateButtonRequest required", schema("CreateButtonRequest")["required"], required)
	sameSet(t, "UpdateButtonRequest description on fixed fields", mentioned(schema("UpdateButtonRequest")["description"],
		fixedFields...), fixedFields)
	// The other limits are held to validate.go's by the lenience probes.
	sameSet(t, "Metadata maxProperties", []string{fmt.Sprint(schema("Metadata")["maxProperties"])},
		[]string{strconv.Itoa(maxMetadataKeys)})
	sameSet(t, "PaymentType enum", schema("PaymentType")["enum"], refused(create(`{"paymentType":"?"}`), "paymentType"))
	methods := schema("PaymentMethod")["enum"]
	sameSet(t, "PaymentMethod enum", methods, refused(create(`{"paymentMethod":"?"}`), "paymentMethod"))
	sameSet(t, "list paymentMethod enum", methods, refused(list("paymentMethod=%3F"), "paymentMethod"))
	sameSet(t, "list state enum", docNode(t, "components", "parameters", "State", "schema")["enum"],
		refused(list("state=%3F"), "state"))
	sameSet(t, "BillingInterval enum", schema("BillingInterval")["enum"], slices.Collect(maps.Values(billingIntervals)))
	sameSet(t, "ButtonState enum", schema("ButtonState")["enum"], []string{stateActive, stateDeleted})
	sameSet(t, "ErrorCode enum", codes, statusOf)
	// No client receives canceled: the access log records it when the client went away.
	sameSet(t, "codes the operations answer", answered, slices.DeleteFunc(codes, func(c string) bool {
		return c == codeCanceled
	}))
	sameSet(t, "info.description on canceled", mentioned(docNode(t, "info")["description"], "499 canceled"),
		[]string{"499 canceled"})
	sameSet(t, "HistoryChanges properties and a metadata key", append(names(schema("HistoryChanges", "properties")),
		"metadata.orderRef"), audited)
	for name, view := range map[string]any{"Button": buttonView{}, "ButtonPage": page[buttonView, *string]{},
		"HistoryPage": page[historyItem, *int64]{}, "ChangesPage": page[buttonView, int64]{}, "HistoryEntry": historyItem{},
		"TextChange": change{}, "FlagChange": change{}} {
		sameSet(t, name+" properties", schema(name, "properties"), view)
		sameSet(t, name+" required", schema(name)["required"], view)
	}
	params := map[string][]string{"/product-payment/changes": {"since", "limit"},
		"/product-payment/list":         {"limit", "after", "state", "isLive", "paymentMethod", "metadata"},
		"/product-payment/history/{id}": {"limit", "after"}}
	for path, decode := range queryDecoders {
		var names []string
		none, _ := decode("")
		for _, p := range docNode(t, "paths", path, "get")["parameters"].([]any) {
			param, s := resolved(p), resolved(resolved(p)["schema"])
			name := param["name"].(string)
			if names = append(names, name); param["style"] == "deepObject" {
				name += "[key]"
			}
			if _, err := decode(name + "=x"); err != nil && strings.HasPrefix(problemsOf(err)[name], "unknown") {
				t.Errorf("%s: the decoder does not know the documented parameter %s", path, name)
			} else if d := s["default"]; d != nil || s["type"] == "integer" { // it must read as the parameter left out
				if got, err := decode(fmt.Sprint(name, "=", d)); err != nil || !reflect.DeepEqual(got, none) {
					t.Errorf("%s %s: got default %v, read as %v (%v), want %v", path, name, d, got, err, none)
				}
			}
			for key, beyond := range map[string]int64{"minimum": -1, "maximum": 1, "maxProperties": 1} {
				query := func(n int64) string { return fmt.Sprintf("%s=%d", name, n) }
				if key == "maxProperties" { // so many metadata[KEY] filters
					query = func(n int64) (q string) {
						for i := range n {
							q += fmt.Sprintf("&metadata[k%d]=v", i)
						}
						return q[1:]
					}
				}
				if n, err := strconv.ParseInt(fmt.Sprint(s[key]), 10, 64); err == nil {
					_, at := decode(query(n))
					if _, past := decode(query(n + beyond)); at != nil || past == nil {
						t.Errorf("%s %s=%d, its %s: got %v, and %v past it", path, name, n, key, at, past)
					}
				}
			}
		}
		sameSet(t, path+" query parameters", names, params[path])
	}
	// A 400 names at most 20 problems (TestLargeRefusalIsSmallAndStoredSmall holds the code to it).
	sameSet(t, "errors maxProperties", []string{fmt.Sprint(schema("InvalidRequestEnvelope", "properties",
		"errors")["maxProperties"])}, []string{"20"})
	changes := map[string]any{}
	for name, value := range audited { // as the view shows them
		changes[name] = map[string]any{"from": nil, "to": value}
	}
	errs := []error{matchSchema(schema("HistoryChanges"), changes, "changes")}
	for spelling := range billingIntervals { // the request pattern takes every spelling, in any case
		for _, s := range []string{spelling, strings.ToUpper(spelling), strings.ToUpper(spelling[:1]) + spelling[1:]} {
			errs = append(errs, matchSchema(schema("BillingIntervalInput"), s, "billingInterval"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// TestOpenAPIRequestsAreAsLenientAsTheServer holds the request schemas to the server's rules value by value: a schema
// that refused what the server accepts would make a generated client refuse good requests. Where a schema cannot say a
// rule (an amount's places in its currency, the currency list, the keys left after a merge), it is the more lenient.
// The one exception is money: the server reads an amount or a fee sent as a JSON number too, which the schemas refuse,
// so that no generated client holds money in a float; they take the same text as a string, and their descriptions say
// so.
func TestOpenAPIRequestsAreAsLenientAsTheServer(t *testing.T) {
	for _, name := range []string{"Amount", "FeePercentage"} {
		if s := docNode(t, "components", "schemas", name); !strings.Contains(fmt.Sprint(s["description"]), "JSON number") {
			t.Errorf("schemas/%s: its description does not say that the server also reads a JSON number", name)
		}
	}
	x := func(n int) string { return strings.Repeat("x", n) }
	decode := func(text string) any { return valueOf(decodeNumbers([]byte(text))) }
	keys := func(n int, value string) (s string) { // an update of metadata keys k0, k1, ... to value
		for i := range n {
			s += fmt.Sprintf(`,"k%d":%s`, i, value)
		}
		return `{"metadata":{` + s[1:] + `}}`
	}
	for _, p := range []struct {
		kind, value    string // create (fields that replace createBody's), update (a body), If-Match (the header)
		server, schema bool   // whether each accepts it
	}{
		{"create", `{"productName":"\tPro\n","currency":"usd","description":null,"metadata":null}`, true, true},
		{"create", `{"productName":" ` + strings.Repeat("é", maxNameRunes) + `\u00a0\u3000"}`, true, true},
		{"create", `{"productName":"` + x(maxNameRunes+1) + `"}`, false, false},
		{"create", `{"productName":"a\u0001b"}`, false, false}, {"create", `{"productName":"   "}`, false, true},
		{"create", `{"amount":19.9,"description":"a\tb\r\n` + x(maxDescriptionRunes-5) + `"}`, true, false},
		{"create", `{"description":"` + x(maxDescriptionRunes+1) + `"}`, false, false},
		{"create", `{"amount":"1e3"}`, false, false}, {"create", `{"amount":1e3}`, false, false},
		{"create", `{"amount":"19.999","currency":"XAU"}`, false, true},
		{"create", `{"paymentType":"subscription","billingInterval":"Annually"}`, true, true},
		{"create", `{"paymentType":"subscription","billingInterval":"fortnightly"}`, false, false},
		{"create", `{"billingInterval":"","ApplicationFeePercentage":null,"isLive":true}`, true, true},
		{"create", `{"paymentMethod":"StripeConnect","ApplicationFeePercentage":"2.500"}`, true, true},
		{"create", `{"paymentMethod":"StripeConnect","ApplicationFeePercentage":"2.505"}`, false, false},
		{"create", `{"paymentMethod":"StripeConnect","ApplicationFeePercentage":2.5}`, true, false},
		{"create", `{"paymentMethod":"stripe","isLive":"true","productname":"Pro"}`, false, false},
		{"create", `{"metadata":{"a.b-c_D":"x","gone":null,"empty":""}}`, true, true},
		{"create", `{"metadata":{"` + x(maxMetadataKeyBytes) + `":"` + x(maxMetadataRunes) + `"}}`, true, true},
		{"create", `{"metadata":{"` + x(maxMetadataKeyBytes+1) + `":"x"}}`, false, false},
		{"create", `{"metadata":{"k":"` + x(maxMetadataRunes+1) + `"}}`, false, false},
		{"update", `{"productName":null,"amount":"5","description":null}`, true, true},
		{"update", `{"amount":5,"ApplicationFeePercentage":null}`, true, false},
		{"update", keys(maxMetadataKeys+10, "null"), true, true},
		{"update", keys(maxMetadataKeys+1, `"v"`), false, true},
		{"update", `{"metadata":null}`, false, true}, {"update", `{"isLive":true}`, false, false},
		{"If-Match", `"3"`, true, true}, {"If-Match", `*`, true, true}, {"If-Match", `"\x31\u0032\063"`, true, true},
		{"If-Match", `W/"3"`, false, false}, {"If-Match", `"0"`, false, true},
	} {
		var server error
		schema, text := "parameters/IfMatch/schema", strconv.Quote(p.value) // the value as JSON text
		switch p.kind {
		case "create":
			text, schema = createBody(decode(p.value).(map[string]any)), "schemas/CreateButtonRequest" // numbers kept
			_, server = decodeCreate([]byte(text), "the service")
		case "update":
			text, schema = p.value, "schemas/UpdateButtonRequest"
			_, server = decodeUpdate([]byte(text))
		default:
			_, server = parseIfMatch(p.value)
		}
		ref, asText := map[string]any{"$ref": "#/components/" + schema}, moneyNumber.ReplaceAllString(text, `$1"$2"`)
		refusal := matchSchema(ref, decode(text), p.kind)
		lenient := server != nil || refusal == nil || matchSchema(ref, decode(asText), p.kind) == nil
		if (server == nil) != p.server || (refusal == nil) != p.schema || !lenient {
			t.Errorf("%s %.80s:\ngot server %v, schema %v; want them to accept: %v, %v (the schema, if the server "+
				"does, with money as text)", p.kind, p.value, server, refusal, p.server, p.schema)
		}
	}
}

// moneyNumber finds an amount or a fee sent as a JSON number.
var moneyNumber = regexp.MustCompile(`("(?:amount|ApplicationFeePercentage)":)([-+.0-9eE]+)`)

// --- every answer against the document ---

// conformsToDocument checks one answer against openapi.json: that it declares the answer, the headers it requires, the
// media type and the body's schema.
func conformsToDocument(method string, u *url.URL, status int, header http.Header, body []byte) error {
	what := fmt.Sprintf("%s %s answered %d", method, u.Path, status)
	r := documentedResponse(method, u.Path, strconv.Itoa(status))
	if r == nil {
		return fmt.Errorf("%s: openapi.json declares no such answer", what)
	}
	var errs []error
	headers, _ := r["headers"].(map[string]any)
	for _, name := range sortedKeys(headers) {
		h, values := resolved(headers[name]), header.Values(name)
		if len(values) == 0 && h["required"] == true {
			errs = append(errs, fmt.Errorf("no %s header, which openapi.json requires", name))
		}
		for _, v := range values {
			var value any = v
			if resolved(h["schema"])["type"] == "integer" {
				value = json.Number(v) // jsonType tells an integer from any other text
			}
			errs = append(errs, matchSchema(h["schema"], value, name+" header"))
		}
	}
	content, _ := r["content"].(map[string]any)
	mediaType, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	switch value, err := decodeNumbers(body); {
	case len(content) == 0 || method == "HEAD":
		if len(body) > 0 {
			errs = append(errs, errors.New("got a body, openapi.json declares none"))
		}
	case content[mediaType] == nil:
		errs = append(errs, fmt.Errorf("got Content-Type %q, openapi.json declares %q", mediaType, sortedKeys(content)))
	case mediaType == "application/json": // not the metrics text, which is any string
		errs = append(errs, err, matchSchema(resolved(content[mediaType])["schema"], value, "body"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w\nbody: %s", what, err, body)
	}
	return nil
}

// documentedResponse returns the response openapi.json declares for method, path and status, nil for none. Another
// method than a known path's is answered as any of its operations says (its 405), an unknown path as NoSuchPath (404).
func documentedResponse(method, path, status string) map[string]any {
	ops, known := operations(), false
	for _, op := range sortedKeys(ops) {
		m, template, _ := strings.Cut(op, " ")
		if !matchesTemplate(template, path) {
			continue
		}
		r := resolved(resolved(ops[op]["responses"])[status])
		if r != nil && (m == method || ops[method+" "+template] == nil) {
			return r
		}
		known = true
	}
	if known || status != "404" {
		return nil
	}
	return resolved(map[string]any{"$ref": "#/components/responses/NoSuchPath"})
}

// matchesTemplate reports whether path fits a path template such as /product-payment/get/{id}, whose {name} stands for
// one non-empty segment.
func matchesTemplate(template, path string) bool {
	want, got := strings.Split(template, "/"), strings.Split(path, "/")
	for i := range want {
		if len(want) != len(got) || want[i] != got[i] && (!strings.HasPrefix(want[i], "{") || got[i] == "") {
			return false
		}
	}
	return true
}
