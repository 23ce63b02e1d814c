package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// baseButton is what createBody with no changes decodes to.
var baseButton = button{
	ProductName:   "Pro plan",
	Description:   "Monthly access",
	AmountMinor:   1990,
	Currency:      "USD",
	PaymentMethod: "Stripe",
	PaymentType:   "one_time",
}

// checkFields fails the test unless err is an *invalidError whose fields are
// exactly want, or, when want is empty, err is nil.
func checkFields(t *testing.T, input []byte, err error, want map[string]string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("%s: got error %v, want none", input, err)
		}
		return
	}
	var invalid *apiError
	if !errors.As(err, &invalid) || invalid.code != "invalid_request" {
		t.Errorf("%s: got error %v, want *invalidError with fields %v", input, err, want)
		return
	}
	if !maps.Equal(invalid.fields, want) {
		t.Errorf("%s: got fields %v, want %v", input, invalid.fields, want)
	}
}

const (
	notDecimal = `must be a plain decimal number such as "12.50" (no sign, exponent or spaces)`
	tooSmall   = "must be greater than zero"
)

func TestDecodeCreateAmount(t *testing.T) {
	tests := []struct {
		name     string
		amount   any // string, json.RawMessage (a JSON number) or omit{}
		currency string
		want     int64
		why      string // the "amount" problem; "" when valid
	}{
		{"zero", "0", "USD", 0, tooSmall},
		{"zero with decimals", "0.00", "USD", 0, tooSmall},
		{"smallest cent", "0.01", "USD", 1, ""},
		{"one yen", "1", "JPY", 1, ""},
		{"fraction of a yen", "1.5", "JPY", 0, "cannot be expressed in JPY, which has no decimal places"},
		{"yen with zero fraction", "5.0", "JPY", 5, ""},
		{"three-decimal dinar", "1.250", "KWD", 1250, ""},
		{"fourth dinar decimal", "1.2501", "KWD", 0, "cannot be expressed in KWD, which has at most 3 decimal places"},
		{"trailing zeros beyond cents", "10.500", "USD", 1050, ""},
		{"tenth of a cent", "10.501", "USD", 0, "cannot be expressed in USD, which has at most 2 decimal places"},
		{"below a cent", "0.001", "USD", 0, "cannot be expressed in USD, which has at most 2 decimal places"},
		{"leading zeros", "007.50", "USD", 750, ""},
		{"exponent", "1e3", "USD", 0, notDecimal},
		{"minus sign", "-1", "USD", 0, notDecimal},
		{"plus sign", "+1", "USD", 0, notDecimal},
		{"leading space", " 1", "USD", 0, notDecimal},
		{"trailing space", "1 ", "USD", 0, notDecimal},
		{"leading dot", ".5", "USD", 0, notDecimal},
		{"trailing dot", "5.", "USD", 0, notDecimal},
		{"two dots", "1.2.3", "USD", 0, notDecimal},
		{"thousands separator", "1,000", "USD", 0, notDecimal},
		{"empty string", "", "USD", 0, notDecimal},
		{"fullwidth digit", "１", "USD", 0, notDecimal},
		{"maximum in cents", "10000000000000.00", "USD", 1_000_000_000_000_000, ""},
		{"one cent over maximum", "10000000000000.01", "USD", 0, "is above the maximum of 10000000000000.00 USD"},
		{"maximum in yen", "1000000000000000", "JPY", 1_000_000_000_000_000, ""},
		{"one yen over maximum", "1000000000000001", "JPY", 0, "is above the maximum of 1000000000000000 JPY"},
		{"maximum in fils", "1000000000000.000", "KWD", 1_000_000_000_000_000, ""},
		{"sixty nines", strings.Repeat("9", 60), "USD", 0, "is above the maximum of 10000000000000.00 USD"},
		{"sixty digits of leading zeros", strings.Repeat("0", 59) + "1", "USD", 100, ""},
		{"sixty digits of trailing zeros", "1." + strings.Repeat("0", 58), "USD", 100, ""},
		{"sixty digits of fraction", "0." + strings.Repeat("0", 57) + "1", "USD", 0, "cannot be expressed in USD, which has at most 2 decimal places"},
		{"number", json.RawMessage(`19.90`), "USD", 1990, ""},
		{"number with trailing zeros", json.RawMessage(`10.500`), "USD", 1050, ""},
		{"number in yen", json.RawMessage(`500`), "JPY", 500, ""},
		{"number zero", json.RawMessage(`0`), "USD", 0, tooSmall},
		{"number with exponent", json.RawMessage(`1e3`), "USD", 0, notDecimal},
		{"negative number", json.RawMessage(`-1`), "USD", 0, notDecimal},
		{"boolean", json.RawMessage(`true`), "USD", 0, "must be a string or a number"},
		{"object", json.RawMessage(`{"value":"1"}`), "USD", 0, "must be a string or a number"},
		{"null", nil, "USD", 0, "is required"},
		{"missing", omit{}, "USD", 0, "is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(createBody(map[string]any{"amount": tt.amount, "currency": tt.currency}))
			b, err := decodeCreate(body, "the service")
			if tt.why != "" {
				checkFields(t, body, err, map[string]string{"amount": tt.why})
				return
			}
			checkFields(t, body, err, nil)
			if b.AmountMinor != tt.want || b.Currency != tt.currency {
				t.Errorf("%s: got %d %s, want %d %s", body, b.AmountMinor, b.Currency, tt.want, tt.currency)
			}
		})
	}
}

