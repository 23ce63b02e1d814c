package main

// Fuzz targets, held to an oracle: the contract modelled apart from validate.go (of which it reads the ISO 4217 table
// alone, as data). Seeds in testdata/fuzz/ run in every go test; to fuzz: go test -run '^$' -fuzz '^FuzzCreate$' .

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
	buttonID     = regexp.MustCompile(`^btn_[0-9A-HJKMNP-TV-Z]{26}$`)
	updateFields = []string{"productName", "description", "amount", "currency", feeField, "metadata"}
	intervals    = map[string]string{"day": "day", "week": "week", "month": "month", "year": "year",
		"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year"}
)

// FuzzCreate posts any body to create: 413 above 64 KiB, else 200 exactly when the oracle finds nothing to refuse,
// else 400. A refused body stores nothing; an accepted one is stored as the oracle says.
func FuzzCreate(f *testing.F) {
	shared := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared // one server for every input; the copy fails this input's t
		e.t = t
		n, o := e.count(`SELECT count(*) FROM buttons`), &oracle{}
		want := o.create(body)
		r := e.do("POST", "/product-payment/create", e.key, string(body))
		if !o.verdict(t, r, len(body)) {
			if got := e.count(`SELECT count(*) FROM buttons`); got != n {
				t.Errorf("%s\ngot %d buttons after a %d, want %d", r.request, got, r.status, n)
			}
			return
		}
		got := e.stored("acme", r.dataString())
		if !buttonID.MatchString(got.ID) {
			t.Errorf("%s\ngot id %q, want btn_ and 26 of Crockford's base32", r.request, got.ID)
		}
		want.ID, want.State, want.Version = got.ID, "active", 1
		want.CreatedAt, want.UpdatedAt = got.CreatedAt, got.CreatedAt // the same
		expect(t, &e, r, got, want, "created")
	})
}

// FuzzUpdate posts any body to update a button: StripeConnect (a fee may change), 10.50 USD (which JPY cannot hold),
// 49 metadata keys (two more make 51). Refused or "unchanged", it is as it was; "updated", as the oracle says.
func FuzzUpdate(f *testing.F) {
	shared := newTestServer(f)
	md := map[string]string{"orderRef": "A-17"}
	for i := range 48 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	base := createBody(m{"paymentMethod": "StripeConnect", feeField: "2.50", "amount": "10.50", "metadata": md})
	var id string // a button still as base made it: most inputs leave it so, which saves a create each
	f.Fuzz(func(t *testing.T, body []byte) {
		e := *shared
		e.t = t
		if id == "" {
			id = e.create(e.key, base)
		}
		before, o := e.stored("acme", id), &oracle{}
		want := before // update knows edit's names alone: none of those fixed at create
		if in := o.object(body, updateFields...); in != nil && !o.edit(in, &want) {
			o.refuse("the body names nothing to update")
		}
		r := e.do("POST", "/product-payment/update/"+id, e.key, string(body))
		got := e.stored("acme", id)
		if !reflect.DeepEqual(got, before) {
			id = "" // the next input needs a button as base makes it
		}
		switch {
		case !o.verdict(t, r, len(body)):
			expect(t, &e, r, got, before, "")
		case reflect.DeepEqual(want, before):
			expect(t, &e, r, got, before, "unchanged")
		case got.UpdatedAt < before.UpdatedAt: // RFC 3339 in UTC with fixed digits: sorts as the time does
			t.Errorf("%s\ngot updatedAt %q, want none before %q", r.request, got.UpdatedAt, before.UpdatedAt)
		default:
			want.Version, want.UpdatedAt = before.Version+1, got.UpdatedAt
			expect(t, &e, r, got, want, "updated")
		}
	})
}

// expect checks that want is stored as got, with a history row per version; and, unless message is "" (a refusal),
// that r answered message with its id and that get shows it as the contract renders a button.
func expect(t *testing.T, e *testEnv, r response, got, want button, message string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s\ngot stored %+v\nwant       %+v", r.request, got, want)
	}
	if n := e.count(`SELECT count(*) FROM history WHERE button_id = ?`, want.ID); int64(n) != want.Version {
		t.Errorf("%s\ngot %d history rows, want %d", r.request, n, want.Version)
	}
	if message == "" {
		return
	}
	if r.env.Message != message || r.dataString() != want.ID {
		t.Errorf("%s\ngot message %q data %q, want %q %q", r.request, r.env.Message, r.dataString(), message, want.ID)
	}
	text, _ := json.Marshal(want) // a button is stored as get shows it
	var shown map[string]any     // as the view is read: numbers as float64, objects as map[string]any
	json.Unmarshal(text, &shown)
	if view := e.view(e.key, want.ID); !reflect.DeepEqual(view, shown) {
		t.Errorf("%s\ngot get %v\nwant    %v", r.request, view, shown)
	}
}

