package main

// These tests keep openapi.json true to the service: the routes, the served
// bytes, every example and the names and enums of the schemas.
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
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	createPath = "/product-payment/create"
	updatePath = "/product-payment/update/{id}"
)

// loadOpenAPI decodes openapi.json, keeping numbers as their text.
func loadOpenAPI(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	return decodeJSON(t, raw).(map[string]any)
}

func decodeJSON(t *testing.T, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, raw)
	}
	return v
}

// docNode walks keys down from node, following any "$ref" on the way, and
// fails the test when a key is missing or a node is not an object.
func docNode(t *testing.T, doc map[string]any, node any, keys ...string) map[string]any {
	t.Helper()
	at := "#"
	m := resolveRef(t, doc, node, at)
	for _, key := range keys {
		at += "/" + key
		child, ok := m[key]
		if !ok {
			t.Fatalf("openapi.json: %s is missing", at)
		}
		m = resolveRef(t, doc, child, at)
	}
	return m
}

// resolveRef returns node as an object: the one its "$ref" names, if it has one.
func resolveRef(t *testing.T, doc map[string]any, node any, at string) map[string]any {
	t.Helper()
	m, ok := node.(map[string]any)
	if !ok {
		t.Fatalf("openapi.json: %s is not an object", at)
	}
	if ref, ok := m["$ref"].(string); ok {
		return docNode(t, doc, doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
	}
	return m
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// sameSet fails unless got and want hold the same strings, in any order and
// counting repeats once.
func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = setOf(got), setOf(want)
	if slices.Equal(got, want) {
		return
	}
	missing := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return slices.Contains(got, s) })
	extra := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return slices.Contains(want, s) })
	t.Errorf("%s: got %q, want %q (missing %q, not wanted %q)", what, got, want, missing, extra)
}

// setOf returns the distinct strings of list, sorted.
func setOf(list []string) []string {
	list = slices.Clone(list)
	slices.Sort(list)
	return slices.Compact(list)
}