func TestDecodeCreateFee(t *testing.T) {
	const between = "must be between 0.01 and 100"
	tests := []struct {
		name   string
		method string
		fee    any // string, json.RawMessage, nil (null) or omit{}
		want   int64
		why    string // the ApplicationFeePercentage problem; "" when valid
	}{
		{"smallest", "StripeConnect", "0.01", 1, ""},
		{"whole hundred", "StripeConnect", "100", 10000, ""},
		{"hundred with decimals", "StripeConnect", "100.00", 10000, ""},
		{"zero", "StripeConnect", "0", 0, between},
		{"zero with decimals", "StripeConnect", "0.00", 0, between},
		{"just over a hundred", "StripeConnect", "100.01", 0, between},
		{"trailing zero beyond two decimals", "StripeConnect", "2.500", 250, ""},
		{"third decimal", "StripeConnect", "2.505", 0, "must have at most 2 decimal places"},
		{"thousandth", "StripeConnect", "0.001", 0, "must have at most 2 decimal places"},
		{"number", "StripeConnect", json.RawMessage(`2.5`), 250, ""},
		{"number with exponent", "StripeConnect", json.RawMessage(`2e1`), 0, notDecimal},
		{"percent sign", "StripeConnect", "2.5%", 0, notDecimal},
		{"boolean", "StripeConnect", json.RawMessage(`false`), 0, "must be a string or a number"},
		{"missing with StripeConnect", "StripeConnect", omit{}, 0, "is required when paymentMethod is StripeConnect"},
		{"null with StripeConnect", "StripeConnect", nil, 0, "is required when paymentMethod is StripeConnect"},
		{"given with Stripe", "Stripe", "2.50", 0, "is only allowed when paymentMethod is StripeConnect"},
		{"given with the service", "the service", "2.50", 0, "is only allowed when paymentMethod is StripeConnect"},
		{"null with Stripe", "Stripe", nil, 0, ""},
		{"missing with Stripe", "Stripe", omit{}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(createBody(map[string]any{"paymentMethod": tt.method, feeField: tt.fee}))
			b, err := decodeCreate(body, "the service")
			if tt.why != "" {
				checkFields(t, body, err, map[string]string{feeField: tt.why})
				return
			}
			checkFields(t, body, err, nil)
			if b.FeeBasisPoints != tt.want || b.PaymentMethod != tt.method {
				t.Errorf("%s: got fee %d with %s, want %d with %s", body, b.FeeBasisPoints, b.PaymentMethod, tt.want, tt.method)
			}
		})
	}
}

func TestDecodeCreateCurrency(t *testing.T) {
	const (
		notCode = `must be a three-letter ISO 4217 code such as "USD"`
		unknown = "is not an ISO 4217 currency code"
	)
	tests := []struct {
		currency any
		want     string
		minor    int64  // of the amount "1"
		why      string // the currency problem; "" when valid
	}{
		{"USD", "USD", 100, ""},
		{"usd", "USD", 100, ""},
		{"uSd", "USD", 100, ""},
		{"JPY", "JPY", 1, ""},
		{"KWD", "KWD", 1000, ""},
		{"XCG", "XCG", 100, ""},
		{"ZWG", "ZWG", 100, ""},
		{"VED", "VED", 100, ""},
		{"CLP", "CLP", 1, ""},
		{"XAU", "", 0, "is a precious metal code, not a chargeable currency"},
		{"xag", "", 0, "is a precious metal code, not a chargeable currency"},
		{"XTS", "", 0, "is a testing or accounting unit, not a chargeable currency"},
		{"XXX", "", 0, "is a testing or accounting unit, not a chargeable currency"},
		{"XDR", "", 0, "is a testing or accounting unit, not a chargeable currency"},
		{"BOV", "", 0, "is a fund code, not a chargeable currency"},
		{"USN", "", 0, "is a fund code, not a chargeable currency"},
		{"HRK", "", 0, "is a withdrawn ISO 4217 code, no longer chargeable"},
		{"ANG", "", 0, "is a withdrawn ISO 4217 code, no longer chargeable"},
		{"BGN", "", 0, "is a withdrawn ISO 4217 code, no longer chargeable"},
		{"ABC", "", 0, unknown},
		{"US", "", 0, notCode},
		{"USDD", "", 0, notCode},
		{"U$D", "", 0, notCode},
		{" USD", "", 0, notCode},
		{"uſd", "", 0, notCode}, // strings.ToUpper would make it "USD"
		{"", "", 0, notCode},
		{json.RawMessage(`840`), "", 0, "must be a string"},
		{nil, "", 0, "is required"},
		{omit{}, "", 0, "is required"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.currency), func(t *testing.T) {
			body := []byte(createBody(map[string]any{"currency": tt.currency, "amount": "1"}))
			b, err := decodeCreate(body, "the service")
			if tt.why != "" {
				checkFields(t, body, err, map[string]string{"currency": tt.why})
				return
			}
			checkFields(t, body, err, nil)
			if b.Currency != tt.want || b.AmountMinor != tt.minor {
				t.Errorf("%s: got %d %s, want %d %s", body, b.AmountMinor, b.Currency, tt.minor, tt.want)
			}
		})
	}
}

