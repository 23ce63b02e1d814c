package main

// Fuzz targets held to an oracle apart from validate.go; to fuzz: go test -run '^$' -fuzz '^FuzzCreate$' .

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
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
	updateFields = []string{"productName", "description", "amount", "currency", feeField, "metadata"}
	intervals    = map[string]string{"day": "day", "week": "week", "month": "month", "year": "year",
		"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year"}
)

// Any create body is answered 413 above 64 KiB, else 200 and stored exactly as the oracle says, or 400.
func FuzzCreate(f *testing.F) {
	shared := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared // one server for every input; the copy fails this input's t
		e.t = t
		n, o := e.buttons(), &oracle{}
		want := o.create(body)
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if !o.verdict(t, r, len(body)) {
			expect(t, e.buttons() == n, "%s\ngot %d buttons after it, want %d", r.request, e.buttons(), n)
			return
		}
		got := e.stored("acme", r.dataString()) // a valid id: validButtonID
		want.ID, want.State, want.Version = got.ID, "active", 1
		want.CreatedAt, want.UpdatedAt = got.CreatedAt, got.CreatedAt // the same
		checkButton(t, &e, r, got, want, "created")
	})
}

// Any update body leaves the button as the oracle says: StripeConnect, 10.50 USD (not JPY), 49 metadata keys.
func FuzzUpdate(f *testing.F) {
	shared := newTestServer(f)
	md := map[string]string{"orderRef": "A-17"}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	base := createBody(m{"paymentMethod": "StripeConnect", feeField: "2.50", "amount": "10.50",
		"metadata": md})
	var id string // a button still as base made it: most inputs leave it so, which saves a create each
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared
		e.t = t
		if id == "" {
			id = e.create(e.key, base)
		}
		before, o := e.stored("acme", id), &oracle{}
		want := before // update knows edit's names alone: none of those fixed at create
		if in := o.object(body, updateFields...); in != nil {
			named := o.edit(in, &want)
			if !named {
				o.refuse("the body names nothing to update")
			}
		}
		r := e.do("POST", "/product-payment/update/"+id, e.key, string(body))
		got := e.stored("acme", id)
		if !reflect.DeepEqual(got, before) {
			id = "" // the next input needs a button as base makes it
		}
		switch {
		case !o.verdict(t, r, len(body)):
			checkButton(t, &e, r, got, before, "")
		case reflect.DeepEqual(want, before):
			checkButton(t, &e, r, got, before, "unchanged")
		default:
			want.Version, want.UpdatedAt = before.Version+1, got.UpdatedAt
			checkButton(t, &e, r, got, want, "updated")
		}
	})
}

// checkButton checks got against want, a history row per version, and r's message ("": a refusal).
func checkButton(t *testing.T, e *testEnv, r response, got, want button, message string) {
	t.Helper()
	expect(t, reflect.DeepEqual(got, want), "%s\ngot  %s\nwant %s", r.request, jsonOf(got), jsonOf(want))
	n := e.count(`SELECT count(*) FROM history WHERE button_id = ?`, want.ID)
	expect(t, int64(n) == want.Version, "%s\ngot %d history rows, want %d", r.request, n, want.Version)
	if message == "" {
		return
	}
	expect(t, r.env.Message == message && r.dataString() == want.ID, "%s\ngot %q %s, want %q %q", r.request,
		r.env.Message, r.env.Data, message, want.ID)
	e.do("GET", "/product-payment/get/"+want.ID, e.key, "").want(t, 200, "")
}

// oracle collects every reason the contract gives to refuse a body; a body with none must be accepted.
type oracle struct{ why []string }

func (o *oracle) refuse(format string, a ...any) { o.why = append(o.why, fmt.Sprintf(format, a...)) }