// handlersSource is handlers.go, where the routes and error codes are.
func handlersSource(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("handlers.go")
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

var muxPattern = regexp.MustCompile(`mux\.Handle(?:Func)?\(\s*"([A-Z]+) ([^"\s]+)"`)

func TestOpenAPIRoutesMatchTheMux(t *testing.T) {
	var routes []string
	for _, m := range muxPattern.FindAllStringSubmatch(handlersSource(t), -1) {
		routes = append(routes, m[1]+" "+m[2])
	}
	if len(routes) == 0 {
		t.Fatal("found no mux.Handle or mux.HandleFunc pattern in handlers.go")
	}
	doc := loadOpenAPI(t)
	var documented []string
	for path, item := range docNode(t, doc, doc, "paths") {
		for method := range item.(map[string]any) {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sameSet(t, "operations in openapi.json vs routes in handlers.go", documented, routes)
}

func TestOpenAPIDocumentIsServedWithoutAKey(t *testing.T) {
	e := newTestServer(t)
	resp, err := http.Get(e.url + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET /openapi.json without a key: got status %d, want 200\n%s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("got Content-Type %q, want application/json", got)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("got %d bytes that differ from openapi.json, want its %d bytes exactly", len(body), len(want))
	}
	version, _ := decodeJSON(t, body).(map[string]any)["openapi"].(string)
	if !regexp.MustCompile(`^3\.1\.\d+$`).MatchString(version) {
		t.Errorf("got openapi %q, want 3.1.x", version)
	}
}

// exampleBody is the body an example describes: a string as it is, anything
// else as JSON.
func exampleBody(t *testing.T, v any) string {
	t.Helper()
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// exampleHeaders is an example's x-headers as do takes them.
func exampleHeaders(example map[string]any) []string {
	var headers []string
	given, _ := example["x-headers"].(map[string]any)
	for _, name := range sortedKeys(given) {
		headers = append(headers, name, given[name].(string))
	}
	return headers
}

// requestExamples are the request body examples of the operation at path.
func requestExamples(t *testing.T, doc map[string]any, path string) map[string]any {
	t.Helper()
	return docNode(t, doc, doc, "paths", path, "post", "requestBody", "content", "application/json", "examples")
}

// refusedExamples are the examples of the 400 answer of the operation at path.
func refusedExamples(t *testing.T, doc map[string]any, path string) map[string]any {
	t.Helper()
	return docNode(t, doc, doc, "paths", path, "post", "responses", "400", "content", "application/json", "examples")
}

// checkRefused checks that r is exactly the answer example documents.
func checkRefused(t *testing.T, r response, example map[string]any) {
	t.Helper()
	if r.status != 400 {
		t.Errorf("%s\ngot status %d, want 400", r.request, r.status)
	}
	if got, want := decodeJSON(t, r.raw), example["value"]; !reflect.DeepEqual(got, want) {
		wantJSON, _ := json.Marshal(want)
		t.Errorf("%s\ngot  %s\nwant %s", r.request, r.raw, wantJSON)
	}
}

func TestOpenAPICreateExamples(t *testing.T) {
	e := newTestServer(t)
	doc := loadOpenAPI(t)
	accepted := requestExamples(t, doc, createPath)
	for _, name := range sortedKeys(accepted) {
		t.Run(name, func(t *testing.T) {
			example := accepted[name].(map[string]any)
			r := e.do("POST", createPath, e.key, exampleBody(t, example["value"]))
			r.want(t, 200, "")
			if _, err := e.stored("acme", r.dataString()); err != nil || r.env.Message != "created" {
				t.Errorf("%s\ngot id %q (%v) message %q, want a stored button, created", r.request, r.dataString(), err, r.env.Message)
			}
		})
	}
	refused := refusedExamples(t, doc, createPath)
	for _, name := range sortedKeys(refused) {
		t.Run(name, func(t *testing.T) {
			example := refused[name].(map[string]any)
			if _, ok := example["x-request"]; !ok {
				t.Fatal("got no x-request, want the refused request")
			}
			before := e.countButtons()
			r := e.do("POST", createPath, e.key, exampleBody(t, example["x-request"]), exampleHeaders(example)...)
			checkRefused(t, r, example)
			if got := e.countButtons(); got != before {
				t.Errorf("%s\ngot %d buttons stored, want %d", r.request, got, before)
			}
		})
	}
}

func TestOpenAPIUpdateExamples(t *testing.T) {
	e := newTestServer(t)
	doc := loadOpenAPI(t)
	buttons := requestExamples(t, doc, createPath)
	// newButton creates the button of the create example example's x-button names.
	newButton := func(t *testing.T, example map[string]any) string {
		t.Helper()
		name, _ := example["x-button"].(string)
		create, ok := buttons[name].(map[string]any)
		if !ok {
			t.Fatalf("got x-button %q, want the name of a create example", name)
		}
		return e.create(e.key, exampleBody(t, create["value"]))
	}

	accepted := requestExamples(t, doc, updatePath)
	for _, name := range sortedKeys(accepted) {
		t.Run(name, func(t *testing.T) {
			example := accepted[name].(map[string]any)
			id := newButton(t, example)
			r := e.do("POST", "/product-payment/update/"+id, e.key, exampleBody(t, example["value"]))
			r.want(t, 200, "")
			if b, err := e.stored("acme", id); err != nil || b.Version != 2 {
				t.Errorf("%s\ngot version %d (%v), want 2", r.request, b.Version, err)
			}
		})
	}
	refused := refusedExamples(t, doc, updatePath)
	for _, name := range sortedKeys(refused) {
		t.Run(name, func(t *testing.T) {
			example := refused[name].(map[string]any)
			if _, ok := example["x-request"]; !ok {
				t.Fatal("got no x-request, want the refused request")
			}
			id := newButton(t, example)
			before, _ := e.stored("acme", id)
			r := e.do("POST", "/product-payment/update/"+id, e.key, exampleBody(t, example["x-request"]), exampleHeaders(example)...)
			checkRefused(t, r, example)
			if after, _ := e.stored("acme", id); !reflect.DeepEqual(after, before) {
				t.Errorf("%s\ngot button %+v, want it unchanged: %+v", r.request, after, before)
			}
		})
	}
}

// TestOpenAPIExampleIDsAreButtonIDs checks every button id in the document's
// examples: a reader who copies one gets a 404 for a missing button, not for
// a malformed id.
func TestOpenAPIExampleIDsAreButtonIDs(t *testing.T) {
	doc := loadOpenAPI(t)
	pattern := regexp.MustCompile(docNode(t, doc, doc, "components", "schemas", "ButtonId")["pattern"].(string))
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, child := range v {
				walk(child)
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		case string:
			if strings.HasPrefix(v, "btn_") && (!validButtonID(v) || !pattern.MatchString(v)) {
				t.Errorf("got example id %q, want one validButtonID and the ButtonId pattern accept", v)
			}
		}
	}
	walk(doc)
}

// enumOf returns the string values of schema's enum and whether it holds null.
func enumOf(t *testing.T, schema map[string]any) (values []string, null bool) {
	t.Helper()
	enum, ok := schema["enum"].([]any)
	if !ok {
		t.Fatalf("got schema %v, want an enum", schema)
	}
	for _, v := range enum {
		if v == nil {
			null = true
		} else {
			values = append(values, v.(string))
		}
	}
	return values, null
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

// invalidFieldsOf returns the field -> why of an *invalidError.
func invalidFieldsOf(t *testing.T, err error) map[string]string {
	t.Helper()
	var invalid *apiError
	if !errors.As(err, &invalid) || invalid.code != "invalid_request" {
		t.Fatalf("got error %v, want invalid_request", err)
	}
	return invalid.fields
}

// jsonNames returns the JSON field names of struct v.
func jsonNames(v any) []string {
	var names []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

func TestOpenAPISchemasMatchValidation(t *testing.T) {
	doc := loadOpenAPI(t)
	schema := func(keys ...string) map[string]any {
		return docNode(t, doc, doc, append([]string{"components", "schemas"}, keys...)...)
	}
	toStrings := func(list any) []string {
		var out []string
		for _, v := range list.([]any) {
			out = append(out, v.(string))
		}
		return out
	}

	t.Run("create and update fields", func(t *testing.T) {
		sameSet(t, "CreateButtonRequest properties vs createFields",
			sortedKeys(schema("CreateButtonRequest", "properties")), createFields)
		var required []string
		for field, why := range invalidFieldsOf(t, errorOf(decodeCreate([]byte(`{}`), "the service"))) {
			if why == "is required" {
				required = append(required, field)
			}
		}
		sameSet(t, "CreateButtonRequest required vs the fields decodeCreate requires",
			toStrings(schema("CreateButtonRequest")["required"]), required)
		sameSet(t, "UpdateButtonRequest properties vs updateFields",
			sortedKeys(schema("UpdateButtonRequest", "properties")), updateFields)
		description := schema("UpdateButtonRequest")["description"].(string)
		for _, field := range fixedFields {
			if !strings.Contains(description, "`"+field+"`") {
				t.Errorf("got UpdateButtonRequest description without `%s`, want every fixed field named", field)
			}
		}
	})

	t.Run("lengths and limits", func(t *testing.T) {
		for _, c := range []struct {
			where map[string]any
			key   string
			want  int
		}{
			{schema("ProductName"), "maxLength", maxNameRunes},
			{schema("Description"), "maxLength", maxDescriptionRunes},
			{docNode(t, doc, doc, "components", "parameters", "Limit", "schema"), "maximum", 100},
			{docNode(t, doc, doc, "components", "parameters", "Limit", "schema"), "default", 20},
		} {
			if got := c.where[c.key].(json.Number).String(); got != strconv.Itoa(c.want) {
				t.Errorf("got %s %s, want %d", c.key, got, c.want)
			}
		}
	})

	t.Run("enums", func(t *testing.T) {
		refusal := func(body string) map[string]string {
			return invalidFieldsOf(t, errorOf(decodeCreate([]byte(body), "the service")))
		}
		paymentType, _ := enumOf(t, schema("PaymentType"))
		sameSet(t, "PaymentType enum vs what decodeCreate allows", paymentType,
			quotedWords(refusal(`{"paymentType":"?"}`)["paymentType"]))
		paymentMethod, _ := enumOf(t, schema("PaymentMethod"))
		sameSet(t, "PaymentMethod enum vs what decodeCreate allows", paymentMethod,
			quotedWords(refusal(`{"paymentMethod":"?"}`)["paymentMethod"]))
		sameSet(t, "list paymentMethod vs what decodeListQuery allows", paymentMethod,
			quotedWords(invalidFieldsOf(t, errorOf(decodeListQuery("paymentMethod=%3F", "the service")))["paymentMethod"]))

		spellings, null := enumOf(t, schema("BillingInterval"))
		sameSet(t, `BillingInterval enum vs billingIntervals and ""`, spellings, append(sortedKeys(billingIntervals), ""))
		if !null {
			t.Error("got BillingInterval without null, want null (absent, for one_time)")
		}
		var stored []string
		for _, v := range billingIntervals {
			stored = append(stored, v)
		}
		shown, _ := enumOf(t, schema("Button", "properties", "billingInterval"))
		sameSet(t, "Button billingInterval enum vs the values billingIntervals stores", shown, stored)

		states, _ := enumOf(t, schema("ButtonState"))
		sameSet(t, "ButtonState enum", states, []string{stateActive, stateDeleted})
		listStates, _ := enumOf(t, docNode(t, doc, doc, "components", "parameters", "State", "schema"))
		sameSet(t, "list state enum vs what decodeListQuery allows", listStates,
			quotedWords(invalidFieldsOf(t, errorOf(decodeListQuery("state=%3F", "the service")))["state"]))
	})

	t.Run("list parameters", func(t *testing.T) {
		var names []string
		for _, p := range docNode(t, doc, doc, "paths", "/product-payment/list", "get")["parameters"].([]any) {
			names = append(names, docNode(t, doc, p)["name"].(string))
		}
		sameSet(t, "list query parameters vs listParameters", names, []string{"limit", "after", "state", "isLive", "paymentMethod", "metadata[KEY]"})
	})

	t.Run("read views", func(t *testing.T) {
		sameSet(t, "Button properties vs buttonView", sortedKeys(schema("Button", "properties")), jsonNames(buttonView{}))
		sameSet(t, "Button required vs buttonView", toStrings(schema("Button")["required"]), jsonNames(buttonView{}))
		sameSet(t, "ButtonPage properties vs listPage", sortedKeys(schema("ButtonPage", "properties")), jsonNames(page[buttonView, *string]{}))
		sameSet(t, "HistoryEntry properties vs historyItem", sortedKeys(schema("HistoryEntry", "properties")), jsonNames(historyItem{}))
		changed, _ := enumOf(t, schema("HistoryEntry", "properties", "changes", "propertyNames"))
		sameSet(t, "HistoryEntry changes names vs auditedFields", changed, sortedKeys(auditedFields(button{})))
	})

	t.Run("error codes", func(t *testing.T) {
		codes, _ := enumOf(t, schema("ErrorCode"))
		sameSet(t, "ErrorCode enum vs the codes handlers.go answers with", codes, errorCodes(t))
		// Each code is on an operation that can answer it, but 405: no
		// operation answers it for its own method, so info.description does.
		sameSet(t, "codes on the operations' responses", documentedCodes(t, doc),
			slices.DeleteFunc(codes, func(c string) bool { return c == "method_not_allowed" }))
		if !strings.Contains(docNode(t, doc, doc, "info")["description"].(string), "405 method_not_allowed") {
			t.Error("got info.description without 405 method_not_allowed, want it described there")
		}
	})
}

// errorOf returns the error of a call that is expected to fail.
func errorOf[T any](_ T, err error) error { return err }

// errorCodes are the codes handlers.go puts in envelopes: those errorEnvelope
// gives the store's and validation's errors, and every apiError literal's.
func errorCodes(t *testing.T) []string {
	return sortedKeys(statusOf)
}

// documentedCodes are the codes that the operations' error responses allow,
// read from each response schema's code const or enum.
func documentedCodes(t *testing.T, doc map[string]any) []string {
	t.Helper()
	var codes []string
	for _, item := range docNode(t, doc, doc, "paths") {
		for method, op := range item.(map[string]any) {
			if method == "parameters" {
				continue
			}
			for status, r := range docNode(t, doc, op, "responses") {
				if status == "200" {
					continue
				}
				parts, _ := docNode(t, doc, r, "content", "application/json", "schema")["allOf"].([]any)
				for _, part := range parts {
					properties, _ := docNode(t, doc, part)["properties"].(map[string]any)
					code, _ := properties["code"].(map[string]any)
					if c, ok := code["const"].(string); ok {
						codes = append(codes, c)
					}
					if enum, ok := code["enum"]; ok {
						values, _ := enumOf(t, map[string]any{"enum": enum})
						codes = append(codes, values...)
					}
				}
			}
		}
	}
	return codes
}

// conformsToDocument checks one answer against openapi.json. (Filled in with
// the document's response schemas.)
func conformsToDocument(method string, url *url.URL, status int, header http.Header, body []byte) error {
	return nil
}