func TestCurrencyTableIsConsistent(t *testing.T) {
	for code, exp := range currencyExponents {
		if len(code) != 3 || strings.ToUpper(code) != code {
			t.Errorf("currency %q: got a malformed code, want three upper-case letters", code)
		}
		if exp != 0 && exp != 2 && exp != 3 {
			t.Errorf("currency %s: got exponent %d, want 0, 2 or 3", code, exp)
		}
		if why, excluded := currencyExclusions[code]; excluded {
			t.Errorf("currency %s: got both active and excluded (%s), want one", code, why)
		}
	}
	for code, want := range map[string]int{"USD": 2, "EUR": 2, "JPY": 0, "KRW": 0, "ISK": 0, "KWD": 3, "BHD": 3, "TND": 3, "XCG": 2} {
		if got, ok := currencyExponents[code]; !ok || got != want {
			t.Errorf("currency %s: got exponent %d (listed %v), want %d", code, got, ok, want)
		}
	}
}

func TestFormatAmount(t *testing.T) {
	tests := []struct {
		minor    int64
		currency string
		want     string
	}{
		{1990, "USD", "19.90"},
		{1, "USD", "0.01"},
		{10, "USD", "0.10"},
		{100, "USD", "1.00"},
		{500, "JPY", "500"},
		{1, "JPY", "1"},
		{1250, "KWD", "1.250"},
		{5, "KWD", "0.005"},
		{1_000_000_000_000_000, "USD", "10000000000000.00"},
		{1_000_000_000_000_000, "JPY", "1000000000000000"},
	}
	for _, tt := range tests {
		if got := formatAmount(tt.minor, tt.currency); got != tt.want {
			t.Errorf("formatAmount(%d, %s): got %q, want %q", tt.minor, tt.currency, got, tt.want)
		}
		// Round trip: what the API shows is accepted back as the same amount.
		d, ok := parseDecimal(tt.want)
		back, why := minorUnits(d, tt.currency)
		if !ok || why != "" || back != tt.minor {
			t.Errorf("parse %q %s: got %d (%q), want %d", tt.want, tt.currency, back, why, tt.minor)
		}
	}
}

func TestFormatFee(t *testing.T) {
	tests := []struct {
		basisPoints int64
		want        string
	}{
		{1, "0.01"},
		{50, "0.50"},
		{250, "2.50"},
		{1000, "10.00"},
		{10000, "100.00"},
	}
	for _, tt := range tests {
		if got := formatFee(tt.basisPoints); got != tt.want {
			t.Errorf("formatFee(%d): got %q, want %q", tt.basisPoints, got, tt.want)
		}
		body := []byte(createBody(map[string]any{"paymentMethod": "StripeConnect", feeField: tt.want}))
		b, err := decodeCreate(body, "the service")
		if err != nil || b.FeeBasisPoints != tt.basisPoints {
			t.Errorf("%s: got fee %d (%v), want %d", body, b.FeeBasisPoints, err, tt.basisPoints)
		}
	}
}

