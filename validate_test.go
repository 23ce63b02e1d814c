package main

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// m is a body's fields, for short table rows.
type m = map[string]any

// baseButton is what createBody with no changes decodes to.
var baseButton = button{ProductName: "Pro plan", Description: "Monthly access", AmountMinor: 1990, Currency: "USD",
	PaymentMethod: "Stripe", PaymentType: "one_time"}

const (
	notDecimal = `must be a plain decimal number such as "12.50" (no sign, exponent or spaces)`
	tooSmall   = "must be greater than zero"
	nameBidi   = "productName: must not contain control characters or bidirectional controls"
	nameBlank  = "productName: must have at least one letter, digit, punctuation mark or symbol"
	badPeriod  = `billingInterval: must be one of "day", "week", "month", "year"`
	badCode    = `currency: must be a three-letter ISO 4217 code such as "USD"`
)

// checkProblems fails the test unless err is invalid_request with exactly the
// problems ("field: why|field: why"), or nil when there are none.
func checkProblems(t *testing.T, input string, err error, problems string) {
	t.Helper()
	want := map[string]string{}
	for _, p := range strings.FieldsFunc(problems, func(r rune) bool { return r == '|' }) {
		field, why, _ := strings.Cut(p, ": ")
		want[field] = why
	}
	var invalid *apiError
	switch {
	case len(want) == 0 && err != nil:
		t.Errorf("%.200s: got error %v, want none", input, err)
	case len(want) > 0 && (!errors.As(err, &invalid) || invalid.code != "invalid_request"):
		t.Errorf("%.200s: got %v, want invalid_request with %v", input, err, want)
	case len(want) > 0 && !maps.Equal(invalid.fields, want):
		t.Errorf("%.200s: got problems %v, want %v", input, invalid.fields, want)
	}
}