// verdict checks r, the answer to n bytes, against the oracle's reasons; it returns whether r is a 200.
func (o *oracle) verdict(t *testing.T, r response, n int) bool {
	t.Helper()
	switch {
	case n > 64<<10:
		r.want(t, 413, "payload_too_large")
	case len(o.why) == 0:
		r.want(t, 200, "")
	case r.status == 200:
		t.Fatalf("%s\ngot 200 %s\nwant 400: %s", r.request, r.raw, strings.Join(o.why, "; "))
	default:
		r.want(t, 400, "invalid_request")
		expect(t, len(r.env.Errors) > 0 && string(r.env.Data) == `""`, "%s\ngot errors %v, data %s; want a "+
			"field named, data \"\"", r.request, r.env.Errors, r.env.Data)
	}
	return r.status == 200
}

// object reads body: one JSON object in UTF-8, each name one of known and given once (compared decoded).
func (o *oracle) object(body []byte, known ...string) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	first, _ := dec.Token()
	if !json.Valid(body) || !utf8.Valid(body) || first != json.Delim('{') {
		o.refuse("the body is not one JSON object in UTF-8")
		return nil
	}
	in := map[string]any{}
	for dec.More() {
		tok, _ := dec.Token()
		var value any
		dec.Decode(&value) // the body is valid: nothing fails
		if _, twice := in[tok.(string)]; twice || !slices.Contains(known, tok.(string)) {
			o.refuse("%.40q is given twice, or is not one of %q", tok, known)
		}
		in[tok.(string)] = value
	}
	return in
}

// create is the button a create body describes, but for id, state, version and times.
func (o *oracle) create(body []byte) button {
	b := button{Metadata: map[string]string{}}
	in := o.object(body, append(updateFields, "billingInterval", "paymentMethod", "paymentType",
		"isLive")...)
	for _, name := range []string{"productName", "amount", "currency", "paymentMethod", "paymentType",
		"isLive"} {
		if in[name] == nil { // absent or null
			o.refuse("%s is required", name)
		}
	}
	b.PaymentMethod, b.PaymentType = o.str(in, "paymentMethod"), o.str(in, "paymentType")
	isLive, isBool := in["isLive"].(bool)
	b.IsLive = isLive
	if !slices.Contains([]string{"the service", "Stripe", "StripeConnect"}, b.PaymentMethod) ||
		!slices.Contains([]string{"one_time", "subscription"}, b.PaymentType) || !isBool {
		o.refuse("paymentMethod %.40q, paymentType %.40q, isLive %v: not as named, exactly",
			b.PaymentMethod, b.PaymentType, in["isLive"])
	}
	s := o.str(in, "billingInterval") // "" or null: none
	interval := intervals[strings.ToLower(s)]
	if s != "" && (interval == "" || !asciiLetters.MatchString(s)) {
		o.refuse("billingInterval %.40q is no spelling of an interval", s)
	}
	b.BillingInterval = orNil(interval)
	if (b.PaymentType == "subscription") != (interval != "") {
		o.refuse("paymentType %q with billingInterval %q", b.PaymentType, interval)
	}
	if in[feeField] == nil && b.PaymentMethod == "StripeConnect" {
		o.refuse("%s is required with StripeConnect", feeField)
	}
	o.edit(in, &b)
	return b
}

