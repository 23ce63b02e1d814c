package main

// Fuzz targets. Their seed corpora in testdata/fuzz/<target>/ run as ordinary tests in every go test. To search for
// new failing inputs, fuzz one target:
//
//	go test -run '^$' -fuzz '^FuzzCreate$' -fuzztime 10m .
//
// A failing input is written to testdata/fuzz/<target>/ and from then on runs in every go test: keep it with the fix.

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
	"time"
	"unicode"
	"unicode/utf8"
)

// The contract's limits, restated so that the oracle does not read validate.go's.
const (
	bodyCap  = 64 << 10              // a longer body is a 413
	maxMinor = 1_000_000_000_000_000 // 10^15 minor units
	maxFee   = 10_000                // 100% in basis points
)

// forInput returns a copy of e whose helpers fail t, the test of one input.
func (e *testEnv) forInput(t *testing.T) *testEnv { c := *e; c.t = t; return &c }

// FuzzCreate posts any body to create. The answer is 413 above 64 KiB; else a 200 exactly when the oracle finds nothing
// in the contract that refuses the body, and otherwise a 400 naming a field; never a 5xx. A refused body stores
// nothing; an accepted one is stored as a new button, with a well-formed id and the highest changeSeq, exactly as the
// oracle says, and get shows it.
func FuzzCreate(f *testing.F) {
	shared := newTestServer(f)
	f.Add([]byte(createBody(nil)))
	f.Fuzz(func(t *testing.T, body []byte) {
		e := shared.forInput(t)
		before := e.countButtons()
		o := &oracle{}
		want := o.created(body)
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if !o.verdict(t, r, len(body)) {
			if n := e.countButtons(); n != before {
				t.Errorf("%s\ngot %d buttons after a %d, want %d", r.request, n, r.status, before)
			}
			return
		}
		got := e.mustStored("acme", r.dataString())
		newest := e.count(`SELECT count(*) FROM buttons WHERE account = 'acme' AND change_seq >= ?`, got.ChangeSeq) == 1
		if n := e.countButtons(); !buttonID.MatchString(got.ID) || n != before+1 || !newest || got.CreatedAt.IsZero() {
			t.Errorf("%s\ngot id %q, %d buttons (want %d), changeSeq %d the highest: %v, createdAt %v",
				r.request, got.ID, n, before+1, got.ChangeSeq, newest, got.CreatedAt)
		}
		want.ID, want.Account, want.State, want.Version = got.ID, "acme", "active", 1
		want.ChangeSeq, want.CreatedAt, want.UpdatedAt = got.ChangeSeq, got.CreatedAt, got.CreatedAt
		expect(t, e, r, got, want, "created")
	})
}

// updateBase is the button each FuzzUpdate input changes: StripeConnect, so a fee may change; 10.50 USD, so some
// currencies fit it and some do not; and 49 metadata keys, so that a body adding two goes past 50 after the merge.
var updateBase = func() string {
	md := map[string]string{"orderRef": "A-17"}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	return createBody(m{"paymentMethod": "StripeConnect", feeField: "2.50", "amount": "10.50", "metadata": md})
}()

