package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits from the contract (sections 5 and 9).
const (
	maxNameRunes        = 250
	maxDescriptionRunes = 5000
	// maxAmountMinor is 10^15 minor units: far above any real price, and small enough that every amount fits an
	// int64 in any currency's minor unit.
	maxAmountMinor      int64 = 1_000_000_000_000_000
	maxFeeBasisPoints   int64 = 10_000 // 100%
	maxMetadataKeys           = 50
	maxMetadataKeyBytes       = 40
	maxMetadataRunes          = 500
)

const feeField = "ApplicationFeePercentage"

var (
	createFields = []string{"productName", "description", "amount", "currency",
		"billingInterval", "paymentMethod", "paymentType", "isLive", feeField, "metadata"}
	updateFields = []string{"productName", "description", "amount", "currency", feeField, "metadata"}
	// fixedFields are chosen at create; an update body that names them is refused rather than silently ignored, so
	// a client never believes it changed them.
	fixedFields = []string{"paymentMethod", "paymentType", "isLive", "billingInterval"}
)

// problems are what is wrong with a request: field -> why, the first found wins; the body as a whole is "body".
type problems map[string]string

func (p problems) fail(name, why string) {
	if _, failed := p[name]; !failed {
		p[name] = why
	}
}

// text records under name what is wrong with s: more than max characters, or one that bad reports (badWhy says which).
func (p problems) text(name, s string, max int, bad func(rune) bool, badWhy string) bool {
	switch n := utf8.RuneCountInString(s); {
	case n > max:
		p.fail(name, fmt.Sprintf("must be at most %d characters (it has %d)", max, n))
	case strings.ContainsFunc(s, bad):
		p.fail(name, "must not contain "+badWhy)
	default:
		return true
	}
	return false
}

// invalid is the 400 for problems, nil for none: its message is "<field> <why>" for one problem, "N fields are
// invalid: a, b" for several. No answer grows with the request: it names at most 20 fields (see shownName) and says
// how many more there were.
func invalid(problems problems) error {
	if len(problems) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(problems))
	shown := map[string]string{}
	for _, name := range names[:min(len(names), 20)] {
		shown[shownName(name)] = problems[name]
	}
	shownNames := slices.Sorted(maps.Keys(shown))
	message := fmt.Sprintf("%d fields are invalid: %s", len(names), strings.Join(shownNames, ", "))
	if len(names) == 1 {
		message = shownNames[0] + " " + shown[shownNames[0]]
	} else if len(names) > 20 {
		message += fmt.Sprintf(" and %d more", len(names)-20)
	}
	return &apiError{code: codeInvalid, message: message, fields: shown}
}

// shownName is a field's name as a 400 shows it, in at most 40 bytes of JSON: what JSON would escape as "?", and a
// longer name cut with "…".
func shownName(name string) string {
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || strings.ContainsRune(`"\<>&`+"\u2028\u2029", r) {
			return '?'
		}
		return r
	}, name)
	if len(name) <= 40 {
		return name
	}
	cut := 39
	for !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}

// --- bodies ---

// decodeCreate reads a create body into a button (providerName: the own processor's paymentMethod), or fails with
// invalid_request naming every failing field.
func decodeCreate(body []byte, providerName string) (button, error) {
	f, err := readObject(body, createFields)
	if err != nil {
		return button{}, err
	}
	var b button
	b.ProductName, _ = f.productName(true)
	b.Description, _ = f.description()
	if v, ok := f.get("isLive", true); ok {
		if b.IsLive, ok = v.(bool); !ok {
			f.fail("isLive", "must be a boolean")
		}
	}
	amount, amountOK := f.amount(true)
	currency, currencyOK := f.currency(true)
	b.Currency = currency
	if amountOK && currencyOK {
		b.AmountMinor = f.minorUnits("amount", amount, currency)
	}
	b.Metadata, _ = f.metadata(nil)

	var typeOK, intervalOK, methodOK bool
	b.PaymentType, typeOK = f.oneOf("paymentType", true, "one_time", "subscription")
	b.BillingInterval, intervalOK = f.billingInterval()
	if typeOK && intervalOK && b.PaymentType == "subscription" && b.BillingInterval == "" {
		f.fail("billingInterval", "is required when paymentType is subscription")
	} else if typeOK && intervalOK && b.PaymentType == "one_time" && b.BillingInterval != "" {
		f.fail("billingInterval", "must be absent when paymentType is one_time")
	}
	b.PaymentMethod, methodOK = f.oneOf("paymentMethod", true, providerName, "Stripe", "StripeConnect")
	_, feeGiven := f.get(feeField, false)
	if methodOK && b.PaymentMethod != "StripeConnect" {
		if feeGiven { // said without reading the value: the fix is to drop the field
			f.fail(feeField, "is only allowed when paymentMethod is StripeConnect")
		}
	} else if b.FeeBasisPoints, _ = f.fee(); methodOK && !feeGiven {
		f.fail(feeField, "is required when paymentMethod is StripeConnect")
	}
	return b, invalid(f.problems)
}

