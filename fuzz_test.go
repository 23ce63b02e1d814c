package main

// Fuzz targets held to an oracle written apart from validate.go, with a currency table of its own;
// to fuzz: go test -run '^$' -fuzz '^FuzzCreate$' .

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

var (
	plainDecimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	asciiLetters = regexp.MustCompile(`^[A-Za-z]+$`)
	metadataKey  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,40}$`)
	visible      = regexp.MustCompile(`[\pL\pN\pP\pS]`) // a letter, digit, punctuation or symbol
	editNames    = []string{"productName", "description", "amount", "currency",
		"ApplicationFeePercentage", "metadata"}
	fixedNames = []string{"billingInterval", "paymentMethod", "paymentType", "isLive"}
	bodyNames  = append(slices.Clone(editNames), fixedNames...)
)

// currencies is ISO 4217 as the tests know it: every code with 0 or 3 decimal places, some with
// 2, and codes no button may charge (-1): funds, precious metals, tests and withdrawn codes.
var currencies = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0, "BHD": 3, "IQD": 3,
	"JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3, "USD": 2, "EUR": 2, "GBP": 2, "CHF": 2,
	"CNY": 2, "INR": 2, "MXN": 2, "SLE": 2, "VED": 2, "XCG": 2, "ZWG": 2,
	"XAU": -1, "XAG": -1, "XPT": -1, "XPD": -1, "XTS": -1, "XXX": -1, "XDR": -1, "XSU": -1,
	"XUA": -1, "BOV": -1, "CHE": -1, "CHW": -1, "CLF": -1, "COU": -1, "MXV": -1, "USN": -1,
	"UYI": -1, "UYW": -1, "HRK": -1, "SLL": -1, "VEF": -1, "ZWL": -1, "CUC": -1, "MRO": -1,
	"STD": -1, "BYR": -1,
}

// Any create body is answered 413 above 64 KiB, else stored exactly as the oracle says, or a 400
// naming exactly what it refuses.
func FuzzCreate(f *testing.F) {
	addSeeds(f, createBody)
	shared := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared // one server for every input; the copy fails this input's t
		e.t = t
		n, o := e.buttons(), &oracle{t: t, why: map[string]string{}}
		want := o.create(body)
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if !o.verdict(t, r, len(body)) {
			expect(t, e.buttons() == n, "%s\ngot %d buttons, had %d", r.request, e.buttons(), n)
			return
		}
		got := e.stored("acme", r.id)
		want.ID, want.State, want.Version = got.ID, "active", 1
		want.CreatedAt, want.UpdatedAt = got.CreatedAt, got.CreatedAt // the same
		expect(t, reflect.DeepEqual(got, want) && r.env.Message == "created",
			"%s\ngot  %s %s\nwant %s", r.request, r.raw, jsonOf(got), jsonOf(want))
	})
}

// Any update body leaves a button (StripeConnect, 10.50 USD, 49 metadata keys) as the oracle says.
func FuzzUpdate(f *testing.F) {
	addSeeds(f, func(changes m) string { return jsonOf(changes) })
	shared := newTestServer(f)
	md := m{"orderRef": "A-17"}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	base := createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "2.50",
		"amount": "10.50", "metadata": md})
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared
		e.t = t
		id := e.create(e.key, base)
		before, o := e.stored("acme", id), &oracle{t: t, why: map[string]string{}}
		want, in := before, o.object(body)
		for _, name := range fixedNames {
			if in[name] != nil {
				o.why[name] = "is fixed at create"
			}
		}
		_, describes := in["description"] // null clears it
		edits := slices.ContainsFunc(editNames, func(n string) bool { return in[n] != nil })
		if !describes && !edits && len(o.why) == 0 {
			o.why["body"] = "names nothing to update"
		}
		if len(o.why) == 0 { // the values are checked once the form is right
			o.edit(in, &want)
		}
		r := e.do("POST", "/product-payment/update/"+id, e.key, string(body))
		got := e.stored("acme", id)
		if !o.verdict(t, r, len(body)) {
			expect(t, reflect.DeepEqual(got, before), "%s\ngot %s, want it unchanged", r.request,
				jsonOf(got))
			return
		}
		message := "unchanged"
		if !reflect.DeepEqual(want, before) {
			want.Version, want.UpdatedAt, message = before.Version+1, got.UpdatedAt, "updated"
		}
		expect(t, reflect.DeepEqual(got, want) && r.env.Message == message && r.id == before.ID,
			"%s\ngot  %s %s\nwant %q %s", r.request, r.raw, jsonOf(got), message, jsonOf(want))
	})
}

// oracle collects every reason the README's rules give to refuse a body, by the field it names;
// a body with none must be accepted. It skips a currency its table does not hold.
type oracle struct {
	t   *testing.T
	why map[string]string
}

// verdict checks r, the answer to n bytes, and returns whether it is a 200: a 400 names every
// field refused. A seed file named ok_... is accepted, bad_... refused.
func (o *oracle) verdict(t *testing.T, r response, n int) bool {
	t.Helper()
	seed, ok := strings.CutPrefix(path.Base(t.Name()), "ok_")
	if ok || strings.HasPrefix(seed, "bad_") {
		expect(t, ok == (r.status == 200), "seed %s: got %d", t.Name(), r.status)
	}
	switch {
	case n > 64<<10:
		r.want(t, 413, "payload_too_large")
	case len(o.why) == 0:
		r.want(t, 200, "")
	default:
		r.wantFields(t, slices.Collect(maps.Keys(o.why))...)
	}
	return r.status == 200
}

// object reads body: one JSON object in UTF-8, each name one of bodyNames and given once
// (compared decoded).
func (o *oracle) object(body []byte) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	first, _ := dec.Token()
	if !json.Valid(body) || !utf8.Valid(body) || first != json.Delim('{') {
		o.why["body"] = "is not one JSON object in UTF-8"
		return nil
	}
	in := map[string]any{}
	for dec.More() {
		token, _ := dec.Token()
		name := token.(string)
		var value any
		dec.Decode(&value) // the body is valid: nothing fails
		if _, twice := in[name]; twice || !slices.Contains(bodyNames, name) {
			o.why[name] = "is given twice, or is unknown"
		} else {
			in[name] = value
		}
	}
	return in
}

// create is the button a create body describes, but for id, state, version and times.
func (o *oracle) create(body []byte) button {
	b := button{Metadata: map[string]string{}}
	in := o.object(body)
	if in == nil {
		return b
	}
	for _, name := range []string{"productName", "amount", "currency", "paymentMethod",
		"paymentType", "isLive"} {
		if in[name] == nil { // absent or null
			o.why[name] = "is required"
		}
	}
	b.PaymentMethod = o.oneOf(in, "paymentMethod", "the service", "Stripe", "StripeConnect")
	b.PaymentType = o.oneOf(in, "paymentType", "one_time", "subscription")
	isLive, isBool := in["isLive"].(bool)
	if b.IsLive = isLive; !isBool && in["isLive"] != nil {
		o.why["isLive"] = "is no boolean"
	}
	b.BillingInterval = orNil(o.oneOf(in, "billingInterval", "day", "week", "month", "year"))
	if b.PaymentType != "" && (b.PaymentType == "subscription") != (in["billingInterval"] != nil) {
		o.why["billingInterval"] = "is required with a subscription, and only then"
	}
	if in["ApplicationFeePercentage"] == nil && b.PaymentMethod == "StripeConnect" {
		o.why["ApplicationFeePercentage"] = "is required with StripeConnect"
	}
	o.edit(in, &b)
	return b
}

// edit sets in b the fields create and update share. A new currency needs a new amount; an amount
// is checked against the currency b will have, or only for its form when that currency is refused.
func (o *oracle) edit(in map[string]any, b *button) {
	stored := *b
	if _, given := in["description"]; given {
		b.Description = orNil(o.str(in, "description"))
		o.chars("description", o.str(in, "description"), 0, 5000,
			func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) })
	}
	if in["productName"] != nil {
		b.ProductName = strings.TrimSpace(o.str(in, "productName"))
		o.chars("productName", b.ProductName, 1, 250, func(r rune) bool {
			return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
		})
		if !visible.MatchString(b.ProductName) {
			o.why["productName"] = "has no letter, digit, punctuation mark or symbol"
		}
	}
	if in["currency"] != nil { // three ASCII letters: no Unicode case mapping makes a code
		s := o.str(in, "currency")
		exp, known := currencies[strings.ToUpper(s)]
		b.Currency = strings.ToUpper(s)
		if len(s) != 3 || !asciiLetters.MatchString(s) || known && exp < 0 {
			o.why["currency"] = "is no code of a currency a button may charge"
			b.Currency = ""
		}
		if b.Currency != "" && !known {
			o.t.Skip("a currency the oracle's table does not hold")
		}
	}
	if exp := currencies[b.Currency]; in["amount"] != nil && b.Currency != "" {
		b.Amount = o.decimalText("amount", in["amount"], exp, 1e15)
	} else if text := fmt.Sprint(in["amount"]); in["amount"] != nil && // no currency to check
		(!plainDecimal.MatchString(text) || strings.Trim(text, "0.") == "") {
		o.why["amount"] = "is no plain decimal above 0"
	} else if stored.Currency != "" && b.Currency != "" && b.Currency != stored.Currency {
		o.why["amount"] = "is required with a new currency"
	}
	if fee := in["ApplicationFeePercentage"]; fee != nil { // 0.01 to 100%
		b.Fee = orNil(o.decimalText("ApplicationFeePercentage", fee, 2, 10_000))
		if b.PaymentMethod != "StripeConnect" && b.PaymentMethod != "" {
			o.why["ApplicationFeePercentage"] = "is for StripeConnect only"
		}
	}
	if in["metadata"] != nil {
		b.Metadata = o.metadata(in["metadata"], b.Metadata)
	}
}

// str returns in[name] if it is a string, "" if it is absent or null, and refuses any other value.
func (o *oracle) str(in map[string]any, name string) string {
	s, ok := in[name].(string)
	if !ok && in[name] != nil {
		o.why[name] = "is not a string"
	}
	return s
}

// oneOf returns in[name] when it is exactly one of allowed; else "", and refuses it if it is given.
func (o *oracle) oneOf(in map[string]any, name string, allowed ...string) string {
	if s := o.str(in, name); slices.Contains(allowed, s) {
		return s
	} else if in[name] != nil {
		o.why[name] = fmt.Sprintf("is not one of %q", allowed)
	}
	return ""
}

// chars refuses s unless it has min to max characters, none of them bad or U+FFFD.
func (o *oracle) chars(name, s string, min, max int, bad func(rune) bool) {
	if n := utf8.RuneCountInString(s); n < min || n > max || strings.ContainsFunc(s, bad) ||
		strings.ContainsRune(s, '\uFFFD') {
		o.why[name] = fmt.Sprintf("has %d characters, not %d to %d, or a bad one", n, min, max)
	}
}

// decimalText writes v, a plain decimal as a JSON string or number of 1 to limit units of 10^-exp,
// with exactly exp decimal places.
func (o *oracle) decimalText(name string, v any, exp int, limit int64) string {
	// A string, or a number's text: no other JSON value prints as a decimal. big.Rat would read
	// more: signs, exponents, fractions.
	s := fmt.Sprint(v)
	if !plainDecimal.MatchString(s) {
		o.why[name] = "is not a plain decimal"
		return ""
	}
	r, _ := new(big.Rat).SetString(s)
	units := new(big.Rat).Mul(r, big.NewRat(int64(math.Pow10(exp)), 1))
	if !units.IsInt() || units.Sign() == 0 || units.Num().Cmp(big.NewInt(limit)) > 0 {
		o.why[name] = fmt.Sprintf("is not 1 to %d units of 10^-%d", limit, exp)
		return ""
	}
	return r.FloatString(exp)
}

// metadata is stored with v merged in: a string sets its key, null or "" removes it; 50 at most.
func (o *oracle) metadata(v any, stored map[string]string) map[string]string {
	object, ok := v.(map[string]any) // encoding/json: a repeated key keeps its last value
	if !ok {
		o.why["metadata"] = "is not an object"
	}
	merged := maps.Clone(stored)
	for key, value := range object {
		s, isString := value.(string)
		switch {
		case !metadataKey.MatchString(key):
			o.why["metadata"] = "has a key that is not 1 to 40 of A-Z a-z 0-9 _ . -"
		case !isString && value != nil:
			o.why["metadata."+key] = "is not a string"
		case s == "": // null or "": the key goes
			delete(merged, key)
		default:
			merged[key] = s
			o.chars("metadata."+key, s, 1, 500, unicode.IsControl)
		}
	}
	if len(merged) > 50 {
		o.why["metadata"] = "would have more than 50 keys"
	}
	return merged
}

// addSeeds adds, as body writes them, each currency the oracle knows in lower case with up to one
// decimal place too many, and values at the limits of length, count and depth and one past them.
func addSeeds(f *testing.F, body func(map[string]any) string) {
	for code, exp := range currencies {
		for places := range max(exp, 0) + 2 {
			amount := strings.TrimSuffix("7."+strings.Repeat("5", places), ".")
			f.Add([]byte(body(m{"currency": strings.ToLower(code), "amount": amount})))
		}
	}
	for _, n := range []int{0, 1} {
		keys := m{}
		for i := range 50 + n {
			keys[fmt.Sprint("k", i)] = "v"
		}
		f.Add([]byte(body(m{"metadata": keys})))
		f.Add([]byte(body(m{"metadata": m{"k": strings.Repeat("é", 500+n)}})))
		f.Add([]byte(body(m{"productName": strings.Repeat("é", 250+n)})))
		f.Add([]byte(body(m{"description": strings.Repeat("é", 5000+n)})))
		f.Add([]byte(body(m{"amount": "1" + strings.Repeat("0", 400*n) + ".0" + strings.Repeat("0",
			400*(1-n))})))
		deep := strings.Repeat("[", 10000+n) + strings.Repeat("]", 10000+n)
		f.Add([]byte(deep))
		f.Add([]byte(strings.Replace(body(m{"metadata": "x"}), `"x"`, deep, 1)))
	}
	f.Add([]byte(body(m{"description": strings.Repeat(" ", 64<<10)})))
}