func TestDecodeCreateFieldRules(t *testing.T) {
	tests := []struct {
		name     string
		provider string // "" means "the service"
		changes  map[string]any
		want     func(b *button)   // the change from baseButton when valid
		fields   map[string]string // the problems when invalid
	}{
		{name: "base body is valid", want: func(b *button) {}},

		{name: "productName of 250 runes", changes: map[string]any{"productName": strings.Repeat("a", 250)},
			want: func(b *button) { b.ProductName = strings.Repeat("a", 250) }},
		{name: "productName of 251 runes", changes: map[string]any{"productName": strings.Repeat("a", 251)},
			fields: map[string]string{"productName": "must be at most 250 characters (it has 251)"}},
		{name: "productName of 250 three-byte runes", changes: map[string]any{"productName": strings.Repeat("日", 250)},
			want: func(b *button) { b.ProductName = strings.Repeat("日", 250) }},
		{name: "productName of 251 two-byte runes", changes: map[string]any{"productName": strings.Repeat("é", 251)},
			fields: map[string]string{"productName": "must be at most 250 characters (it has 251)"}},
		{name: "productName trimmed before counting", changes: map[string]any{"productName": "  " + strings.Repeat("a", 250) + "\n"},
			want: func(b *button) { b.ProductName = strings.Repeat("a", 250) }},
		{name: "productName only spaces", changes: map[string]any{"productName": " \t "},
			fields: map[string]string{"productName": "must not be empty"}},
		{name: "productName empty", changes: map[string]any{"productName": ""},
			fields: map[string]string{"productName": "must not be empty"}},
		{name: "productName with a bell", changes: map[string]any{"productName": "T\ashirt"},
			fields: map[string]string{"productName": "must not contain control characters"}},
		{name: "productName with an inner newline", changes: map[string]any{"productName": "T\nshirt"},
			fields: map[string]string{"productName": "must not contain control characters"}},
		{name: "productName with a C1 control", changes: map[string]any{"productName": "T\u0085shirt"},
			fields: map[string]string{"productName": "must not contain control characters"}},
		{name: "productName a number", changes: map[string]any{"productName": 7},
			fields: map[string]string{"productName": "must be a string"}},
		{name: "productName null", changes: map[string]any{"productName": nil},
			fields: map[string]string{"productName": "is required"}},
		{name: "productName missing", changes: map[string]any{"productName": omit{}},
			fields: map[string]string{"productName": "is required"}},

		{name: "description of 5000 runes", changes: map[string]any{"description": strings.Repeat("ü", 5000)},
			want: func(b *button) { b.Description = strings.Repeat("ü", 5000) }},
		{name: "description of 5001 runes", changes: map[string]any{"description": strings.Repeat("ü", 5001)},
			fields: map[string]string{"description": "must be at most 5000 characters (it has 5001)"}},
		{name: "description with tabs and line breaks", changes: map[string]any{"description": "a\tb\r\nc\n"},
			want: func(b *button) { b.Description = "a\tb\r\nc\n" }},
		{name: "description with a NUL", changes: map[string]any{"description": "a\x00b"},
			fields: map[string]string{"description": "must not contain control characters other than tab and line breaks"}},
		{name: "description empty", changes: map[string]any{"description": ""}, want: func(b *button) { b.Description = "" }},
		{name: "description null", changes: map[string]any{"description": nil}, want: func(b *button) { b.Description = "" }},
		{name: "description an array", changes: map[string]any{"description": []string{"a"}},
			fields: map[string]string{"description": "must be a string"}},

		{name: "subscription by month", changes: map[string]any{"paymentType": "subscription", "billingInterval": "month"},
			want: func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "month" }},
		{name: "subscription Monthly", changes: map[string]any{"paymentType": "subscription", "billingInterval": "Monthly"},
			want: func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "month" }},
		{name: "subscription ANNUALLY", changes: map[string]any{"paymentType": "subscription", "billingInterval": "ANNUALLY"},
			want: func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "year" }},
		{name: "subscription daily", changes: map[string]any{"paymentType": "subscription", "billingInterval": "daily"},
			want: func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "day" }},
		{name: "subscription Week", changes: map[string]any{"paymentType": "subscription", "billingInterval": "Week"},
			want: func(b *button) { b.PaymentType, b.BillingInterval = "subscription", "week" }},
		{name: "subscription without interval", changes: map[string]any{"paymentType": "subscription"},
			fields: map[string]string{"billingInterval": "is required when paymentType is subscription"}},
		{name: "subscription with empty interval", changes: map[string]any{"paymentType": "subscription", "billingInterval": ""},
			fields: map[string]string{"billingInterval": "is required when paymentType is subscription"}},
		{name: "subscription with null interval", changes: map[string]any{"paymentType": "subscription", "billingInterval": nil},
			fields: map[string]string{"billingInterval": "is required when paymentType is subscription"}},
		{name: "subscription fortnightly", changes: map[string]any{"paymentType": "subscription", "billingInterval": "fortnight"},
			fields: map[string]string{"billingInterval": `must be one of "day", "week", "month", "year"`}},
		{name: "one_time with interval", changes: map[string]any{"billingInterval": "month"},
			fields: map[string]string{"billingInterval": "must be absent when paymentType is one_time"}},
		{name: "one_time with empty interval", changes: map[string]any{"billingInterval": ""}, want: func(b *button) {}},
		{name: "one_time with null interval", changes: map[string]any{"billingInterval": nil}, want: func(b *button) {}},
		{name: "bad paymentType skips the interval cross-check", changes: map[string]any{"paymentType": "recurring"},
			fields: map[string]string{"paymentType": `must be one of "one_time", "subscription"`}},
		{name: "paymentType in upper case", changes: map[string]any{"paymentType": "ONE_TIME"},
			fields: map[string]string{"paymentType": `must be exactly "one_time"`}},

		{name: "paymentMethod the service", changes: map[string]any{"paymentMethod": "the service"},
			want: func(b *button) { b.PaymentMethod = "the service" }},
		{name: "paymentMethod StripeConnect", changes: map[string]any{"paymentMethod": "StripeConnect", feeField: "2.5"},
			want: func(b *button) { b.PaymentMethod, b.FeeBasisPoints = "StripeConnect", 250 }},
		{name: "paymentMethod in lower case", changes: map[string]any{"paymentMethod": "stripeconnect"},
			fields: map[string]string{"paymentMethod": `must be exactly "StripeConnect"`}},
		{name: "paymentMethod unknown", changes: map[string]any{"paymentMethod": "PayPal"},
			fields: map[string]string{"paymentMethod": `must be one of "the service", "Stripe", "StripeConnect"`}},
		{name: "paymentMethod empty", changes: map[string]any{"paymentMethod": ""},
			fields: map[string]string{"paymentMethod": `must be one of "the service", "Stripe", "StripeConnect"`}},
		{name: "own provider name", provider: "Acme Pay", changes: map[string]any{"paymentMethod": "Acme Pay"},
			want: func(b *button) { b.PaymentMethod = "Acme Pay" }},
		{name: "default name with another provider", provider: "Acme Pay", changes: map[string]any{"paymentMethod": "the service"},
			fields: map[string]string{"paymentMethod": `must be one of "Acme Pay", "Stripe", "StripeConnect"`}},
		{name: "own provider name in lower case", provider: "Acme Pay", changes: map[string]any{"paymentMethod": "acme pay"},
			fields: map[string]string{"paymentMethod": `must be exactly "Acme Pay"`}},

		{name: "isLive true", changes: map[string]any{"isLive": true}, want: func(b *button) { b.IsLive = true }},
		{name: "isLive as a string", changes: map[string]any{"isLive": "true"},
			fields: map[string]string{"isLive": "must be a boolean"}},
		{name: "isLive as a number", changes: map[string]any{"isLive": 1},
			fields: map[string]string{"isLive": "must be a boolean"}},
		{name: "isLive null", changes: map[string]any{"isLive": nil},
			fields: map[string]string{"isLive": "is required"}},

		{name: "fee checked when paymentMethod is invalid", changes: map[string]any{"paymentMethod": "paypal", feeField: "2.505"},
			fields: map[string]string{"paymentMethod": `must be one of "the service", "Stripe", "StripeConnect"`, feeField: "must have at most 2 decimal places"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			provider := tt.provider
			if provider == "" {
				provider = "the service"
			}
			body := []byte(createBody(tt.changes))
			got, err := decodeCreate(body, provider)
			checkFields(t, body, err, tt.fields)
			if tt.want == nil {
				return
			}
			want := baseButton
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: got %+v, want %+v", body, got, want)
			}
		})
	}
}