type update struct { // an update body whose fields each passed their own rules; apply checks it against a button
	*fields
	name, description, currency    string
	amount                         decimal
	fee                            int64
	hasName, hasDescription        bool
	hasAmount, hasCurrency, hasFee bool
}

// decodeUpdate reads an update body and checks each field on its own; invalid_request names every failing field.
func decodeUpdate(body []byte) (*update, error) {
	f, err := readObject(body, slices.Concat(updateFields, fixedFields))
	if err != nil {
		return nil, err
	}
	for _, name := range fixedFields {
		if _, given := f.given[name]; given {
			f.fail(name, "cannot be changed by update")
		}
	}
	u := &update{fields: f}
	u.name, u.hasName = f.productName(false)
	u.description, u.hasDescription = f.description()
	if v, given := f.given["description"]; given && v == nil {
		u.hasDescription = true // null clears it
	}
	u.amount, u.hasAmount = f.amount(false)
	u.currency, u.hasCurrency = f.currency(false)
	if u.hasAmount && u.hasCurrency { // both in the body: the mismatch is reported with the other problems
		f.minorUnits("amount", u.amount, u.currency)
	}
	u.fee, u.hasFee = f.fee()
	_, hasMetadata := f.metadata(nil)
	if len(f.problems) == 0 && !u.hasName && !u.hasDescription && !u.hasAmount && !u.hasCurrency && !u.hasFee &&
		!hasMetadata {
		f.fail("body", "has no field to update")
	}
	if err := invalid(f.problems); err != nil {
		return nil, err
	}
	return u, nil
}

// apply makes the update to b, the button as stored, unless it fails with invalid_request: the amount in the
// currency the button will have (a new currency without a new amount re-expresses the stored one), the fee only on
// a StripeConnect button, metadata merged key by key. The store calls it inside the write's transaction.
func (u *update) apply(b *button) error {
	next := *b
	if u.hasName {
		next.ProductName = u.name
	}
	if u.hasDescription {
		next.Description = u.description
	}
	if u.hasCurrency {
		next.Currency = u.currency
	}
	if u.hasAmount {
		next.AmountMinor = u.minorUnits("amount", u.amount, next.Currency)
	} else if next.Currency != b.Currency {
		stored := formatAmount(b.AmountMinor, b.Currency)
		d, _ := parseDecimal(stored) // formatAmount always writes a plain decimal
		if next.AmountMinor = u.minorUnits("currency", d, next.Currency); u.problems["currency"] != "" {
			u.problems["currency"] = fmt.Sprintf("cannot be changed to %s without a new amount: the stored amount %s %s",
				next.Currency, stored, u.problems["currency"])
		}
	}
	if u.hasFee {
		next.FeeBasisPoints = u.fee
		if b.PaymentMethod != "StripeConnect" {
			u.fail(feeField, "is only allowed when paymentMethod is StripeConnect (this button uses "+b.PaymentMethod+")")
		}
	}
	next.Metadata, _ = u.metadata(b.Metadata)
	if err := invalid(u.problems); err != nil {
		return err
	}
	*b = next
	return nil
}

