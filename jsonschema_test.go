package main

// matchSchema checks a value against a schema of openapi.json: the subset of JSON Schema the document uses.

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// matchSchema checks value, named at, against node, a schema of openapi.json, in the subset of JSON Schema the document
// uses. Any other keyword is an error: the document says no more than is checked.
func matchSchema(node, value any, at string) error {
	s := resolved(node)
	if s == nil { // additionalProperties: false, or a reference that leads nowhere
		return fmt.Errorf("%s: openapi.json declares no schema for it", at)
	}
	object, isObject := value.(map[string]any)
	text, isText := value.(string)
	number, isNumber := value.(json.Number)
	declared, _ := s["properties"].(map[string]any)
	var errs []error
	for _, key := range sortedKeys(s) {
		switch want := s[key]; key {
		case "description", "examples", "format", "default": // annotations
		case "type": // a name or a list of them
			types, _ := want.([]any)
			types, got := append(types, want), jsonType(value)
			if !slices.Contains(types, any(got)) && (got != "integer" || !slices.Contains(types, any("number"))) {
				errs = append(errs, fmt.Errorf("%s: got %s, want type %v", at, got, want))
			}
		case "const":
			want = []any{want}
			fallthrough
		case "enum":
			if !slices.ContainsFunc(want.([]any), func(v any) bool { return reflect.DeepEqual(v, value) }) {
				errs = append(errs, fmt.Errorf("%s: got %#v, want %s %v", at, value, key, s[key]))
			}
		case "required":
			for _, name := range names(want) {
				if _, ok := object[name]; isObject && !ok {
					errs = append(errs, fmt.Errorf("%s: property %q is missing", at, name))
				}
			}
		case "properties", "additionalProperties", "propertyNames":
			for _, name := range sortedKeys(object) {
				if sub, ok := declared[name]; key == "properties" && ok {
					errs = append(errs, matchSchema(sub, object[name], at+"."+name))
				} else if key == "additionalProperties" && !ok {
					errs = append(errs, matchSchema(want, object[name], at+"."+name))
				} else if key == "propertyNames" {
					errs = append(errs, matchSchema(want, name, at+" key "+strconv.Quote(name)))
				}
			}
		case "minProperties", "maxProperties", "minLength", "maxLength", "minimum", "maximum":
			bound, _ := strconv.ParseFloat(want.(json.Number).String(), 64)
			n, measured := float64(len(object)), isObject
			if strings.HasSuffix(key, "Length") {
				n, measured = float64(utf8.RuneCountInString(text)), isText
			} else if !strings.HasSuffix(key, "Properties") {
				n, _ = strconv.ParseFloat(number.String(), 64)
				measured = isNumber
			}
			if measured && (strings.HasPrefix(key, "min") && n < bound || strings.HasPrefix(key, "max") && n > bound) {
				errs = append(errs, fmt.Errorf("%s: got %#v, past its %s %v", at, value, key, want))
			}
		case "pattern":
			if re, err := regexp.Compile(want.(string)); err != nil {
				errs = append(errs, fmt.Errorf("%s: pattern %s does not read alike in Go: %v", at, want, err))
			} else if isText && !re.MatchString(text) {
				errs = append(errs, fmt.Errorf("%s: got %q, which does not match %s", at, text, want))
			}
		case "items":
			list, _ := value.([]any)
			for i, item := range list {
				errs = append(errs, matchSchema(want, item, fmt.Sprintf("%s[%d]", at, i)))
			}
		case "allOf", "anyOf":
			var failures []error
			for _, part := range want.([]any) {
				failures = append(failures, matchSchema(part, value, at))
			}
			failures = slices.DeleteFunc(failures, func(err error) bool { return err == nil })
			if passed := len(want.([]any)) - len(failures); key == "allOf" && len(failures) > 0 || passed == 0 {
				errs = append(errs, fmt.Errorf("%s: matches %d of its %s:\n%w", at, passed, key, errors.Join(failures...)))
			}
		default:
			errs = append(errs, fmt.Errorf("%s: matchSchema does not check the keyword %q: teach it or leave it out", at, key))
		}
	}
	return errors.Join(errs...)
}

// jsonType is the JSON Schema type of a value decoded with UseNumber.
func jsonType(v any) string {
	if n, ok := v.(json.Number); ok {
		return map[bool]string{true: "integer", false: "number"}[errorOf(n.Int64()) == nil]
	}
	return map[string]string{"<nil>": "null", "bool": "boolean", "string": "string", "[]interface {}": "array",
		"map[string]interface {}": "object"}[fmt.Sprintf("%T", v)]
}