func TestDecodeCreateBody(t *testing.T) {
	valid := createBody(map[string]any{"description": omit{}})
	inner := valid[1 : len(valid)-1] // the valid fields, without braces
	tests := []struct {
		name   string
		body   string
		fields map[string]string
	}{
		{"empty", "", map[string]string{"body": "is empty"}},
		{"only whitespace", " \r\n\t", map[string]string{"body": "is empty"}},
		{"null", "null", map[string]string{"body": "must be a JSON object"}},
		{"array", `[` + valid + `]`, map[string]string{"body": "must be a JSON object"}},
		{"string", `"x"`, map[string]string{"body": "must be a JSON object"}},
		{"huge number", `1e999`, map[string]string{"body": "must be a JSON object"}},
		{"missing colon", `{"a" 1}`, map[string]string{"body": "is not valid JSON (at byte 5)"}},
		{"trailing comma", `{` + inner + `,}`, map[string]string{"body": fmt.Sprintf("is not valid JSON (at byte %d)", len(inner)+2)}},
		{"bad literal", `{"isLive": tru}`, map[string]string{"body": "is not valid JSON (at byte 14)"}},
		{"cut short", valid[:20], map[string]string{"body": "is not valid JSON (it ends early, at byte 20)"}},
		{"invalid UTF-8", `{"description": "caf` + "\xe9" + `",` + inner + `}`, map[string]string{"body": "is not valid UTF-8"}},
		{"second object", valid + ` {}`, map[string]string{"body": fmt.Sprintf("has data after the JSON object (at byte %d)", len(valid)+1)}},
		{"trailing text", valid + "\nx", map[string]string{"body": fmt.Sprintf("has data after the JSON object (at byte %d)", len(valid)+1)}},
		{"trailing whitespace", valid + " \n", nil},
		{"leading whitespace", "\n " + valid, nil},

		{"unknown field in wrong case", `{"applicationFeePercentage": "1",` + inner + `}`,
			map[string]string{"applicationFeePercentage": `unknown field; did you mean "ApplicationFeePercentage"?`}},
		{"unknown field", `{"colour": "red",` + inner + `}`, map[string]string{"colour": "unknown field"}},
		{"unknown field given twice", `{"colour": "red", "colour": "blue",` + inner + `}`, map[string]string{"colour": "unknown field"}},
		{"duplicate field", `{"amount": "5",` + inner + `}`, map[string]string{"amount": "is given more than once"}},
		{"duplicate field by escape", `{"\u0061mount": "5",` + inner + `}`, map[string]string{"amount": "is given more than once"}},
		{"duplicate null", `{"description": null, "description": null,` + inner + `}`, map[string]string{"description": "is given more than once"}},

		// encoding/json reads a lone surrogate as U+FFFD, as every JSON library may.
		{"lone high surrogate", `{"description": "a\ud800b",` + inner + `}`, nil},
		{"lone low surrogate", `{"description": "\udc00",` + inner + `}`, nil},
		{"surrogate in the currency", `{"currency": "\ud800",` + strings.Replace(inner, `"currency":"USD",`, "", 1) + `}`,
			map[string]string{"currency": `must be a three-letter ISO 4217 code such as "USD"`}},
		{"surrogate pair", `{"description": "\ud83d\ude00",` + inner + `}`, nil},
		{"escaped backslash before u", `{"description": "\\ud800",` + inner + `}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeCreate([]byte(tt.body), "the service")
			checkFields(t, []byte(tt.body), err, tt.fields)
		})
	}
}

func TestDecodeCreateKeepsEscapedText(t *testing.T) {
	body := []byte(`{"description": "smile \ud83d\ude00, \\ud800 is text", "productName": "\u00e9t\u00e9",` +
		`"amount": "1", "currency": "EUR", "paymentMethod": "Stripe", "paymentType": "one_time", "isLive": true}`)
	b, err := decodeCreate(body, "the service")
	if err != nil {
		t.Fatalf("%s: got error %v, want none", body, err)
	}
	if want := `smile 😀, \ud800 is text`; b.Description != want {
		t.Errorf("%s: got description %q, want %q", body, b.Description, want)
	}
	if want := "été"; b.ProductName != want {
		t.Errorf("%s: got productName %q, want %q", body, b.ProductName, want)
	}
}

func TestDecodeCreateReportsEveryProblem(t *testing.T) {
	tests := []struct {
		name    string
		changes map[string]any
		fields  map[string]string
		message string
	}{
		{"one problem", map[string]any{"amount": "0"},
			map[string]string{"amount": tooSmall}, "amount must be greater than zero"},
		{"amount syntax with an unknown currency", map[string]any{"amount": "-1", "currency": "ZZZ"},
			map[string]string{"amount": notDecimal, "currency": "is not an ISO 4217 currency code"},
			"2 fields are invalid: amount, currency"},
		{"zero amount with a metal", map[string]any{"amount": "0", "currency": "XAU"},
			map[string]string{"amount": tooSmall, "currency": "is a precious metal code, not a chargeable currency"},
			"2 fields are invalid: amount, currency"},
		{"five at once", map[string]any{"amount": "abc", "currency": "XXX", "productName": " ", "isLive": "yes", "colour": "red"},
			map[string]string{
				"amount":      notDecimal,
				"currency":    "is a testing or accounting unit, not a chargeable currency",
				"productName": "must not be empty",
				"isLive":      "must be a boolean",
				"colour":      "unknown field",
			},
			"5 fields are invalid: amount, colour, currency, isLive, productName"},
		{"everything missing", map[string]any{"productName": omit{}, "amount": omit{}, "currency": omit{},
			"paymentMethod": omit{}, "paymentType": omit{}, "isLive": omit{}},
			map[string]string{
				"productName": "is required", "amount": "is required", "currency": "is required",
				"paymentMethod": "is required", "paymentType": "is required", "isLive": "is required",
			},
			"6 fields are invalid: amount, currency, isLive, paymentMethod, paymentType, productName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(createBody(tt.changes))
			_, err := decodeCreate(body, "the service")
			checkFields(t, body, err, tt.fields)
			if err != nil && err.Error() != tt.message {
				t.Errorf("%s: got message %q, want %q", body, err.Error(), tt.message)
			}
		})
	}
}

func TestBodyProblemMessage(t *testing.T) {
	for body, want := range map[string]string{
		`{"a" 1}`: "body is not valid JSON (at byte 5)",
		``:        "body is empty",
		`{}`:      "body has no field to update",
	} {
		_, err := decodeUpdate([]byte(body))
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %q", body, err, want)
		}
	}
}

// storedButton is an active button as the store would hand it to apply.
var storedButton = button{
	ID:            "btn_01JD0000000000000000000000",
	Account:       "default",
	ProductName:   "T-shirt",
	Description:   "Cotton",
	AmountMinor:   1050,
	Currency:      "USD",
	PaymentMethod: "Stripe",
	PaymentType:   "one_time",
	State:         "active",
	Version:       3,
}

func TestDecodeUpdateAndApply(t *testing.T) {
	tests := []struct {
		name   string
		stored func(b *button) // the change from storedButton before the update
		body   string
		want   func(b *button)   // the change the update makes when valid
		fields map[string]string // the problems from decodeUpdate or apply
	}{
		{name: "empty object", body: `{}`, fields: map[string]string{"body": "has no field to update"}},
		{name: "only nulls", body: `{"amount": null, "productName": null, "currency": null, "ApplicationFeePercentage": null}`,
			fields: map[string]string{"body": "has no field to update"}},
		{name: "empty body", body: ``, fields: map[string]string{"body": "is empty"}},
		{name: "not an object", body: `[]`, fields: map[string]string{"body": "must be a JSON object"}},
		{name: "paymentMethod", body: `{"paymentMethod": "Stripe"}`,
			fields: map[string]string{"paymentMethod": "cannot be changed by update"}},
		{name: "isLive null", body: `{"isLive": null, "productName": "New"}`,
			fields: map[string]string{"isLive": "cannot be changed by update"}},
		{name: "every fixed field", body: `{"paymentMethod": "x", "paymentType": "one_time", "isLive": true, "billingInterval": "month"}`,
			fields: map[string]string{"paymentMethod": "cannot be changed by update", "paymentType": "cannot be changed by update",
				"isLive": "cannot be changed by update", "billingInterval": "cannot be changed by update"}},
		{name: "unknown field", body: `{"colour": "red"}`, fields: map[string]string{"colour": "unknown field"}},
		{name: "fee in wrong case", body: `{"applicationFeePercentage": "1"}`,
			fields: map[string]string{"applicationFeePercentage": `unknown field; did you mean "ApplicationFeePercentage"?`}},
		{name: "duplicate", body: `{"amount": "1", "amount": "2"}`, fields: map[string]string{"amount": "is given more than once"}},
		{name: "lone surrogate", body: `{"productName": "\udfff"}`, want: func(b *button) { b.ProductName = "\uFFFD" }},

		{name: "productName trimmed", body: `{"productName": "  Hoodie "}`, want: func(b *button) { b.ProductName = "Hoodie" }},
		{name: "productName empty", body: `{"productName": ""}`, fields: map[string]string{"productName": "must not be empty"}},
		{name: "description set", body: `{"description": "Wool"}`, want: func(b *button) { b.Description = "Wool" }},
		{name: "description cleared by null", body: `{"description": null}`, want: func(b *button) { b.Description = "" }},
		{name: "description cleared by empty", body: `{"description": ""}`, want: func(b *button) { b.Description = "" }},
		{name: "description too long", body: `{"description": "` + strings.Repeat("x", 5001) + `"}`,
			fields: map[string]string{"description": "must be at most 5000 characters (it has 5001)"}},

		{name: "amount", body: `{"amount": "12"}`, want: func(b *button) { b.AmountMinor = 1200 }},
		{name: "amount as a number", body: `{"amount": 12.5}`, want: func(b *button) { b.AmountMinor = 1250 }},
		{name: "amount zero", body: `{"amount": "0"}`, fields: map[string]string{"amount": tooSmall}},
		{name: "amount null with a name", body: `{"amount": null, "productName": "New"}`, want: func(b *button) { b.ProductName = "New" }},
		{name: "amount too precise for the stored currency", stored: func(b *button) { b.Currency, b.AmountMinor = "JPY", 500 },
			body: `{"amount": "10.5"}`, fields: map[string]string{"amount": "cannot be expressed in JPY, which has no decimal places"}},
		{name: "amount in the stored dinar", stored: func(b *button) { b.Currency, b.AmountMinor = "KWD", 500 },
			body: `{"amount": "1.234"}`, want: func(b *button) { b.AmountMinor = 1234 }},
		{name: "amount too precise for the new currency", body: `{"amount": "12.345", "currency": "USD"}`,
			fields: map[string]string{"amount": "cannot be expressed in USD, which has at most 2 decimal places"}},
		{name: "amount with new currency", body: `{"amount": "12.345", "currency": "kwd"}`,
			want: func(b *button) { b.AmountMinor, b.Currency = 12345, "KWD" }},
		{name: "amount with new yen", body: `{"amount": "1500", "currency": "JPY"}`,
			want: func(b *button) { b.AmountMinor, b.Currency = 1500, "JPY" }},

		{name: "currency excluded", body: `{"currency": "xau"}`,
			fields: map[string]string{"currency": "is a precious metal code, not a chargeable currency"}},
		{name: "same currency in lower case", body: `{"currency": "usd"}`, want: func(b *button) {}},
		{name: "cents to yen cannot rescale", body: `{"currency": "JPY"}`,
			fields: map[string]string{"currency": "cannot be changed to JPY without a new amount: the stored amount 10.50 cannot be expressed in JPY, which has no decimal places"}},
		{name: "whole dollars to yen", stored: func(b *button) { b.AmountMinor = 1000 }, body: `{"currency": "JPY"}`,
			want: func(b *button) { b.AmountMinor, b.Currency = 10, "JPY" }},
		{name: "whole dollars to dinar", stored: func(b *button) { b.AmountMinor = 1000 }, body: `{"currency": "KWD"}`,
			want: func(b *button) { b.AmountMinor, b.Currency = 10000, "KWD" }},
		{name: "dinar to euro", stored: func(b *button) { b.Currency, b.AmountMinor = "KWD", 1250 }, body: `{"currency": "EUR"}`,
			want: func(b *button) { b.AmountMinor, b.Currency = 125, "EUR" }},
		{name: "maximum yen to dollars", stored: func(b *button) { b.Currency, b.AmountMinor = "JPY", 1_000_000_000_000_000 },
			body:   `{"currency": "USD"}`,
			fields: map[string]string{"currency": "cannot be changed to USD without a new amount: the stored amount 1000000000000000 is above the maximum of 10000000000000.00 USD"}},
		{name: "withdrawn stored currency", stored: func(b *button) { b.Currency = "BGN" }, body: `{"amount": "3"}`,
			fields: map[string]string{"amount": "cannot be expressed in BGN, which is no longer an active currency"}},

		{name: "fee on a Stripe button", body: `{"ApplicationFeePercentage": "2"}`,
			fields: map[string]string{feeField: "is only allowed when paymentMethod is StripeConnect (this button uses Stripe)"}},
		{name: "fee on a StripeConnect button", stored: func(b *button) { b.PaymentMethod, b.FeeBasisPoints = "StripeConnect", 250 },
			body: `{"ApplicationFeePercentage": 3.75}`, want: func(b *button) { b.FeeBasisPoints = 375 }},
		{name: "fee out of range", stored: func(b *button) { b.PaymentMethod, b.FeeBasisPoints = "StripeConnect", 250 },
			body: `{"ApplicationFeePercentage": "100.01"}`, fields: map[string]string{feeField: "must be between 0.01 and 100"}},
		{name: "several problems against the stored button", body: `{"productName": "New", "currency": "JPY", "ApplicationFeePercentage": "1"}`,
			fields: map[string]string{
				"currency": "cannot be changed to JPY without a new amount: the stored amount 10.50 cannot be expressed in JPY, which has no decimal places",
				feeField:   "is only allowed when paymentMethod is StripeConnect (this button uses Stripe)",
			}},
		{name: "several fields at once", body: `{"productName": "Hoodie", "description": null, "amount": "20", "currency": "EUR"}`,
			want: func(b *button) { b.ProductName, b.Description, b.AmountMinor, b.Currency = "Hoodie", "", 2000, "EUR" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored := storedButton
			if tt.stored != nil {
				tt.stored(&stored)
			}
			got := stored
			apply, err := decodeUpdate([]byte(tt.body))
			if err == nil {
				err = apply(&got)
			}
			checkFields(t, []byte(tt.body), err, tt.fields)
			want := stored // on error apply must leave the button as it was
			if tt.want != nil {
				tt.want(&want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s on %+v: got %+v, want %+v", tt.body, stored, got, want)
			}
		})
	}
}

func TestBillingIntervalIsCaseInsensitiveInASCIIOnly(t *testing.T) {
	body := func(interval string) []byte {
		return []byte(`{"productName":"p","amount":"1","currency":"USD","paymentMethod":"Stripe","paymentType":"subscription","isLive":false,"billingInterval":"` + interval + `"}`)
	}
	if b, err := decodeCreate(body("WEEK"), "the service"); err != nil || b.BillingInterval != "week" {
		t.Errorf(`"WEEK": got %q, %v, want week`, b.BillingInterval, err)
	}
	// U+212A KELVIN SIGN lower-cases to "k" under Unicode rules.
	if _, err := decodeCreate(body(`wee\u212a`), "the service"); err == nil {
		t.Error(`"wee\u212a": got accepted, want refused`)
	}
}

func TestMinorUnitsOfZero(t *testing.T) {
	for _, currency := range []string{"JPY", "USD"} {
		d, _ := parseDecimal("0")
		if n, why := minorUnits(d, currency); n != 0 || why != "" {
			t.Errorf("minorUnits(0, %s): got %d %q, want 0 and no problem", currency, n, why)
		}
	}
}

// minorUnits is fields.minorUnits on its own: d in currency's minor units, or why it cannot be.
func minorUnits(d decimal, currency string) (int64, string) {
	f := &fields{problems: problems{}}
	n := f.minorUnits("amount", d, currency)
	return n, f.problems["amount"]
}