// readObject reads body as exactly one JSON object, then walks it name by name: encoding/json alone folds case and
// keeps the last repeat. Unknown and repeated names are problems; an unusable body is invalid_request with only a
// "body" entry, saying where (zero-based), never encoding/json's text.
func readObject(body []byte, known []string) (*fields, error) {
	var object json.RawMessage
	var syntax *json.SyntaxError
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(&object)
	rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")
	why := ""
	switch {
	case !utf8.Valid(body): // encoding/json would quietly turn bad bytes into U+FFFD
		why = "is not valid UTF-8"
	case err == io.EOF:
		why = "is empty"
	case errors.As(err, &syntax):
		why = fmt.Sprintf("is not valid JSON (at byte %d)", syntax.Offset-1)
	case err != nil:
		why = fmt.Sprintf("is not valid JSON (it ends early, at byte %d)", len(body))
	case object[0] != '{':
		why = "must be a JSON object"
	case len(rest) > 0:
		why = fmt.Sprintf("has data after the JSON object (at byte %d)", len(body)-len(rest))
	}
	if why != "" {
		return nil, invalid(problems{"body": why})
	}
	f := &fields{given: map[string]any{}, problems: problems{}}
	dec = json.NewDecoder(bytes.NewReader(object))
	dec.UseNumber() // numbers keep their text: amounts never pass through a float
	dec.Token()     // the object is valid: from here on nothing fails
	for dec.More() {
		tok, _ := dec.Token()
		var value any
		dec.Decode(&value)
		name := tok.(string)
		_, repeated := f.given[name]
		switch {
		case !slices.Contains(known, name):
			f.fail(name, unknownName("field", name, known))
		case repeated: // a problem: get ignores its value
			f.fail(name, "is given more than once")
		default:
			f.given[name] = value
		}
	}
	return f, nil
}

// unknownName is the problem of a field or query parameter not in known, with the known name it matches but for case.
func unknownName(kind, name string, known []string) string {
	if i := slices.IndexFunc(known, func(k string) bool { return strings.EqualFold(name, k) }); i >= 0 {
		return fmt.Sprintf("unknown %s; did you mean %q?", kind, known[i])
	}
	return "unknown " + kind
}

// fields is one decoded body: the value of each known field given once (null included; numbers as json.Number,
// their text), and the problems found so far.
type fields struct {
	given map[string]any
	problems
}

// get returns name's value; false when it is absent, null or already failed ("is required" if it is).
func (f *fields) get(name string, required bool) (any, bool) {
	v := f.given[name]
	if _, failed := f.problems[name]; failed || v == nil {
		if required {
			f.fail(name, "is required")
		}
		return nil, false
	}
	return v, true
}

// str returns name's JSON string; false when it has none.
func (f *fields) str(name string, required bool) (string, bool) {
	v, ok := f.get(name, required)
	s, isString := v.(string)
	if ok && !isString {
		f.fail(name, "must be a string")
	}
	return s, ok && isString
}

// number returns name's plain decimal, a JSON string or a JSON number read from its text (never through float64).
func (f *fields) number(name string, required bool) (decimal, bool) {
	v, _ := f.get(name, required)
	text, isString := v.(string)
	if n, isNumber := v.(json.Number); isNumber {
		text, isString = n.String(), true
	}
	d, ok := parseDecimal(text)
	switch {
	case v == nil:
	case !isString:
		f.fail(name, "must be a string or a number")
	case !ok:
		f.fail(name, `must be a plain decimal number such as "12.50" (no sign, exponent or spaces)`)
	}
	return d, ok && isString
}

// oneOf returns name's string when it is exactly one of allowed; false when absent or not, with a "did you mean".
func (f *fields) oneOf(name string, required bool, allowed ...string) (string, bool) {
	s, ok := f.str(name, required)
	if !ok || slices.Contains(allowed, s) {
		return s, ok
	}
	if i := slices.IndexFunc(allowed, func(a string) bool { return strings.EqualFold(s, a) }); i >= 0 {
		f.fail(name, fmt.Sprintf("must be exactly %q", allowed[i]))
	} else {
		f.fail(name, "must be one of "+quoted(allowed))
	}
	return "", false
}

// quoted lists values as `"a", "b", "c"`.
func quoted(values []string) string {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// --- field rules ---

// productName returns the trimmed name: it must show a letter, digit, punctuation or symbol, and carry no bidirectional
// control (which can make a checkout page show another name).
func (f *fields) productName(required bool) (string, bool) {
	s, ok := f.str("productName", required)
	s = strings.TrimSpace(s)
	switch {
	case !ok:
	case s == "":
		f.fail("productName", "must not be empty")
	case !strings.ContainsFunc(s, func(r rune) bool { return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) }):
		f.fail("productName", "must have at least one letter, digit, punctuation mark or symbol")
	default:
		return s, f.text("productName", s, maxNameRunes, func(r rune) bool {
			return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
		}, "control characters or bidirectional controls")
	}
	return "", false
}

// description returns the description as given ("" means none); false when absent, null or broken.
func (f *fields) description() (string, bool) {
	s, ok := f.str("description", false)
	return s, ok && f.text("description", s, maxDescriptionRunes, func(r rune) bool {
		return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r)
	}, "control characters other than tab and line breaks")
}