// text is s as an optional field holds it: nil (JSON null) for "".
func text(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// oracle collects every reason the contract gives to refuse a body; a body with none must be accepted.
type oracle struct{ why []string }

func (o *oracle) refuse(format string, a ...any) { o.why = append(o.why, fmt.Sprintf(format, a...)) }

// verdict checks r, the answer to a body of n bytes, against what the oracle found; it returns whether r is a 200.
func (o *oracle) verdict(t *testing.T, r response, n int) bool {
	t.Helper()
	if n > 64<<10 {
		r.want(t, 413, "payload_too_large")
	} else if len(o.why) == 0 {
		r.want(t, 200, "")
	} else if r.status == 200 {
		t.Fatalf("%s\ngot 200 %s\nwant 400: %s", r.request, r.raw, strings.Join(o.why, "; "))
	} else if r.want(t, 400, "invalid_request"); len(r.env.Errors) == 0 || string(r.env.Data) != `""` {
		t.Errorf("%s\ngot errors %v data %s, want a field named and data \"\"", r.request, r.env.Errors, r.env.Data)
	}
	return r.status == 200
}

// object reads body as one JSON object (json.Valid: whitespace only around it) in valid UTF-8, each name one of
// known and given once, compared decoded: an escape is no way around that. Numbers keep their text.
func (o *oracle) object(body []byte, known ...string) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, _ := dec.Token(); !json.Valid(body) || !utf8.Valid(body) || tok != json.Delim('{') {
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

// create is the button a create body describes, but for what the server gives it (id, state, version, times).
func (o *oracle) create(body []byte) button {
	b := button{Metadata: map[string]string{}}
	in := o.object(body, append(updateFields, "billingInterval", "paymentMethod", "paymentType", "isLive")...)
	if slices.ContainsFunc([]string{"productName", "amount", "currency", "paymentMethod", "paymentType", "isLive"},
		func(name string) bool { return in[name] == nil }) { // absent or null
		o.refuse("a required field is missing")
	}
	b.PaymentMethod, b.PaymentType = o.str(in, "paymentMethod"), o.str(in, "paymentType")
	isLive, isBool := in["isLive"].(bool)
	named := slices.Contains([]string{"the service", "Stripe", "StripeConnect"}, b.PaymentMethod) &&
		slices.Contains([]string{"one_time", "subscription"}, b.PaymentType)
	if b.IsLive = isLive; !named || !isBool { // as named, exactly
		o.refuse("paymentMethod %.40q, paymentType %.40q, isLive %v", b.PaymentMethod, b.PaymentType, in["isLive"])
	}
	interval := ""
	if s := o.str(in, "billingInterval"); s != "" { // "" or null: none
		if interval = intervals[strings.ToLower(s)]; interval == "" || !asciiLetters.MatchString(s) {
			o.refuse("billingInterval %.40q is no spelling of an interval", s)
		}
	}
	if b.BillingInterval = text(interval); (b.PaymentType == "subscription") != (interval != "") {
		o.refuse("paymentType %q with billingInterval %q", b.PaymentType, interval)
	}
	if in[feeField] == nil && b.PaymentMethod == "StripeConnect" {
		o.refuse("%s is required with StripeConnect", feeField)
	}
	o.edit(in, &b)
	return b
}

// edit sets in b the fields create and update share, and reports whether in names any. null leaves a field as it
// is, but for description, which null or "" clears. A new currency without a new amount takes the stored amount.
func (o *oracle) edit(in map[string]any, b *button) (named bool) {
	stored, places := *b, currencyExponents
	if _, given := in["description"]; given {
		named, b.Description = true, text(o.str(in, "description"))
		o.chars("description", o.str(in, "description"), 0, 5000,
			func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) })
	}
	if in["productName"] != nil {
		named, b.ProductName = true, strings.TrimSpace(o.str(in, "productName"))
		o.chars("productName", b.ProductName, 1, 250,
			func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) })
		if !strings.ContainsFunc(b.ProductName,
			func(r rune) bool { return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) }) {
			o.refuse("productName %.40q has no letter, digit, punctuation mark or symbol", b.ProductName)
		}
	}
	if in["currency"] != nil { // ASCII letters: no Unicode case mapping makes a code; no metal or test code
		s := o.str(in, "currency")
		named, b.Currency = true, strings.ToUpper(s)
		if _, ok := places[b.Currency]; !ok || len(s) != 3 || !asciiLetters.MatchString(s) ||
			strings.Contains("XAU XTS XXX", b.Currency) {
			o.refuse("currency %.40q is no three-letter code of a currency a button may charge", s)
		}
	}
	if in["amount"] != nil {
		named, b.Amount = true, decimalText(o.scaled("amount", in["amount"], places[b.Currency], 1e15), places[b.Currency])
	} else if stored.Currency != "" && b.Currency != stored.Currency {
		b.Amount = decimalText(o.scaled("the stored amount", stored.Amount, places[b.Currency], 1e15), places[b.Currency])
	}
	if in[feeField] != nil {
		named, b.Fee = true, text(decimalText(o.scaled(feeField, in[feeField], 2, 10_000), 2)) // 0.01 to 100%
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

// scaled is v, a JSON string or number whose text is a plain decimal, in units of 10^-exp; it must be 1 to limit.
func (o *oracle) scaled(name string, v any, exp int, limit int64) int64 {
	s := fmt.Sprint(v)                 // a string, or a number's text: no other JSON value prints as a decimal
	r, ok := new(big.Rat).SetString(s) // which reads more than plain decimals: hence the pattern
	if !ok || !plainDecimal.MatchString(s) || !r.Mul(r, big.NewRat(int64(math.Pow10(exp)), 1)).IsInt() ||
		r.Sign() == 0 || r.Num().Cmp(big.NewInt(limit)) > 0 {
		o.refuse("%s %.40q (a %T) is not a plain decimal of 1 to %d units of 10^-%d", name, s, v, limit, exp)
		return 0
	}
	return r.Num().Int64()
}

// metadata is stored with v merged in: a string sets its key, null or "" removes it; at most 50 keys remain.
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
		if merged[key] = s; s == "" { // null or "": the key goes
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