// edit sets in b the fields create and update share, and reports whether in names any. null leaves
// a field as it is, but clears description; a new currency without a new amount keeps the amount.
func (o *oracle) edit(in map[string]any, b *button) (named bool) {
	stored, places := *b, currencyExponents
	if _, given := in["description"]; given {
		named, b.Description = true, orNil(o.str(in, "description"))
		o.chars("description", o.str(in, "description"), 0, 5000,
			func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) })
	}
	if in["productName"] != nil {
		named, b.ProductName = true, strings.TrimSpace(o.str(in, "productName"))
		o.chars("productName", b.ProductName, 1, 250,
			func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) })
		if !strings.ContainsFunc(b.ProductName,
			func(r rune) bool { return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) }) {
			o.refuse("productName %.40q has no letter, digit, punctuation mark or symbol",
				b.ProductName)
		}
	}
	if in["currency"] != nil { // ASCII letters (no Unicode case mapping makes a code), no metal or test
		s := o.str(in, "currency")
		named, b.Currency = true, strings.ToUpper(s)
		_, active := places[b.Currency]
		if !active || len(s) != 3 || !asciiLetters.MatchString(s) ||
			strings.Contains("XAU XTS XXX", b.Currency) {
			o.refuse("currency %.40q is no three-letter code of a currency a button may charge", s)
		}
	}
	exp := places[b.Currency]
	if in["amount"] != nil {
		named, b.Amount = true, decimalText(o.scaled("amount", in["amount"], exp, 1e15), exp)
	} else if stored.Currency != "" && b.Currency != stored.Currency {
		b.Amount = decimalText(o.scaled("the stored amount", stored.Amount, exp, 1e15), exp)
	}
	if in[feeField] != nil { // 0.01 to 100%
		named, b.Fee = true, orNil(decimalText(o.scaled(feeField, in[feeField], 2, 10_000), 2))
		if b.PaymentMethod != "StripeConnect" {
			o.refuse("%s is given with paymentMethod %q", feeField, b.PaymentMethod)
		}
	}
	if in["metadata"] != nil {
		named, b.Metadata = true, o.metadata(in["metadata"], b.Metadata)
	}
	return named
}

// str returns in[name] when it is a string, "" when it is absent or null, and refuses any other value.
func (o *oracle) str(in map[string]any, name string) string {
	s, ok := in[name].(string)
	if !ok && in[name] != nil {
		o.refuse("%s is a %T, not a string", name, in[name])
	}
	return s
}

// chars refuses s unless it has min to max characters, none of them bad.
func (o *oracle) chars(name, s string, min, max int, bad func(rune) bool) {
	if n := utf8.RuneCountInString(s); n < min || n > max || strings.ContainsFunc(s, bad) {
		o.refuse("%s %.40q has %d characters (want %d to %d) or one not allowed", name, s, n, min, max)
	}
}

// scaled is v, a plain decimal as a JSON string or number, in units of 10^-exp: 1 to limit.
func (o *oracle) scaled(name string, v any, exp int, limit int64) int64 {
	s := fmt.Sprint(v)                // a string, or a number's text: no other JSON value prints as a decimal
	if !plainDecimal.MatchString(s) { // big.Rat would read more: signs, exponents, fractions
		o.refuse("%s %.40q (a %T) is not a plain decimal", name, s, v)
		return 0
	}
	r, _ := new(big.Rat).SetString(s)
	r.Mul(r, big.NewRat(int64(math.Pow10(exp)), 1))
	if !r.IsInt() || r.Sign() == 0 || r.Num().Cmp(big.NewInt(limit)) > 0 {
		o.refuse("%s %.40q is not 1 to %d units of 10^-%d", name, s, limit, exp)
		return 0
	}
	return r.Num().Int64()
}

// metadata is stored with v merged in: a string sets its key, null or "" removes it; 50 keys at most.
func (o *oracle) metadata(v any, stored map[string]string) map[string]string {
	object, ok := v.(map[string]any) // encoding/json: a repeated key keeps its last value
	if !ok {
		o.refuse("metadata is a %T, not an object", v)
	}
	merged := maps.Clone(stored)
	for key, value := range object {
		s, isString := value.(string)
		if !metadataKey.MatchString(key) || !isString && value != nil {
			o.refuse("metadata has the key %.40q with a %T", key, value)
		}
		merged[key] = s
		if s == "" { // null or "": the key goes
			delete(merged, key)
		}
		o.chars("metadata."+key, s, 0, 500, unicode.IsControl)
	}
	if len(merged) > 50 {
		o.refuse("metadata would have %d keys", len(merged))
	}
	return merged
}

// decimalText writes n / 10^exp with exactly exp decimal places.
func decimalText(n int64, exp int) string {
	return big.NewRat(n, int64(math.Pow10(exp))).FloatString(exp)
}
