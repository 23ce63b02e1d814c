package main

// Fuzz targets. Their seed corpora in testdata/fuzz/<target>/ run as ordinary
// tests in every go test. To search for new failing inputs, fuzz one target:
//
//	go test -run '^$' -fuzz '^FuzzCreate$' -fuzztime 10m .
//
// A failing input is written to testdata/fuzz/<target>/ and from then on runs
// in every go test, so keep it with the fix.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/big"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// fuzzBodyLimit is the contract's body cap: a longer body is a 413.
const fuzzBodyLimit = 64 << 10

// forInput returns a copy of e whose helpers fail t, the test of one input.
func (e *testEnv) forInput(t *testing.T) *testEnv {
	c := *e
	c.t = t
	return &c
}

// FuzzCreate posts any body to create. The answer is the envelope with 200 or
// 400 (413 above 64 KiB), never a 5xx; a refused body stores nothing; an
// accepted one is stored as the body says, which get shows.
func FuzzCreate(f *testing.F) {
	shared := newTestServer(f)
	f.Add([]byte(createBody(nil)))
	f.Fuzz(func(t *testing.T, body []byte) {
		e := shared.forInput(t)
		before := e.countButtons()
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if r.status != 200 || len(body) > fuzzBodyLimit {
			wantRefused(t, r, len(body))
			if n := e.countButtons(); n != before {
				t.Errorf("%s\ngot %d buttons after a %d, want %d", r.request, n, r.status, before)
			}
			return
		}
		r.want(t, 200, "")
		if n := e.countButtons(); n != before+1 {
			t.Errorf("%s\ngot %d buttons after a create, want %d", r.request, n, before+1)
		}
		o := &oracle{}
		want := o.created(body)
		o.shows(e.getView(e.key, r.dataString()), want, r.dataString(), 1)
		o.report(t, r.request)
	})
}

// fuzzUpdateBase is the button each FuzzUpdate input changes: StripeConnect, so
// a fee may change, and 10.50 USD, so some currencies fit it and some do not.
var fuzzUpdateBase = createBody(map[string]any{
	"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "2.50", "amount": "10.50",
})

// FuzzUpdate posts any body to update an active button as fuzzUpdateBase makes
// it. The answer is 200 or 400 (413 above 64 KiB), never a 409 or a 5xx; a
// refused body leaves the stored button exactly as it was; an accepted one
// changes what the body names, nothing else, and the version by one.
func FuzzUpdate(f *testing.F) {
	shared := newTestServer(f)
	f.Add([]byte(`{"amount":"12.00"}`))
	// id is a button still as fuzzUpdateBase made it. Most inputs are refused
	// and leave it so; only after one changes it does the next input need a new
	// one, so every input meets the same button at the cost of few writes.
	var id string
	f.Fuzz(func(t *testing.T, body []byte) {
		e := shared.forInput(t)
		if id == "" {
			id = e.create(e.key, fuzzUpdateBase)
		}
		before, err := e.stored("acme", id)
		if err != nil {
			t.Fatalf("read back %s: %v", id, err)
		}
		r := e.do("POST", "/product-payment/update/"+id, e.key, string(body))
		after, err := e.stored("acme", id)
		if err != nil || !reflect.DeepEqual(after, before) {
			id = ""
		}
		if err != nil {
			t.Fatalf("%s\nread back: %v", r.request, err)
		}
		if r.status != 200 || len(body) > fuzzBodyLimit {
			wantRefused(t, r, len(body))
			if !reflect.DeepEqual(after, before) {
				t.Errorf("%s\ngot %+v after a %d, want it unchanged: %+v", r.request, after, r.status, before)
			}
			return
		}
		r.want(t, 200, "")
		o := &oracle{}
		if r.dataString() != before.ID {
			o.errorf("data is %q, want %q", r.dataString(), before.ID)
		}
		want := o.updated(body, before)
		if changed := !want.sameAs(before); changed != (r.env.Message == "updated") {
			o.errorf("message %q for a body that changes the button: %v", r.env.Message, changed)
		} else if changed {
			want.Version, want.ChangeSeq = before.Version+1, after.ChangeSeq
			if after.UpdatedAt.Before(before.UpdatedAt.Time) || after.ChangeSeq <= before.ChangeSeq {
				o.errorf("updatedAt or changeSeq went back: %v %d, then %v %d", before.UpdatedAt, before.ChangeSeq,
					after.UpdatedAt, after.ChangeSeq)
			}
			want.UpdatedAt = after.UpdatedAt
		}
		if !reflect.DeepEqual(after, want) {
			o.errorf("stored %+v\nwant   %+v", after, want)
		}
		o.shows(e.getView(e.key, before.ID), want, before.ID, want.Version)
		o.report(t, r.request)
	})
}

