package main

// Fuzz targets held to an oracle written apart from validate.go, with a currency table of its own;
// to fuzz: go test -run '^$' -fuzz '^FuzzCreate$' .

import (
	"bytes"
	"cmp"
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
	intervals    = map[string]string{"day": "day", "week": "week", "month": "month", "year": "year",
		"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year"}
	editNames  = []string{"productName", "description", "amount", "currency", "ApplicationFeePercentage", "metadata"}
	fixedNames = []string{"billingInterval", "paymentMethod", "paymentType", "isLive"}
)

// currencies is ISO 4217 as the tests know it: every code with 0 or 3 decimal places, some with 2, and
// codes no button may charge (-1): funds, precious metals, tests and withdrawn codes.
var currencies = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0, "RWF": 0,
	"UGX": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "CNY": 2, "INR": 2, "MXN": 2, "SLE": 2, "VED": 2, "XCG": 2,
	"ZWG": 2,
	"XAU": -1, "XAG": -1, "XPT": -1, "XPD": -1, "XTS": -1, "XXX": -1, "XDR": -1, "XSU": -1, "XUA": -1,
	"BOV": -1, "CHE": -1, "CHW": -1, "CLF": -1, "COU": -1, "MXV": -1, "USN": -1, "UYI": -1, "UYW": -1,
	"HRK": -1, "SLL": -1, "VEF": -1, "ZWL": -1, "CUC": -1, "MRO": -1, "STD": -1, "BYR": -1,
}

// Any create body is answered 413 above 64 KiB, else 200 and stored exactly as the oracle says, or 400
// naming exactly the fields the oracle refuses. Seeds beside testdata's: each currency the oracle knows,
// its code in lower case, with an amount of as many decimal places as it has, and one more.
func FuzzCreate(f *testing.F) {
	for code, exp := range currencies {
		for _, places := range []int{max(exp, 0), exp + 1} {
			amount := strings.TrimSuffix("7."+strings.Repeat("5", places), ".")
			f.Add([]byte(createBody(m{"currency": strings.ToLower(code), "amount": amount})))
		}
	}
	shared := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared // one server for every input; the copy fails this input's t
		e.t = t
		n, o := e.buttons(), &oracle{}
		want := o.create(body)
		if o.unknownCurrency {
			t.Skip("a currency the oracle's table does not hold")
		}
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if !o.verdict(t, r, len(body)) {
			expect(t, e.buttons() == n, "%s\ngot %d buttons after it, want %d", r.request, e.buttons(), n)
			return
		}
		got := e.stored("acme", r.dataString())
		want.ID, want.State, want.Version = got.ID, "active", 1
		want.CreatedAt, want.UpdatedAt = got.CreatedAt, got.CreatedAt // the same
		expect(t, reflect.DeepEqual(got, want) && r.env.Message == "created", "%s\ngot  %s %s\nwant %s",
			r.request, r.raw, jsonOf(got), jsonOf(want))
	})
}

// Any update body leaves the button as the oracle says: StripeConnect, 10.50 USD, 49 metadata keys.
func FuzzUpdate(f *testing.F) {
	shared := newTestServer(f)
	md := map[string]string{"orderRef": "A-17"}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	base := createBody(m{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "2.50",
		"amount": "10.50", "metadata": md})
	var id string // a button still as base made it: most inputs leave it so, which saves a create each
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared
		e.t = t
		if id == "" {
			id = e.create(e.key, base)
		}
		before, o := e.stored("acme", id), &oracle{}
		want := before
		if in := o.object(body, append(editNames, fixedNames...)...); in != nil {
			_, describes := in["description"] // null clears it
			for _, name := range fixedNames {
				if in[name] != nil {
					o.refuse(name, "is fixed at create")
				}
			}
			if !describes && !slices.ContainsFunc(editNames, func(n string) bool { return in[n] != nil }) &&
				len(o.why) == 0 {
				o.refuse("body", "names nothing to update")
			}
			if len(o.why) == 0 { // the values are checked once the form is right
				o.edit(in, &want)
			}
		}
		if o.unknownCurrency {
			t.Skip("a currency the oracle's table does not hold")
		}
		r := e.do("POST", "/product-payment/update/"+id, e.key, string(body))
		got := e.stored("acme", id)
		if !reflect.DeepEqual(got, before) {
			id = "" // the next input needs a button as base makes it
		}
		message := "unchanged"
		if !o.verdict(t, r, len(body)) {
			want, message = before, ""
		} else if !reflect.DeepEqual(want, before) {
			want.Version, want.UpdatedAt, message = before.Version+1, got.UpdatedAt, "updated"
		}
		expect(t, reflect.DeepEqual(got, want) && r.env.Message == cmp.Or(message, r.env.Message) &&
			(message == "" || r.dataString() == before.ID), "%s\ngot  %s %s\nwant %s %q", r.request, r.raw, jsonOf(got),
			jsonOf(want), message)
	})
}