// FuzzUpdate posts any body to update a button as updateBase makes it: 200 or 400 as the oracle says (413 above 64
// KiB), never a 409 or a 5xx. A refused body, or an "unchanged" one (every value as stored), leaves the button and its
// history as they were; an "updated" one changes what it names and nothing else, adds a history row, the version by
// one, and a greater changeSeq.
func FuzzUpdate(f *testing.F) {
	shared := newTestServer(f)
	f.Add([]byte(`{"amount":"12.00"}`))
	// id is a button still as updateBase made it: most inputs leave it so, and every input meets the same button at
	// the cost of few writes.
	var id string
	const history = `SELECT count(*) FROM button_history WHERE button_id = ?`
	f.Fuzz(func(t *testing.T, body []byte) {
		e := shared.forInput(t)
		if id == "" {
			id = e.create(e.key, updateBase)
		}
		before, rows := e.mustStored("acme", id), e.count(history, id)
		o := &oracle{}
		want := o.updated(body, before)
		r := e.do("POST", "/product-payment/update/"+before.ID, e.key, string(body))
		after := e.mustStored("acme", id)
		if !reflect.DeepEqual(after, before) {
			id = "" // the next input needs a button as updateBase makes it
		}
		message := "unchanged"
		switch {
		case !o.verdict(t, r, len(body)):
			want, message = before, ""
		case !reflect.DeepEqual(want, before):
			message, want.Version = "updated", before.Version+1
			want.ChangeSeq, want.UpdatedAt = after.ChangeSeq, after.UpdatedAt
			if after.ChangeSeq <= before.ChangeSeq || after.UpdatedAt.Before(before.UpdatedAt.Time) {
				t.Errorf("%s\nchangeSeq %d and updatedAt %v, then %d and %v: want a greater changeSeq, updatedAt not earlier",
					r.request, before.ChangeSeq, before.UpdatedAt, after.ChangeSeq, after.UpdatedAt)
			}
		}
		if n, added := e.count(history, before.ID), int(want.Version-before.Version); n != rows+added {
			t.Errorf("%s\ngot %d history rows, want %d", r.request, n, rows+added)
		}
		expect(t, e, r, after, want, message)
	})
}