// wantRefused checks a refused write: 413 for a body over the cap, else 400
// invalid_request naming at least one field, never any other status.
func wantRefused(t *testing.T, r response, bodyLen int) {
	t.Helper()
	if bodyLen > fuzzBodyLimit {
		r.want(t, 413, "payload_too_large")
		return
	}
	r.want(t, 400, "invalid_request")
	if len(r.env.Errors) == 0 || string(r.env.Data) != `""` {
		t.Errorf("%s\ngot errors %v data %s, want at least one field and data \"\"", r.request, r.env.Errors, r.env.Data)
	}
}

// FuzzDecimal reads any text as an amount in JPY, USD and KWD and as a fee,
// directly and through decodeCreate (as a JSON string, and as a JSON number
// when the text is one). The text is accepted exactly when it is a plain
// decimal (so never with a sign, exponent or space) whose value fits: 1 to
// 10^15 whole minor units, or 0.01 to 100 in hundredths for a fee. What is
// accepted renders as text that reads back to the same value.
func FuzzDecimal(f *testing.F) {
	f.Add([]byte("19.90"))
	f.Fuzz(func(t *testing.T, input []byte) {
		text := string(input)
		value := plainDecimal(text)
		d, ok := parseDecimal(text)
		if ok != (value != nil) {
			t.Fatalf("parseDecimal(%q): got ok %v, want %v", text, ok, value != nil)
		}
		for _, currency := range []string{"JPY", "USD", "KWD"} {
			exp := currencyExponents[currency]
			want, fits := scaledInt(value, exp, maxAmountMinor)
			if ok && !d.isZero() { // zero never reaches minorUnits: amount refuses it first
				minor, why := minorUnits(d, currency)
				if (why == "") != fits || fits && minor != want {
					t.Errorf("minorUnits(%q, %s): got %d %q, want %d (fits %v)", text, currency, minor, why, want, fits)
				}
				if why == "" {
					shown := formatAmount(minor, currency)
					again, agreed := parseDecimal(shown)
					back, why := minorUnits(again, currency)
					if !agreed || why != "" || back != minor || decimalPlaces(shown) != exp {
						t.Errorf("%q %s: formatAmount gives %q, which reads back as %d %q, want %d with %d places",
							text, currency, shown, back, why, minor, exp)
					}
				}
			}
			for _, form := range jsonForms(text) {
				body := createBody(map[string]any{"amount": raw(form), "currency": currency})
				b, err := decodeCreate([]byte(body), "the service")
				if accepted := fits && want >= 1; (err == nil) != accepted || accepted && b.AmountMinor != want {
					t.Errorf("amount %s in %s: got %d, %v; want %d accepted %v", form, currency, b.AmountMinor, err, want, accepted)
				}
				if err == nil && (b.AmountMinor < 1 || b.AmountMinor > maxAmountMinor) {
					t.Errorf("amount %s in %s: got %d minor units, want 1 to 10^15", form, currency, b.AmountMinor)
				}
			}
		}
		want, fits := scaledInt(value, 2, 10_000)
		for _, form := range jsonForms(text) {
			body := createBody(map[string]any{"paymentMethod": "StripeConnect", feeField: raw(form)})
			b, err := decodeCreate([]byte(body), "the service")
			if accepted := fits && want >= 1; (err == nil) != accepted || accepted && b.FeeBasisPoints != want {
				t.Errorf("fee %s: got %d basis points, %v; want %d accepted %v", form, b.FeeBasisPoints, err, want, accepted)
			}
			if err != nil {
				continue
			}
			shown := formatFee(b.FeeBasisPoints)
			if back := plainDecimal(shown); back == nil || value == nil || back.Cmp(value) != 0 || decimalPlaces(shown) != 2 {
				t.Errorf("fee %s: formatFee gives %q, want the value of %q with 2 places", form, shown, text)
			}
		}
	})
}

// jsonForms is text as the JSON values a client could send it as: a string,
// and the text itself when it is a JSON number exactly as it stands.
func jsonForms(text string) []string {
	quoted, _ := json.Marshal(text) // invalid UTF-8 becomes U+FFFD: still not a decimal
	forms := []string{string(quoted)}
	if text != "" && json.Valid([]byte(text)) && (text[0] == '-' || '0' <= text[0] && text[0] <= '9') &&
		text == strings.Trim(text, " \t\r\n") {
		forms = append(forms, text)
	}
	return forms
}