// oracle collects every reason the contract gives to refuse a body, by the field it names; a body with
// none must be accepted.
type oracle struct {
	why             map[string]string
	unknownCurrency bool // the body names a currency that currencies does not hold
}

func (o *oracle) refuse(name, format string, a ...any) {
	if o.why == nil {
		o.why = map[string]string{}
	}
	o.why[name] = fmt.Sprintf(format, a...)
}

// verdict checks r, the answer to n bytes, against the oracle's reasons: a 400 names the first 20 fields
// refused, a name over 40 characters cut to 39 and "…". A seed's name says if it is accepted: ok_...,
// or refused: bad_... It returns whether r is a 200.
func (o *oracle) verdict(t *testing.T, r response, n int) bool {
	t.Helper()
	if seed := path.Base(t.Name()); strings.HasPrefix(seed, "ok_") || strings.HasPrefix(seed, "bad_") {
		expect(t, strings.HasPrefix(seed, "ok_") == (r.status == 200), "seed %s: got %d", seed, r.status)
	}
	names := slices.Sorted(maps.Keys(o.why))
	for i, name := range names {
		if runes := []rune(name); len(runes) > 40 {
			names[i] = string(runes[:39]) + "…"
		}
	}
	switch {
	case n > 64<<10:
		r.want(t, 413, "payload_too_large")
	case len(o.why) == 0:
		r.want(t, 200, "")
	case r.status == 200:
		t.Fatalf("%s\ngot 200 %s\nwant 400: %v", r.request, r.raw, o.why)
	default:
		r.want(t, 400, "invalid_request")
		got := slices.Sorted(maps.Keys(r.env.Errors))
		expect(t, slices.Equal(got, slices.Compact(names[:min(20, len(names))])), "%s\ngot errors %v, "+
			"want the fields of %v", r.request, r.env.Errors, o.why)
	}
	return r.status == 200
}

// object reads body: one JSON object in UTF-8, each name one of known and given once (compared decoded);
// of a name given twice, the first value counts.
func (o *oracle) object(body []byte, known ...string) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	first, _ := dec.Token()
	if !json.Valid(body) || !utf8.Valid(body) || first != json.Delim('{') {
		o.refuse("body", "is not one JSON object in UTF-8")
		return nil
	}
	in := map[string]any{}
	for dec.More() {
		token, _ := dec.Token()
		name := token.(string)
		var value any
		dec.Decode(&value) // the body is valid: nothing fails
		if _, twice := in[name]; twice || !slices.Contains(known, name) {
			o.refuse(name, "is given twice, or is not one of %q", known)
		} else {
			in[name] = value
		}
	}
	return in
}

// create is the button a create body describes, but for id, state, version and times.
func (o *oracle) create(body []byte) button {
	b := button{Metadata: map[string]string{}}
	in := o.object(body, append(editNames, fixedNames...)...)
	if in == nil {
		return b
	}
	for _, name := range []string{"productName", "amount", "currency", "paymentMethod", "paymentType",
		"isLive"} {
		if in[name] == nil { // absent or null
			o.refuse(name, "is required")
		}
	}
	b.PaymentMethod = o.oneOf(in, "paymentMethod", "the service", "Stripe", "StripeConnect")
	b.PaymentType = o.oneOf(in, "paymentType", "one_time", "subscription")
	isLive, isBool := in["isLive"].(bool)
	if b.IsLive = isLive; !isBool && in["isLive"] != nil {
		o.refuse("isLive", "%v is no boolean", in["isLive"])
	}
	s := o.str(in, "billingInterval") // "" or null: none
	interval := intervals[strings.ToLower(s)]
	b.BillingInterval = orNil(interval)
	if s != "" && (interval == "" || !asciiLetters.MatchString(s)) {
		o.refuse("billingInterval", "%.40q is no spelling of an interval", s)
	} else if b.PaymentType != "" && (b.PaymentType == "subscription") != (interval != "") {
		o.refuse("billingInterval", "%q with paymentType %q", interval, b.PaymentType)
	}
	if in["ApplicationFeePercentage"] == nil && b.PaymentMethod == "StripeConnect" {
		o.refuse("ApplicationFeePercentage", "is required with StripeConnect")
	}
	o.edit(in, &b)
	return b
}