// FuzzDecimal reads any text as an amount in JPY, USD and KWD and as a fee, through parseDecimal and decodeCreate (as a
// JSON string, and as a JSON number when the text is one). The text is accepted exactly when it is a plain decimal (so
// never with a sign, exponent or space) whose value fits: 1 to 10^15 whole minor units, or 0.01 to 100 in hundredths
// for a fee; and what is accepted renders with exactly the currency's places (two for a fee).
func FuzzDecimal(f *testing.F) {
	for _, seed := range []string{"19.90", "0.01", "10.500", "007.50", "5.0", "1.250", "0.005", "2.5", "2.500", "100",
		"10000000000000.00", "10000000000000.01", "1000000000000000", "0", "-1", " 1", ".5", "１", "1e3"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		text := string(input)
		if _, ok := parseDecimal(text); ok != plainText.MatchString(text) {
			t.Fatalf("parseDecimal(%q): got ok %v, want %v", text, ok, !ok)
		}
		for _, c := range []struct {
			field, currency string
			exp             int
			limit           int64
		}{{"amount", "JPY", 0, maxMinor}, {"amount", "USD", 2, maxMinor}, {"amount", "KWD", 3, maxMinor},
			{feeField, "USD", 2, maxFee}} {
			want, fits := scaledInt(text, c.exp, c.limit)
			for _, form := range jsonForms(text) {
				b, err := decodeCreate([]byte(createBody(m{"paymentMethod": "StripeConnect", feeField: "1",
					"currency": c.currency, c.field: raw(form)})), "the service")
				got, shown := b.AmountMinor, formatAmount(b.AmountMinor, c.currency)
				if c.field == feeField {
					got, shown = b.FeeBasisPoints, formatScaled(b.FeeBasisPoints, 2)
				}
				if ok := fits && want >= 1; (err == nil) != ok || ok && (got != want || shown != decimalText(want, c.exp)) {
					t.Errorf("%s %s in %s: got %d shown as %q, error %v; want accepted %v, %d shown as %q",
						c.field, form, c.currency, got, shown, err, ok, want, decimalText(want, c.exp))
				}
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

// --- the oracle: what a body means, worked out from the contract alone ---

var (
	plainText    = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	asciiLetters = regexp.MustCompile(`^[A-Za-z]+$`)
	metadataKey  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,40}$`)
	buttonID     = regexp.MustCompile(`^btn_[0-7][0-9A-HJKMNP-TV-Z]{25}$`) // 128 bits of Crockford base32
	// intervals maps every accepted spelling, lower-cased, to the stored value.
	intervals = map[string]string{"day": "day", "week": "week", "month": "month", "year": "year",
		"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year"}
	// exponents are the decimal places of every chargeable currency: ISO 4217
	// is data, validate.go's table, but the codes the contract names are pinned.
	exponents = func() map[string]int {
		m := maps.Clone(currencyExponents)
		maps.Copy(m, map[string]int{"USD": 2, "JPY": 0, "KWD": 3})
		for _, code := range []string{"XAU", "XTS", "XXX"} {
			delete(m, code)
		}
		return m
	}()
)

// scaledInt returns text * 10^exp when text is a plain decimal (digits, maybe
// a dot and digits) and that is a whole number from 0 to limit; else false.
func scaledInt(text string, exp int, limit int64) (int64, bool) {
	if !plainText.MatchString(text) {
		return 0, false
	}
	v, _ := new(big.Rat).SetString(text)
	if v.Mul(v, new(big.Rat).SetInt(pow10(exp))); !v.IsInt() || v.Num().Cmp(big.NewInt(limit)) > 0 {
		return 0, false
	}
	return v.Num().Int64(), true
}

// decimalText writes n / 10^exp with exactly exp decimal places.
func decimalText(n int64, exp int) string {
	return new(big.Rat).SetFrac(big.NewInt(n), pow10(exp)).FloatString(exp)
}

func pow10(exp int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil) }

// oracle collects every reason the contract gives to refuse a body; a body with none must be accepted.
type oracle struct{ why []string }

func (o *oracle) refuse(f string, a ...any) { o.why = append(o.why, fmt.Sprintf(f, a...)) }

// verdict checks the answer r to a body of n bytes: 413 above the cap; else 200 when the oracle found no reason to
// refuse the body, and otherwise a 400 naming at least one field, with data "". It returns whether r is a 200.
func (o *oracle) verdict(t *testing.T, r response, n int) bool {
	t.Helper()
	switch {
	case n > bodyCap:
		r.want(t, 413, "payload_too_large")
	case r.status == 200 && len(o.why) > 0:
		t.Fatalf("%s\naccepted, but:\n%s", r.request, strings.Join(o.why, "\n"))
	case len(o.why) == 0:
		r.want(t, 200, "") // the contract accepts this body
	default:
		r.want(t, 400, "invalid_request")
		if len(r.env.Errors) == 0 || string(r.env.Data) != `""` {
			t.Errorf("%s\ngot errors %v data %s, want at least one field and data \"\"", r.request, r.env.Errors, r.env.Data)
		}
	}
	return r.status == 200
}

// object decodes body the plain way (encoding/json, numbers kept as text), refusing a body that is not UTF-8, not
// exactly one object, or has a name outside known or more than once. It returns nil when there is no object.
func (o *oracle) object(body []byte, known ...string) map[string]any {
	if !utf8.Valid(body) {
		o.refuse("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		o.refuse("the body is not a JSON object (%v, %v)", tok, err)
		return nil
	}
	in := map[string]any{}
	for dec.More() {
		tok, err := dec.Token()
		name, _ := tok.(string)
		var v any
		if err != nil || dec.Decode(&v) != nil {
			o.refuse("the body is not valid JSON")
			return nil
		}
		if _, twice := in[name]; twice || !slices.Contains(known, name) {
			o.refuse("the body has %.40q more than once or not among %q", name, known)
		}
		in[name] = v
	}
	_, err := dec.Token() // the closing brace
	if _, end := dec.Token(); err != nil || end != io.EOF {
		o.refuse("the body does not end with its object (%v, %v)", err, end)
	}
	return in
}

// given returns in[name] when it is present and not null.
func given(in map[string]any, name string) (any, bool) { v := in[name]; return v, v != nil }

// created is the button a create body describes.
func (o *oracle) created(body []byte) (b button) {
	in := o.object(body, "productName", "description", "amount", "currency",
		"billingInterval", "paymentMethod", "paymentType", "isLive", feeField, "metadata")
	if in == nil {
		return b
	}
	for _, name := range []string{"productName", "amount", "currency", "paymentMethod", "paymentType", "isLive"} {
		if _, ok := given(in, name); !ok {
			o.refuse("%s is missing", name)
		}
	}
	b.PaymentMethod, b.PaymentType = o.text("paymentMethod", in["paymentMethod"]), o.text("paymentType", in["paymentType"])
	if !slices.Contains([]string{"the service", "Stripe", "StripeConnect"}, b.PaymentMethod) ||
		!slices.Contains([]string{"one_time", "subscription"}, b.PaymentType) {
		o.refuse("paymentMethod %.40q or paymentType %.40q is not one the contract names", b.PaymentMethod, b.PaymentType)
	}
	if v, ok := given(in, "billingInterval"); ok && v != "" {
		s := o.text("billingInterval", v)
		if b.BillingInterval = intervals[strings.ToLower(s)]; b.BillingInterval == "" || !asciiLetters.MatchString(s) {
			o.refuse("billingInterval %.40q is no spelling of an interval (ASCII, any case)", s)
		}
	}
	if (b.PaymentType == "subscription") != (b.BillingInterval != "") {
		o.refuse("paymentType %q with billingInterval %q", b.PaymentType, b.BillingInterval)
	}
	var ok bool
	if b.IsLive, ok = in["isLive"].(bool); !ok {
		o.refuse("isLive is a %T, not a boolean", in["isLive"])
	}
	if _, ok := given(in, feeField); !ok && b.PaymentMethod == "StripeConnect" {
		o.refuse("%s is missing with StripeConnect", feeField)
	}
	o.edit(in, &b)
	return b
}

// updated is before as an update body changes it.
func (o *oracle) updated(body []byte, before button) button {
	b := before
	in := o.object(body, "productName", "description", "amount", "currency", feeField, "metadata")
	if in != nil && !o.edit(in, &b) {
		o.refuse("the body names nothing to update")
	}
	return b
}

// edit sets in b the fields create and update share, as in gives them, and reports whether in names any. description
// alone is cleared, by null or ""; null leaves any other as it is. A new currency without a new amount re-expresses the
// stored amount, which must fit it exactly.
func (o *oracle) edit(in map[string]any, b *button) (named bool) {
	stored := *b
	if v, ok := in["description"]; ok {
		named, b.Description = true, ""
		if v != nil {
			b.Description = o.text("description", v)
			o.chars("description", b.Description, 0, 5000,
				func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) })
		}
	}
	if v, ok := given(in, "productName"); ok {
		named, b.ProductName = true, strings.TrimSpace(o.text("productName", v))
		o.chars("productName", b.ProductName, 1, 250,
			func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) })
		shows := func(r rune) bool { return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) }
		if !strings.ContainsFunc(b.ProductName, shows) {
			o.refuse("productName %.40q has no letter, digit, punctuation mark or symbol", b.ProductName)
		}
	}
	if v, ok := given(in, "currency"); ok {
		s := o.text("currency", v)
		named, b.Currency = true, strings.ToUpper(s)
		if _, ok := exponents[b.Currency]; len(s) != 3 || !asciiLetters.MatchString(s) || !ok {
			o.refuse("currency %.40q is not three ASCII letters naming a chargeable currency", s)
		}
	}
	if v, ok := given(in, "amount"); ok {
		named, b.AmountMinor = true, o.scaled("amount", v, exponents[b.Currency], maxMinor)
	} else if stored.Currency != "" && b.Currency != stored.Currency {
		b.AmountMinor = o.scaled("the stored amount", decimalText(stored.AmountMinor, exponents[stored.Currency]),
			exponents[b.Currency], maxMinor)
	}
	if v, ok := given(in, feeField); ok {
		named, b.FeeBasisPoints = true, o.scaled(feeField, v, 2, maxFee)
		if b.PaymentMethod != "StripeConnect" {
			o.refuse("%s is given for paymentMethod %q", feeField, b.PaymentMethod)
		}
	}
	if v, ok := given(in, "metadata"); ok {
		named, b.Metadata = true, o.metadata(v, b.Metadata)
	}
	return named
}

// text returns v when it is a JSON string, refusing anything else.
func (o *oracle) text(name string, v any) string {
	s, ok := v.(string)
	if !ok {
		o.refuse("%s is a %T, not a string", name, v)
	}
	return s
}

// chars refuses s unless it has min to max characters, none of them bad.
func (o *oracle) chars(name, s string, min, max int, bad func(rune) bool) {
	if n := utf8.RuneCountInString(s); n < min || n > max || strings.ContainsFunc(s, bad) {
		o.refuse("%s %.40q has %d characters (want %d to %d) or one not allowed", name, s, n, min, max)
	}
}

// scaled returns v, a JSON string or number that is a plain decimal, in units
// of 10^-exp, refusing it unless that is a whole number from 1 to limit.
func (o *oracle) scaled(name string, v any, exp int, limit int64) int64 {
	s, _ := v.(string)
	if n, ok := v.(json.Number); ok {
		s = n.String()
	}
	n, fits := scaledInt(s, exp, limit)
	if !fits || n < 1 {
		o.refuse("%s %.40q (a %T) is not a plain decimal of 1 to %d units of 10^-%d", name, s, v, limit, exp)
	}
	return n
}

// metadata is stored merged with v: a string sets its key, null or "" removes it; a key is 1 to 40 of A-Z a-z 0-9 _ -
// ., a value 1 to 500 characters without control characters, and at most 50 keys remain. None is nil, as stored.
func (o *oracle) metadata(v any, stored metadata) metadata {
	object, ok := v.(map[string]any)
	if !ok {
		o.refuse("metadata is a %T, not an object", v)
	}
	merged := metadata{}
	maps.Copy(merged, stored)
	for key, value := range object {
		s, isString := value.(string)
		if !metadataKey.MatchString(key) || value != nil && !isString {
			o.refuse("metadata has the key %.40q with a %T", key, value)
		}
		if s == "" {
			delete(merged, key)
			continue
		}
		o.chars("metadata."+key, s, 1, 500, unicode.IsControl)
		merged[key] = s
	}
	if len(merged) > 50 {
		o.refuse("metadata would have %d keys", len(merged))
	}
	if len(merged) == 0 {
		return nil
	}
	return merged
}

// expect checks that the answer r says message about want.ID, that want is stored as got, and that get shows it as the
// contract renders a button: the amount with its currency's places, the fee with two, an absent value as null, metadata
// as {} when empty, times in RFC 3339 UTC.
func expect(t *testing.T, e *testEnv, r response, got, want button, message string) {
	t.Helper()
	if message != "" && (r.dataString() != want.ID || r.env.Message != message) {
		t.Errorf("%s\nanswered data %q message %q, want %q %q", r.request, r.dataString(), r.env.Message, want.ID, message)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s\nstored %+v\nwant   %+v", r.request, got, want)
	}
	if message == "" { // refused
		return
	}
	md := map[string]any{}
	for k, v := range want.Metadata {
		md[k] = v
	}
	shown := map[string]any{"id": want.ID, "productName": want.ProductName, "description": want.Description,
		"amount": decimalText(want.AmountMinor, exponents[want.Currency]), "currency": want.Currency,
		"billingInterval": want.BillingInterval, "paymentMethod": want.PaymentMethod, "paymentType": want.PaymentType,
		"isLive": want.IsLive, feeField: decimalText(want.FeeBasisPoints, 2), "metadata": md, "state": "active",
		"version": float64(want.Version), "changeSeq": float64(want.ChangeSeq), "deletedAt": nil,
		"createdAt": want.CreatedAt.Time, "updatedAt": want.UpdatedAt.Time}
	for _, name := range []string{"description", "billingInterval", feeField} { // absent: null
		if shown[name] == "" || name == feeField && want.FeeBasisPoints == 0 {
			shown[name] = nil
		}
	}
	view := e.getView(e.key, want.ID)
	for _, name := range []string{"createdAt", "updatedAt"} { // RFC 3339 UTC, any fraction of a second
		if at, _ := view[name].(string); strings.HasSuffix(at, "Z") {
			view[name], _ = time.Parse(time.RFC3339Nano, at)
		}
	}
	for name, w := range shown {
		if !reflect.DeepEqual(view[name], w) {
			t.Errorf("%s\nget shows %s %#v, want %#v", r.request, name, view[name], w)
		}
	}
	if len(view) != len(shown) {
		t.Errorf("%s\nget shows %d fields, want %d: %v", r.request, len(view), len(shown), view)
	}
}