// --- the oracle: what an accepted body means, worked out from the contract ---

var (
	plainDecimalText = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	createFieldNames = []string{"productName", "description", "amount", "currency",
		"billingInterval", "paymentMethod", "paymentType", "isLive", "ApplicationFeePercentage", "metadata"}
	updateFieldNames = []string{"productName", "description", "amount", "currency", "ApplicationFeePercentage", "metadata"}
	// intervalSpellings maps every accepted spelling, in any case, to the stored value.
	intervalSpellings = map[string]string{
		"day": "day", "week": "week", "month": "month", "year": "year",
		"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year",
	}
)

// plainDecimal returns the value of text when it is digits, optionally with a
// dot and more digits; nil for anything else.
func plainDecimal(text string) *big.Rat {
	if !plainDecimalText.MatchString(text) {
		return nil
	}
	r, _ := new(big.Rat).SetString(text)
	return r
}

// scaledInt returns v * 10^exp when that is a whole number from 0 to limit; false otherwise.
func scaledInt(v *big.Rat, exp int, limit int64) (int64, bool) {
	if v == nil {
		return 0, false
	}
	scaled := new(big.Rat).Mul(v, new(big.Rat).SetInt(pow10(exp)))
	if !scaled.IsInt() || scaled.Num().Cmp(big.NewInt(limit)) > 0 {
		return 0, false
	}
	return scaled.Num().Int64(), true
}

func pow10(exp int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil) }

// decimalPlaces is how many digits text has after its dot.
func decimalPlaces(text string) int {
	_, frac, _ := strings.Cut(text, ".")
	return len(frac)
}

// oracle collects every way an accepted body breaks the contract or was not
// stored as it says.
type oracle struct{ problems []string }

func (o *oracle) errorf(format string, args ...any) {
	o.problems = append(o.problems, fmt.Sprintf(format, args...))
}

// report fails t with every problem found for request.
func (o *oracle) report(t *testing.T, request string) {
	t.Helper()
	if len(o.problems) > 0 {
		t.Errorf("%s\naccepted, but:\n%s", request, strings.Join(o.problems, "\n"))
	}
}