// decodeCreate accepts or refuses each field as the contract says, with the contract's message.
func TestDecodeCreate(t *testing.T) {
	many := m{}
	for i := range 51 {
		many[fmt.Sprint("k", i)] = "v"
	}
	every := func(period any) m { return m{"paymentType": "subscription", "billingInterval": period} }
	connect := func(fee any) m { return m{"paymentMethod": "StripeConnect", feeField: fee} }
	for _, tt := range []struct {
		changes m
		problem string          // "field: why" of a refused body, "" for one accepted
		want    func(b *button) // what an accepted body changes from baseButton
	}{
		{m{}, "", func(b *button) {}},
		// productName and description
		{m{"productName": strings.Repeat("é", 250)}, "", func(b *button) { b.ProductName = strings.Repeat("é", 250) }},
		{m{"productName": strings.Repeat("é", 251)}, "productName: must be at most 250 characters (it has 251)", nil},
		{m{"productName": "  Pro  \n"}, "", func(b *button) { b.ProductName = "Pro" }},
		{m{"productName": " \t "}, "productName: must not be empty", nil},
		{m{"productName": "\u200b\ufeff"}, nameBlank, nil}, {m{"productName": "\u0301\u0302"}, nameBlank, nil},
		{m{"productName": "T\ashirt"}, nameBidi, nil}, {m{"productName": "T\u0085shirt"}, nameBidi, nil},
		{m{"productName": "Pro \u202eplan"}, nameBidi, nil}, {m{"productName": "\u2066Pro\u2069"}, nameBidi, nil},
		{m{"productName": 7}, "productName: must be a string", nil},
		{m{"productName": nil}, "productName: is required", nil}, {m{"productName": omit{}}, "productName: is required", nil},
		{m{"description": strings.Repeat("ü", 5000)}, "", func(b *button) { b.Description = strings.Repeat("ü", 5000) }},
		{m{"description": strings.Repeat("ü", 5001)}, "description: must be at most 5000 characters (it has 5001)", nil},
		{m{"description": "a\tb\r\nc"}, "", func(b *button) { b.Description = "a\tb\r\nc" }},
		{m{"description": "a\x00b"}, "description: must not contain control characters other than tab and line breaks", nil},
		{m{"description": ""}, "", func(b *button) { b.Description = "" }},
		{m{"description": nil}, "", func(b *button) { b.Description = "" }},
		{m{"description": []string{"a"}}, "description: must be a string", nil},
		// amount: FuzzDecimal checks any text, with the accepted values among its seeds; these rows pin the messages
		{m{"amount": "0.00"}, "amount: " + tooSmall, nil},
		{m{"amount": "10.501"}, "amount: cannot be expressed in USD, which has at most 2 decimal places", nil},
		{m{"amount": "1.5", "currency": "JPY"}, "amount: cannot be expressed in JPY, which has no decimal places", nil},
		{m{"amount": "5.0", "currency": "JPY"}, "", func(b *button) { b.AmountMinor, b.Currency = 5, "JPY" }},
		{m{"amount": "10000000000000.01"}, "amount: is above the maximum of 10000000000000.00 USD", nil},
		{m{"amount": strings.Repeat("9", 60)}, "amount: is above the maximum of 10000000000000.00 USD", nil},
		{m{"amount": raw("19.99")}, "", func(b *button) { b.AmountMinor = 1999 }},
		{m{"amount": raw("1e3")}, "amount: " + notDecimal, nil}, {m{"amount": "-1"}, "amount: " + notDecimal, nil},
		{m{"amount": true}, "amount: must be a string or a number", nil},
		{m{"amount": nil}, "amount: is required", nil},
		// currency
		{m{"currency": "uSd"}, "", func(b *button) {}},
		{m{"currency": "XCG"}, "", func(b *button) { b.Currency = "XCG" }},
		{m{"currency": "xau"}, "currency: is a precious metal code, not a chargeable currency", nil},
		{m{"currency": "XTS"}, "currency: is a testing or accounting unit, not a chargeable currency", nil},
		{m{"currency": "BOV"}, "currency: is a fund code, not a chargeable currency", nil},
		{m{"currency": "BGN"}, "currency: is a withdrawn ISO 4217 code, no longer chargeable", nil},
		{m{"currency": "ABC"}, "currency: is not an ISO 4217 currency code", nil},
		{m{"currency": "uſd"}, badCode, nil}, {m{"currency": " USD"}, badCode, nil}, // ToUpper makes uſd USD
		{m{"currency": raw("840")}, "currency: must be a string", nil},
		// paymentType and billingInterval
		{every("Monthly"), "", func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "month" }},
		{every("ANNUALLY"), "", func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "year" }},
		{every(""), "billingInterval: is required when paymentType is subscription", nil},
		{every("fortnight"), badPeriod, nil}, {every("wee\u212a"), badPeriod, nil},
		{m{"billingInterval": "month"}, "billingInterval: must be absent when paymentType is one_time", nil},
		{m{"billingInterval": nil}, "", func(b *button) {}},
		{m{"paymentType": "ONE_TIME"}, `paymentType: must be exactly "one_time"`, nil},
		{m{"paymentType": "recurring"}, `paymentType: must be one of "one_time", "subscription"`, nil},
		// paymentMethod and the fee
		{m{"paymentMethod": "the service"}, "", func(b *button) { b.PaymentMethod = "the service" }},
		{m{"paymentMethod": "stripeconnect"}, `paymentMethod: must be exactly "StripeConnect"`, nil},
		{m{"paymentMethod": "PayPal"}, `paymentMethod: must be one of "the service", "Stripe", "StripeConnect"`, nil},
		{connect(raw("100")), "", func(b *button) { b.PaymentMethod, b.FeeBasisPoints = "StripeConnect", 10000 }},
		{connect("0"), feeField + ": must be between 0.01 and 100", nil},
		{connect("100.01"), feeField + ": must be between 0.01 and 100", nil},
		{connect("2.505"), feeField + ": must have at most 2 decimal places", nil},
		{connect("2.5%"), feeField + ": " + notDecimal, nil},
		{m{"paymentMethod": "StripeConnect"}, feeField + ": is required when paymentMethod is StripeConnect", nil},
		{m{feeField: "x"}, feeField + ": is only allowed when paymentMethod is StripeConnect", nil}, // not read: drop it
		{m{feeField: nil}, "", func(b *button) {}},
		// isLive
		{m{"isLive": true}, "", func(b *button) { b.IsLive = true }},
		{m{"isLive": "true"}, "isLive: must be a boolean", nil},
		{m{"isLive": nil}, "isLive: is required", nil},
		// metadata
		{m{"metadata": m{"orderRef": "A-17", "a.b_c-d": "x", "gone": "", "none": nil}}, "",
			func(b *button) { b.Metadata = metadata{"orderRef": "A-17", "a.b_c-d": "x"} }},
		{m{"metadata": nil}, "", func(b *button) {}},
		{m{"metadata": m{strings.Repeat("k", 41): "v"}}, "metadata: has the key \"" + strings.Repeat("k", 41) +
			"\": a key is 1 to 40 of A-Z a-z 0-9 _ - .", nil},
		{m{"metadata": m{"k": 5}}, "metadata.k: must be a string, or null to remove the key", nil},
		{m{"metadata": m{"k": strings.Repeat("v", 501)}}, "metadata.k: must be at most 500 characters (it has 501)", nil},
		{m{"metadata": m{"k": "a\nb"}}, "metadata.k: must not contain control characters", nil},
		{m{"metadata": many}, "metadata: must have at most 50 keys (it would have 51)", nil},
		{m{"metadata": "k=v"}, "metadata: must be an object of string keys to string values", nil},
	} {
		body := createBody(tt.changes)
		got, err := decodeCreate([]byte(body), "the service")
		checkProblems(t, body, err, tt.problem)
		if tt.want == nil {
			continue
		}
		want := baseButton
		tt.want(&want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%.200s: got %+v, want %+v", body, got, want)
		}
	}
}