// amount returns a plain decimal above zero, or false; its fit in the currency is minorUnits' job.
func (f *fields) amount(required bool) (decimal, bool) {
	d, ok := f.number("amount", required)
	if ok && d.isZero() {
		f.fail("amount", "must be greater than zero")
		return decimal{}, false
	}
	return d, ok
}

// currency returns the upper-cased code; false when it is absent or not an active, chargeable ISO 4217 currency.
func (f *fields) currency(required bool) (string, bool) {
	s, ok := f.str("currency", required)
	code := strings.ToUpper(s) // ASCII only, checked below: strings.ToUpper maps "ſ" to "S"
	_, active := currencyExponents[code]
	switch why, excluded := currencyExclusions[code]; {
	case !ok || active && asciiIn(s, 3, 3, letters):
		return code, ok
	case !asciiIn(s, 3, 3, letters):
		f.fail("currency", `must be a three-letter ISO 4217 code such as "USD"`)
	case excluded:
		f.fail("currency", why)
	default:
		f.fail("currency", "is not an ISO 4217 currency code")
	}
	return "", false
}

// billingIntervals maps every accepted spelling (lower-cased) to the stored value.
var billingIntervals = map[string]string{
	"day": "day", "week": "week", "month": "month", "year": "year",
	"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year",
}

// billingInterval returns the stored interval, "" when absent, null or ""; false only when the value breaks a rule.
func (f *fields) billingInterval() (string, bool) {
	s, _ := f.str("billingInterval", false)
	// Lower-cased as ASCII only: strings.ToLower maps the Kelvin sign to "k".
	interval, known := billingIntervals[strings.ToLower(s)]
	if _, failed := f.problems["billingInterval"]; failed || s != "" && (!known || !asciiIn(s, 1, 8, letters)) {
		f.fail("billingInterval", `must be one of "day", "week", "month", "year"`) // kept, when it failed already
		return "", false
	}
	return interval, true
}

// fee returns ApplicationFeePercentage in basis points; false unless a multiple of 0.01 from 0.01 to 100.
func (f *fields) fee() (int64, bool) {
	d, ok := f.number(feeField, false)
	bp, fits := d.scaled(2, maxFeeBasisPoints)
	switch {
	case !ok:
	case len(d.frac) > 2:
		f.fail(feeField, "must have at most 2 decimal places")
	case !fits || bp == 0:
		f.fail(feeField, "must be between 0.01 and 100")
	default:
		return bp, true
	}
	return 0, false
}

// metadata returns stored with the body's metadata merged into it: a string value sets its key, null or "" removes
// it (so a create's are simply left out). false when the body has none (absent or null) or it breaks a rule;
// problems are under "metadata" for the object and "metadata.KEY" for a value.
func (f *fields) metadata(stored map[string]string) (map[string]string, bool) {
	v, ok := f.get("metadata", false)
	object, isObject := v.(map[string]any)
	if !isObject {
		if ok {
			f.fail("metadata", "must be an object of string keys to string values")
		}
		return stored, false
	}
	merged, failures := maps.Clone(stored), len(f.problems)
	for key, value := range object {
		s, isString := value.(string)
		switch name := "metadata." + key; {
		case !asciiIn(key, 1, maxMetadataKeyBytes, nameChars):
			f.fail("metadata", fmt.Sprintf("has the key %.41q: a key is 1 to %d of A-Z a-z 0-9 _ - .", key, maxMetadataKeyBytes))
		case !isString && value != nil:
			f.fail(name, "must be a string, or null to remove the key")
		case s == "":
			delete(merged, key)
		case f.text(name, s, maxMetadataRunes, unicode.IsControl, "control characters"):
			if merged == nil {
				merged = map[string]string{}
			}
			merged[key] = s
		}
	}
	if len(merged) > maxMetadataKeys {
		f.fail("metadata", fmt.Sprintf("must have at most %d keys (it would have %d)", maxMetadataKeys, len(merged)))
	}
	return merged, len(f.problems) == failures
}

// --- character sets ---

const (
	digits    = "0123456789"
	letters   = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	nameChars = letters + digits + "._-" // account names and metadata keys
)

// asciiIn reports whether s has min to max bytes, each one of allowed.
func asciiIn(s string, min, max int, allowed string) bool {
	return len(s) >= min && len(s) <= max && !strings.ContainsFunc(s, func(r rune) bool {
		return !strings.ContainsRune(allowed, r)
	})
}

// --- amounts ---

// decimal is a non-negative plain decimal split at its dot, without leading zeros in the whole part or trailing
// zeros in the fraction ("007.50" is "7", "5").
type decimal struct{ whole, frac string }