// object decodes body the plain way (encoding/json, numbers kept as text) and
// notes what an accepted body cannot be: not UTF-8, not exactly one object,
// names outside known or repeated. It returns nil when there is no object to read.
func (o *oracle) object(body []byte, known []string) map[string]any {
	if !utf8.Valid(body) {
		o.errorf("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var in map[string]any
	if err := dec.Decode(&in); err != nil || in == nil {
		o.errorf("the body is not a JSON object (%v)", err)
		return nil
	}
	if _, err := dec.Token(); err != io.EOF {
		o.errorf("the body has data after the object")
	}
	names := objectNames(body)
	for i, name := range names {
		if !slices.Contains(known, name) {
			o.errorf("the body has the unknown field %q", name)
		}
		if slices.Contains(names[:i], name) {
			o.errorf("the body has %q more than once", name)
		}
	}
	return in
}

// objectNames lists the names of body's top-level object in order, repeats included.
func objectNames(body []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		name, isName := tok.(string)
		var value json.RawMessage
		if err != nil || !isName || dec.Decode(&value) != nil {
			break
		}
		names = append(names, name)
	}
	return names
}

// given returns in[name] when it is present and not null.
func given(in map[string]any, name string) (any, bool) {
	v, ok := in[name]
	return v, ok && v != nil
}

// text returns v when it is a JSON string, noting a problem when it is not.
func (o *oracle) text(name string, v any) string {
	s, ok := v.(string)
	if !ok {
		o.errorf("%s %v (%T) is not a string", name, v, v)
	}
	return s
}

// created is the button an accepted create body describes.
func (o *oracle) created(body []byte) button {
	in := o.object(body, createFieldNames)
	if in == nil {
		return button{}
	}
	var b button
	if v, ok := given(in, "productName"); ok {
		b.ProductName = o.productName(v)
	} else {
		o.errorf("productName is missing")
	}
	b.Description = o.description(in["description"])
	b.Metadata = o.metadata(in["metadata"], nil)
	if v, ok := given(in, "currency"); ok {
		b.Currency = o.currency(v)
	} else {
		o.errorf("currency is missing")
	}
	if v, ok := given(in, "amount"); ok {
		b.AmountMinor = o.amount(v, b.Currency)
	} else {
		o.errorf("amount is missing")
	}
	b.PaymentMethod = o.oneOf("paymentMethod", in["paymentMethod"], "the service", "Stripe", "StripeConnect")
	b.PaymentType = o.oneOf("paymentType", in["paymentType"], "one_time", "subscription")
	if interval, ok := given(in, "billingInterval"); ok && interval != "" {
		b.BillingInterval = o.interval(interval)
	}
	if (b.PaymentType == "subscription") != (b.BillingInterval != "") {
		o.errorf("paymentType %s with billingInterval %q", b.PaymentType, b.BillingInterval)
	}
	isLive, ok := in["isLive"].(bool)
	if !ok {
		o.errorf("isLive %v is not a boolean", in["isLive"])
	}
	b.IsLive = isLive
	fee, feeGiven := given(in, feeField)
	switch {
	case b.PaymentMethod == "StripeConnect" && feeGiven:
		b.FeeBasisPoints = o.fee(fee)
	case feeGiven:
		o.errorf("%s is given with paymentMethod %s", feeField, b.PaymentMethod)
	case b.PaymentMethod == "StripeConnect":
		o.errorf("%s is missing with StripeConnect", feeField)
	}
	return b
}

// updated is before changed as an accepted update body says.
func (o *oracle) updated(body []byte, before button) button {
	in := o.object(body, updateFieldNames)
	if in == nil {
		return before
	}
	b, changes := before, false
	if v, ok := in["description"]; ok { // null clears it; for the others null means absent
		b.Description, changes = o.description(v), true
	}
	if v, ok := given(in, "productName"); ok {
		b.ProductName, changes = o.productName(v), true
	}
	if v, ok := given(in, "currency"); ok {
		b.Currency, changes = o.currency(v), true
	}
	if v, ok := given(in, "amount"); ok {
		b.AmountMinor, changes = o.amount(v, b.Currency), true
	} else if b.Currency != before.Currency {
		// The stored amount, re-expressed in the new currency's minor unit.
		stored := new(big.Rat).SetFrac(big.NewInt(before.AmountMinor), pow10(o.exponent(before.Currency)))
		minor, fits := scaledInt(stored, o.exponent(b.Currency), maxAmountMinor)
		if !fits {
			o.errorf("the stored amount %d %s does not fit %s", before.AmountMinor, before.Currency, b.Currency)
		}
		b.AmountMinor = minor
	}
	if v, ok := in["metadata"]; ok && v != nil {
		b.Metadata, changes = o.metadata(v, before.Metadata), true
	}
	if v, ok := given(in, feeField); ok {
		if before.PaymentMethod != "StripeConnect" {
			o.errorf("%s is given for a %s button", feeField, before.PaymentMethod)
		}
		b.FeeBasisPoints, changes = o.fee(v), true
	}
	if !changes {
		o.errorf("the body changes nothing")
	}
	return b
}

// productName is the stored name for v: trimmed, 1 to 250 characters, no
// control characters, at least one visible.
func (o *oracle) productName(v any) string {
	name := strings.TrimSpace(o.text("productName", v))
	visible := strings.ContainsFunc(name, func(r rune) bool { return unicode.IsGraphic(r) && !unicode.IsSpace(r) })
	if n := utf8.RuneCountInString(name); n < 1 || n > 250 || strings.ContainsFunc(name, unicode.IsControl) || !visible {
		o.errorf("productName %q has %d characters, a control character or none visible", name, n)
	}
	return name
}

// metadata is stored with v merged in: string values set keys of 1 to 40 of
// A-Z a-z 0-9 _ - ., null or "" remove them; at most 50 keys, values up to 500
// characters without control characters.
func (o *oracle) metadata(v any, stored metadata) metadata {
	if v == nil {
		return stored
	}
	object, ok := v.(map[string]any)
	if !ok {
		o.errorf("metadata %v is not an object", v)
	}
	merged := maps.Clone(stored)
	for key, value := range object {
		if !regexp.MustCompile(`^[A-Za-z0-9_.-]{1,40}$`).MatchString(key) {
			o.errorf("metadata key %q is malformed", key)
		}
		switch value := value.(type) {
		case nil:
			delete(merged, key)
		case string:
			if value == "" {
				delete(merged, key)
				continue
			}
			if utf8.RuneCountInString(value) > 500 || strings.ContainsFunc(value, unicode.IsControl) {
				o.errorf("metadata.%s is too long or has a control character", key)
			}
			if merged == nil {
				merged = metadata{}
			}
			merged[key] = value
		default:
			o.errorf("metadata.%s %v is not a string", key, value)
		}
	}
	if len(merged) > 50 {
		o.errorf("metadata has %d keys", len(merged))
	}
	return merged
}

// description is the stored description for v: "" for absent or null, else
// the text itself, up to 5000 characters with no control characters but tab and line breaks.
func (o *oracle) description(v any) string {
	if v == nil {
		return ""
	}
	s := o.text("description", v)
	control := func(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' }
	if n := utf8.RuneCountInString(s); n > 5000 || strings.ContainsFunc(s, control) {
		o.errorf("description %q has %d characters or a control character", s, n)
	}
	return s
}

// currency is the stored code for v: three ASCII letters, upper-cased, an active currency.
func (o *oracle) currency(v any) string {
	s := o.text("currency", v)
	code := []byte(s)
	for i, c := range code {
		if 'a' <= c && c <= 'z' {
			code[i] = c - 'a' + 'A'
		} else if c < 'A' || c > 'Z' {
			o.errorf("currency %q is not three ASCII letters", s)
			break
		}
	}
	if len(code) != 3 {
		o.errorf("currency %q is not three letters", s)
	}
	o.exponent(string(code))
	return string(code)
}

// exponent is currency's number of decimal places, noting a currency that has none.
func (o *oracle) exponent(currency string) int {
	exp, ok := currencyExponents[currency]
	if !ok {
		o.errorf("currency %q is not an active ISO 4217 currency", currency)
	}
	return exp
}

// decimal is the value of a JSON string or number v, noting one that is not a plain decimal.
func (o *oracle) decimal(name string, v any) *big.Rat {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case json.Number:
		s = v.String()
	}
	value := plainDecimal(s)
	if value == nil {
		o.errorf("%s %v is not a plain decimal", name, v)
		return new(big.Rat)
	}
	return value
}

// amount is v in currency's minor units: a whole number from 1 to 10^15.
func (o *oracle) amount(v any, currency string) int64 {
	value := o.decimal("amount", v)
	minor, fits := scaledInt(value, o.exponent(currency), maxAmountMinor)
	if !fits || minor < 1 {
		o.errorf("amount %v is not 1 to 10^15 whole minor units of %s", v, currency)
	}
	return minor
}

// fee is v in basis points: a whole number from 1 (0.01%) to 10000 (100%).
func (o *oracle) fee(v any) int64 {
	bp, fits := scaledInt(o.decimal(feeField, v), 2, 10_000)
	if !fits || bp < 1 {
		o.errorf("%s %v is not 0.01 to 100 in steps of 0.01", feeField, v)
	}
	return bp
}

// oneOf returns v, noting one that is not exactly one of allowed.
func (o *oracle) oneOf(name string, v any, allowed ...string) string {
	s := o.text(name, v)
	if !slices.Contains(allowed, s) {
		o.errorf("%s %q is not one of %q", name, s, allowed)
	}
	return s
}

// interval is the stored billing interval for v, any spelling in any case.
func (o *oracle) interval(v any) string {
	s := o.text("billingInterval", v)
	for spelling, interval := range intervalSpellings {
		if strings.EqualFold(s, spelling) {
			return interval
		}
	}
	o.errorf("billingInterval %q is not a known spelling", s)
	return ""
}

// shows notes where get's view of button id differs from want, at version.
func (o *oracle) shows(got map[string]any, want button, id string, version int64) {
	orNull := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	for name, value := range map[string]any{
		"id":              id,
		"productName":     want.ProductName,
		"description":     orNull(want.Description),
		"currency":        want.Currency,
		"billingInterval": orNull(want.BillingInterval),
		"paymentMethod":   want.PaymentMethod,
		"paymentType":     want.PaymentType,
		"isLive":          want.IsLive,
		"state":           "active",
		"version":         float64(version),
		"deletedAt":       nil,
	} {
		if got[name] != value {
			o.errorf("get shows %s %#v, want %#v", name, got[name], value)
		}
	}
	exp := currencyExponents[want.Currency]
	amount, _ := got["amount"].(string)
	if minor, fits := scaledInt(plainDecimal(amount), exp, maxAmountMinor); !fits || minor != want.AmountMinor || decimalPlaces(amount) != exp {
		o.errorf("get shows amount %#v, want %d minor units of %s with %d places", got["amount"], want.AmountMinor, want.Currency, exp)
	}
	fee, _ := got[feeField].(string)
	if want.FeeBasisPoints == 0 && got[feeField] != nil {
		o.errorf("get shows %s %#v, want null", feeField, got[feeField])
	}
	if bp, fits := scaledInt(plainDecimal(fee), 2, 10_000); want.FeeBasisPoints != 0 && (!fits || bp != want.FeeBasisPoints || decimalPlaces(fee) != 2) {
		o.errorf("get shows %s %#v, want %d basis points with 2 places", feeField, got[feeField], want.FeeBasisPoints)
	}
}