// A body that is not one JSON object of known, unrepeated fields is refused, saying where and why.
func TestDecodeBody(t *testing.T) {
	valid := createBody(m{"description": omit{}})
	inner := valid[1 : len(valid)-1] // the valid fields, without braces
	for _, tt := range []struct{ body, problems string }{
		{"", "body: is empty"},
		{" \r\n\t", "body: is empty"},
		{"null", "body: must be a JSON object"},
		{`[` + valid + `]`, "body: must be a JSON object"},
		{`1e999`, "body: must be a JSON object"},
		{`{"a" 1}`, "body: is not valid JSON (at byte 5)"},
		{`{` + inner + `,}`, fmt.Sprintf("body: is not valid JSON (at byte %d)", len(inner)+2)},
		{valid[:20], "body: is not valid JSON (it ends early, at byte 20)"},
		{`{"description": "caf` + "\xe9" + `",` + inner + `}`, "body: is not valid UTF-8"},
		{valid + ` {}`, fmt.Sprintf("body: has data after the JSON object (at byte %d)", len(valid)+1)},
		{valid + " \n", ""},
		{"\n " + valid, ""},
		{`{"applicationFeePercentage": "1",` + inner + `}`,
			`applicationFeePercentage: unknown field; did you mean "ApplicationFeePercentage"?`},
		{`{"colour": "red", "colour": "blue",` + inner + `}`, "colour: unknown field"},
		{`{"\u0061mount": "5",` + inner + `}`, "amount: is given more than once"},
		{`{"description": null, "description": null,` + inner + `}`, "description: is given more than once"},
		// encoding/json reads a lone surrogate as U+FFFD, as any JSON library may
		{`{"description": "a\ud800b",` + inner + `}`, ""},
		{`{"currency": "\ud800",` + strings.Replace(inner, `"currency":"USD",`, "", 1) + `}`,
			badCode},
		{createBody(m{"amount": "-1", "currency": "ZZZ", "productName": " ", "isLive": "yes", "colour": "red"}),
			"amount: " + notDecimal + "|currency: is not an ISO 4217 currency code|productName: must not be empty|" +
				"isLive: must be a boolean|colour: unknown field"},
	} {
		_, err := decodeCreate([]byte(tt.body), "the service")
		checkProblems(t, tt.body, err, tt.problems)
	}
	// FuzzCreate's seeds valid_escapes, valid_emoji_pair and valid_escaped_backslash_u check how escapes read.
	_, err := decodeCreate([]byte(createBody(m{"productName": omit{}, "amount": "0", "isLive": omit{}})), "the service")
	if err == nil || err.Error() != "3 fields are invalid: amount, isLive, productName" {
		t.Errorf("got message %v, want every failing field named", err)
	}
}

// storedButton is an active button as the store would hand it to apply.
var storedButton = button{ID: "btn_01JD0000000000000000000000", Account: "default", ProductName: "T-shirt",
	Description: "Cotton", AmountMinor: 1050, Currency: "USD", PaymentMethod: "Stripe", PaymentType: "one_time",
	State: "active", Version: 3, Metadata: metadata{"a": "1", "b": "2"}}