// edit sets in b the fields create and update share. A new currency needs a new amount; an amount is
// checked against the currency b will have, or only for its form when that currency is refused.
func (o *oracle) edit(in map[string]any, b *button) {
	stored := *b
	if _, given := in["description"]; given {
		b.Description = orNil(o.str(in, "description"))
		o.chars("description", o.str(in, "description"), 0, 5000,
			func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) })
	}
	if in["productName"] != nil {
		b.ProductName = strings.TrimSpace(o.str(in, "productName"))
		o.chars("productName", b.ProductName, 1, 250,
			func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) })
		if !strings.ContainsFunc(b.ProductName,
			func(r rune) bool { return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) }) {
			o.refuse("productName", "%.40q has no letter, digit, punctuation mark or symbol", b.ProductName)
		}
	}
	if in["currency"] != nil { // three ASCII letters: no Unicode case mapping makes a code
		s := o.str(in, "currency")
		exp, known := currencies[strings.ToUpper(s)]
		b.Currency = strings.ToUpper(s)
		if len(s) != 3 || !asciiLetters.MatchString(s) || known && exp < 0 {
			o.refuse("currency", "%.40q is no code of a currency a button may charge", s)
			b.Currency = ""
		}
		o.unknownCurrency = o.unknownCurrency || b.Currency != "" && !known
	}
	if exp := currencies[b.Currency]; in["amount"] != nil && b.Currency != "" {
		b.Amount = decimalText(o.scaled("amount", in["amount"], exp, 1e15), exp)
	} else if text := fmt.Sprint(in["amount"]); in["amount"] != nil && // no currency to check it against
		(!plainDecimal.MatchString(text) || strings.Trim(text, "0.") == "") {
		o.refuse("amount", "%.40q is no plain decimal above 0", text)
	} else if stored.Currency != "" && b.Currency != "" && b.Currency != stored.Currency {
		o.refuse("amount", "is required with a new currency")
	}
	if fee := in["ApplicationFeePercentage"]; fee != nil { // 0.01 to 100%
		b.Fee = orNil(decimalText(o.scaled("ApplicationFeePercentage", fee, 2, 10_000), 2))
		if b.PaymentMethod != "StripeConnect" && b.PaymentMethod != "" {
			o.refuse("ApplicationFeePercentage", "is given with paymentMethod %q", b.PaymentMethod)
		}
	}
	if in["metadata"] != nil {
		b.Metadata = o.metadata(in["metadata"], b.Metadata)
	}
}

// str returns in[name] when it is a string, "" when it is absent or null, and refuses any other value.
func (o *oracle) str(in map[string]any, name string) string {
	s, ok := in[name].(string)
	if !ok && in[name] != nil {
		o.refuse(name, "is a %T, not a string", in[name])
	}
	return s
}

// oneOf returns in[name] when it is exactly one of allowed; else "", and refuses it if it is given.
func (o *oracle) oneOf(in map[string]any, name string, allowed ...string) string {
	if s := o.str(in, name); slices.Contains(allowed, s) {
		return s
	} else if s != "" {
		o.refuse(name, "%.40q is not one of %q", s, allowed)
	}
	return ""
}

// chars refuses s unless it has min to max characters, none of them bad.
func (o *oracle) chars(name, s string, min, max int, bad func(rune) bool) {
	if n := utf8.RuneCountInString(s); n < min || n > max || strings.ContainsFunc(s, bad) {
		o.refuse(name, "%.40q has %d characters (want %d to %d) or one not allowed", s, n, min, max)
	}
}

// scaled is v, a plain decimal as a JSON string or number, in units of 10^-exp: 1 to limit.
func (o *oracle) scaled(name string, v any, exp int, limit int64) int64 {
	s := fmt.Sprint(v)                // a string, or a number's text: no other JSON value prints as a decimal
	if !plainDecimal.MatchString(s) { // big.Rat would read more: signs, exponents, fractions
		o.refuse(name, "%.40q (a %T) is not a plain decimal", s, v)
		return 0
	}
	r, _ := new(big.Rat).SetString(s)
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil)))
	if !r.IsInt() || r.Sign() == 0 || r.Num().Cmp(big.NewInt(limit)) > 0 {
		o.refuse(name, "%.40q is not 1 to %d units of 10^-%d", s, limit, exp)
		return 0
	}
	return r.Num().Int64()
}

// metadata is stored with v merged in: a string sets its key, null or "" removes it; 50 keys at most.
func (o *oracle) metadata(v any, stored map[string]string) map[string]string {
	object, ok := v.(map[string]any) // encoding/json: a repeated key keeps its last value
	if !ok {
		o.refuse("metadata", "is a %T, not an object", v)
	}
	merged := maps.Clone(stored)
	for key, value := range object {
		s, isString := value.(string)
		switch {
		case !metadataKey.MatchString(key):
			o.refuse("metadata", "has the key %.40q", key)
		case !isString && value != nil:
			o.refuse("metadata."+key, "is a %T", value)
		case s == "": // null or "": the key goes
			delete(merged, key)
		default:
			merged[key] = s
			o.chars("metadata."+key, s, 1, 500, unicode.IsControl)
		}
	}
	if len(merged) > 50 {
		o.refuse("metadata", "would have %d keys", len(merged))
	}
	return merged
}

// decimalText writes n / 10^exp with exactly exp decimal places.
func decimalText(n int64, exp int) string {
	return big.NewRat(n, int64(math.Pow10(exp))).FloatString(exp)
}