// parseDecimal reads digits, optionally followed by a dot and more digits. It returns false for anything else: a
// sign, an exponent, spaces, a dot at either end.
func parseDecimal(s string) (decimal, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	if !asciiIn(whole, 1, len(s), digits) || dot && !asciiIn(frac, 1, len(s), digits) {
		return decimal{}, false
	}
	return decimal{strings.TrimLeft(whole, "0"), strings.TrimRight(frac, "0")}, true
}

func (d decimal) isZero() bool { return d.whole == "" && d.frac == "" }

// scaled returns d * 10^exp; false when d needs more than exp places or the result is above limit. Digit strings of
// any length are safe.
func (d decimal) scaled(exp int, limit int64) (int64, bool) {
	if len(d.frac) > exp || d.isZero() {
		return 0, d.isZero()
	}
	// A digit string too long for int64 is a range error, not an overflow.
	n, err := strconv.ParseInt(d.whole+d.frac+strings.Repeat("0", exp-len(d.frac)), 10, 64)
	return n, err == nil && n <= limit
}

// minorUnits returns d in currency's minor units, or records under name why it cannot be: more decimal places than
// the currency has, above maxAmountMinor, or a currency no longer in the table (a button stored before its code was
// withdrawn).
func (f *fields) minorUnits(name string, d decimal, currency string) int64 {
	exp, active := currencyExponents[currency]
	n, fits := d.scaled(exp, maxAmountMinor)
	switch {
	case !active:
		f.fail(name, fmt.Sprintf("cannot be expressed in %s, which is no longer an active currency", currency))
	case len(d.frac) > exp && exp == 0:
		f.fail(name, fmt.Sprintf("cannot be expressed in %s, which has no decimal places", currency))
	case len(d.frac) > exp:
		f.fail(name, fmt.Sprintf("cannot be expressed in %s, which has at most %d decimal places", currency, exp))
	case !fits:
		f.fail(name, fmt.Sprintf("is above the maximum of %s %s", formatAmount(maxAmountMinor, currency), currency))
	}
	return n
}

// formatAmount writes minor units of currency as decimal text with the currency's decimal places: "19.90" USD,
// "500" JPY, "1.250" KWD (2 for a code no longer in the table).
func formatAmount(minor int64, currency string) string {
	exp, ok := currencyExponents[currency]
	if !ok {
		exp = 2
	}
	return formatScaled(minor, exp)
}

// formatScaled writes n / 10^exp with exp decimal places; n is never negative.
func formatScaled(n int64, exp int) string {
	text := fmt.Sprintf("%0*d", exp+1, n)
	if exp == 0 {
		return text
	}
	return text[:len(text)-exp] + "." + text[len(text)-exp:]
}

// --- currencies ---

// currencyExponents holds every active ISO 4217 currency (List One, amendments through late 2026) with its minor
// unit: the decimal places an amount may have. Withdrawn codes are left out: ANG (replaced by XCG), BGN (euro,
// 2026), CUC, HRK, SLL, ZWL and older ones.
var currencyExponents = codeTable(map[int]string{
	0: "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX VND VUV XAF XOF XPF",
	2: `AED AFN ALL AMD AOA ARS AUD AWG AZN BAM BBD BDT BMD BND BOB BRL BSD BTN BWP BYN BZD
		CAD CDF CHF CNY COP CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP
		GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR JMD
		KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN
		NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB
		SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS
		UAH USD UYU UZS VED VES WST XCD XCG YER ZAR ZMW ZWG`,
	3: "BHD IQD JOD KWD LYD OMR TND",
})

// currencyExclusions are ISO 4217 codes that name no money a button can charge, or no longer name any, each with
// the reason given to the client.
var currencyExclusions = codeTable(map[string]string{
	"is a fund code, not a chargeable currency":                  "BOV CHE CHW CLF COU MXV USN UYI UYW",
	"is a precious metal code, not a chargeable currency":        "XAG XAU XPD XPT",
	"is a testing or accounting unit, not a chargeable currency": "XAD XBA XBB XBC XBD XDR XSU XTS XUA XXX",
	"is a withdrawn ISO 4217 code, no longer chargeable":         "ANG BGN BYR CUC HRK LTL LVL MRO SLL STD VEF ZWL",
})

// codeTable turns value -> space-separated codes into code -> value.
func codeTable[V comparable](rows map[V]string) map[string]V {
	table := map[string]V{}
	for value, codes := range rows {
		for _, code := range strings.Fields(codes) {
			table[code] = value
		}
	}
	return table
}