// An update merges what it names into the stored button, or refuses with every problem and changes nothing.
func TestDecodeUpdateAndApply(t *testing.T) {
	const cannotJPY = "currency: cannot be changed to JPY without a new amount: the stored amount 10.50 cannot be " +
		"expressed in JPY, which has no decimal places"
	in := func(currency string, minor int64) func(*button) {
		return func(b *button) { b.Currency, b.AmountMinor = currency, minor }
	}
	for _, tt := range []struct {
		stored   func(b *button) // the change from storedButton before the update
		body     string
		problems string          // "field: why|field: why", or ""
		want     func(b *button) // the change the update makes when accepted
	}{
		{nil, `{}`, "body: has no field to update", nil},
		{nil, `{"amount":null,"productName":null,"currency":null,"metadata":null}`, "body: has no field to update", nil},
		{nil, `[]`, "body: must be a JSON object", nil},
		{nil, `{"isLive": null, "paymentType": "one_time", "productName": "New"}`,
			"isLive: cannot be changed by update|paymentType: cannot be changed by update", nil},
		{nil, `{"amount": "1", "amount": "2"}`, "amount: is given more than once", nil},
		{nil, `{"productName": "  Hoodie "}`, "", func(b *button) { b.ProductName = "Hoodie" }},
		{nil, `{"productName": ""}`, "productName: must not be empty", nil},
		{nil, `{"description": null}`, "", func(b *button) { b.Description = "" }},
		{nil, `{"description": ""}`, "", func(b *button) { b.Description = "" }},
		{nil, `{"amount": 12.5}`, "", func(b *button) { b.AmountMinor = 1250 }},
		{nil, `{"amount": "0"}`, "amount: " + tooSmall, nil},
		{in("JPY", 500), `{"amount": "10.5"}`, "amount: cannot be expressed in JPY, which has no decimal places", nil},
		{nil, `{"amount":"12.345","currency":"USD"}`,
			"amount: cannot be expressed in USD, which has at most 2 decimal places", nil},
		{nil, `{"amount": "12.345", "currency": "kwd"}`, "", in("KWD", 12345)},
		{nil, `{"currency": "usd"}`, "", func(b *button) {}},
		{nil, `{"currency": "JPY"}`, cannotJPY, nil},
		{in("USD", 1000), `{"currency": "JPY"}`, "", in("JPY", 10)},
		{in("KWD", 1250), `{"currency": "EUR"}`, "", in("EUR", 125)},
		{in("JPY", 1_000_000_000_000_000), `{"currency": "USD"}`, "currency: cannot be changed to USD without a new " +
			"amount: the stored amount 1000000000000000 is above the maximum of 10000000000000.00 USD", nil},
		{in("BGN", 1050), `{"amount":"3"}`, "amount: cannot be expressed in BGN, which is no longer an active currency", nil},
		{in("BGN", 1050), `{"productName": "Kept"}`, "", func(b *button) { b.ProductName = "Kept" }},
		{nil, `{"ApplicationFeePercentage": "2", "currency": "JPY"}`,
			feeField + ": is only allowed when paymentMethod is StripeConnect (this button uses Stripe)|" + cannotJPY, nil},
		{func(b *button) { b.PaymentMethod, b.FeeBasisPoints = "StripeConnect", 250 }, `{"ApplicationFeePercentage":3.75}`,
			"", func(b *button) { b.FeeBasisPoints = 375 }},
		{nil, `{"metadata": {"a": null, "b": "", "c": "3"}}`, "", func(b *button) { b.Metadata = metadata{"c": "3"} }},
		{nil, `{"metadata": {"a": "9"}}`, "", func(b *button) { b.Metadata = metadata{"a": "9", "b": "2"} }},
		{func(b *button) { b.Metadata = nil }, `{"metadata": {}}`, "", func(b *button) {}},
	} {
		stored := storedButton
		stored.Metadata = maps.Clone(storedButton.Metadata)
		if tt.stored != nil {
			tt.stored(&stored)
		}
		got := stored
		apply, err := decodeUpdate([]byte(tt.body))
		if err == nil {
			err = apply.apply(&got)
		}
		checkProblems(t, tt.body, err, tt.problems)
		want := stored // a refused change leaves the button as it was
		if tt.want != nil {
			tt.want(&want)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s on %+v: got %+v, want %+v", tt.body, stored, got, want)
		}
	}
}

// Every currency of the table has an ISO 4217 exponent and none is excluded; zero is zero minor units. (FuzzDecimal
// checks that every amount renders with its currency's places and reads back as the same minor units.)
func TestCurrencyTable(t *testing.T) {
	for code, exp := range currencyExponents {
		if _, excluded := currencyExclusions[code]; excluded || len(code) != 3 || exp != 0 && exp != 2 && exp != 3 {
			t.Errorf("currency %s: exponent %d, excluded %v", code, exp, excluded)
		}
	}
	f := &fields{problems: problems{}}
	if d, _ := parseDecimal("0"); !d.isZero() || f.minorUnits("amount", d, "USD") != 0 || len(f.problems) > 0 {
		t.Errorf(`"0": got zero %v and problems %v, want 0 USD cents`, d.isZero(), f.problems) // was "above the maximum"
	}
}

// A 400 shows a field's name in at most 40 bytes of JSON: what JSON escapes as "?", a longer name cut with "…".
func TestShownName(t *testing.T) {
	for name, want := range map[string]string{
		"amount":                  "amount",
		"a\u0001b<c>&\"d\\\u2028": "a?b?c???d??",
		strings.Repeat("x", 41):   strings.Repeat("x", 39) + "…",
		strings.Repeat("é", 30):   strings.Repeat("é", 19) + "…",
	} {
		if got := shownName(name); got != want {
			t.Errorf("shownName(%q): got %q, want %q", name, got, want)
		}
	}
}
