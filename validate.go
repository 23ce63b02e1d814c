package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits from the contract (section 5).
const (
	maxNameRunes        = 250
	maxDescriptionRunes = 5000
	// maxAmountMinor is 10^15 minor units: far above any real price, and small
	// enough that every amount fits an int64 in any currency's minor unit.
	maxAmountMinor int64 = 1_000_000_000_000_000
	// maxFeeBasisPoints is 100% in hundredths of a percent.
	maxFeeBasisPoints int64 = 10_000
)

const feeField = "ApplicationFeePercentage"

var (
	createFields = []string{"productName", "description", "amount", "currency",
		"billingInterval", "paymentMethod", "paymentType", "isLive", feeField}
	updateFields = []string{"productName", "description", "amount", "currency", feeField}
	// fixedFields are chosen at create; an update body that names them is refused
	// rather than silently ignored, so a client never believes it changed them.
	fixedFields = []string{"paymentMethod", "paymentType", "isLive", "billingInterval"}
)

// invalidError is a rejected request body: message summarises, fields holds
// every failing field -> why. Problems with the body as a whole are under "body".
type invalidError struct {
	message string
	fields  map[string]string
}

func (e *invalidError) Error() string { return e.message }

// newInvalidError summarises fields (field -> why, at least one) into one message:
// "<field> <why>" for one problem, "N fields are invalid: a, b, c" for several.
func newInvalidError(fields map[string]string) *invalidError {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 1 {
		return &invalidError{names[0] + " " + fields[names[0]], fields}
	}
	return &invalidError{fmt.Sprintf("%d fields are invalid: %s", len(names), strings.Join(names, ", ")), fields}
}

// --- decoding ---

// decodeCreate reads a create body into a button (productName, description, amount,
// currency, billingInterval, paymentMethod, paymentType, isLive, fee). providerName
// is the service's own processor name, one of the three valid paymentMethod values.
// On failure it returns an *invalidError naming every failing field.
func decodeCreate(body []byte, providerName string) (button, error) {
	f, err := readObject(body, createFields)
	if err != nil {
		return button{}, err
	}
	if providerName == "" {
		providerName = "the service" // never let an empty paymentMethod match
	}
	var b button
	b.ProductName, _ = f.productName(true)
	b.Description, _ = f.description()
	b.IsLive, _ = f.boolean("isLive")

	amount, amountOK := f.amount(true)
	currency, currencyOK := f.currency(true)
	b.Currency = currency
	if amountOK && currencyOK {
		if minor, why := minorUnits(amount, currency); why != "" {
			f.fail("amount", why)
		} else {
			b.AmountMinor = minor
		}
	}

	var typeOK, intervalOK bool
	b.PaymentType, typeOK = f.oneOf("paymentType", "one_time", "subscription")
	b.BillingInterval, intervalOK = f.billingInterval()
	if typeOK && intervalOK {
		switch {
		case b.PaymentType == "subscription" && b.BillingInterval == "":
			f.fail("billingInterval", "is required when paymentType is subscription")
		case b.PaymentType == "one_time" && b.BillingInterval != "":
			f.fail("billingInterval", "must be absent when paymentType is one_time")
		}
	}

	var methodOK bool
	b.PaymentMethod, methodOK = f.oneOf("paymentMethod", providerName, "Stripe", "StripeConnect")
	_, feeGiven := f.get(feeField, false)
	switch {
	case methodOK && b.PaymentMethod == "StripeConnect" && !feeGiven:
		f.fail(feeField, "is required when paymentMethod is StripeConnect")
	case !methodOK || b.PaymentMethod == "StripeConnect":
		b.FeeBasisPoints, _ = f.fee()
	case feeGiven:
		// Said without reading the value: the fix is to drop the field, not to mend it.
		f.fail(feeField, "is only allowed when paymentMethod is StripeConnect")
	}

	if len(f.problems) > 0 {
		return button{}, newInvalidError(f.problems)
	}
	return b, nil
}

// updateRequest is a decoded update body; a nil field is left unchanged.
type updateRequest struct {
	productName *string
	description *string  // "" clears it
	amount      *decimal // checked by apply against the currency after the update
	currency    *string
	fee         *int64 // basis points
}

// decodeUpdate reads an update body, checking each field on its own (the stored
// button is apply's concern). On failure it returns an *invalidError naming every
// failing field, or {"body": "has no field to update"} when nothing would change.
func decodeUpdate(body []byte) (updateRequest, error) {
	f, err := readObject(body, slices.Concat(updateFields, fixedFields))
	if err != nil {
		return updateRequest{}, err
	}
	for _, name := range fixedFields {
		if _, given := f.given[name]; given {
			f.fail(name, "cannot be changed by update")
		}
	}
	var u updateRequest
	if name, ok := f.productName(false); ok {
		u.productName = &name
	}
	if raw, given := f.given["description"]; given {
		if text, ok := f.description(); ok {
			u.description = &text
		} else if string(raw) == "null" {
			u.description = new("")
		}
	}
	if d, ok := f.amount(false); ok {
		u.amount = &d
	}
	if code, ok := f.currency(false); ok {
		u.currency = &code
	}
	if u.amount != nil && u.currency != nil {
		// Both are in the body, so the mismatch is reported with the other problems.
		if _, why := minorUnits(*u.amount, *u.currency); why != "" {
			f.fail("amount", why)
		}
	}
	if bp, ok := f.fee(); ok {
		u.fee = &bp
	}
	switch {
	case len(f.problems) > 0:
		return updateRequest{}, newInvalidError(f.problems)
	case u == updateRequest{}:
		return updateRequest{}, newInvalidError(map[string]string{"body": "has no field to update"})
	}
	return u, nil
}

// apply checks u against the stored button and then writes the change into b.
// The amount is checked in the currency b will have afterwards; a new currency
// without a new amount re-expresses the stored amount in it. On failure it
// returns an *invalidError and leaves b untouched.
func (u updateRequest) apply(b *button) error {
	next := *b
	problems := map[string]string{}
	if u.productName != nil {
		next.ProductName = *u.productName
	}
	if u.description != nil {
		next.Description = *u.description
	}
	if u.currency != nil {
		next.Currency = *u.currency
	}
	switch {
	case u.amount != nil:
		minor, why := minorUnits(*u.amount, next.Currency)
		if why != "" {
			problems["amount"] = why
		}
		next.AmountMinor = minor
	case next.Currency != b.Currency:
		stored := formatAmount(b.AmountMinor, b.Currency)
		d, _ := parseDecimal(stored) // formatAmount always writes a plain decimal
		minor, why := minorUnits(d, next.Currency)
		if why != "" {
			problems["currency"] = fmt.Sprintf("cannot be changed to %s without a new amount: the stored amount %s %s",
				next.Currency, stored, why)
		}
		next.AmountMinor = minor
	}
	if u.fee != nil {
		if b.PaymentMethod != "StripeConnect" {
			problems[feeField] = fmt.Sprintf("is only allowed when paymentMethod is StripeConnect (this button uses %s)", b.PaymentMethod)
		}
		next.FeeBasisPoints = *u.fee
	}
	if len(problems) > 0 {
		return newInvalidError(problems)
	}
	*b = next
	return nil
}

// readObject walks body as exactly one JSON object, token by token, so that exact
// names and repeats are seen (encoding/json alone folds case and keeps the last
// repeat). Unknown and repeated names are recorded as problems. When the body
// itself is unusable it returns an *invalidError with only a "body" entry.
func readObject(body []byte, known []string) (*fields, error) {
	bodyError := func(why string) (*fields, error) {
		return nil, newInvalidError(map[string]string{"body": why})
	}
	// Checked first: encoding/json would quietly turn bad bytes into U+FFFD.
	if !utf8.Valid(body) {
		return bodyError("is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a top-level 1e999 is then "not an object", not a float64 overflow
	tok, err := dec.Token()
	switch {
	case err == io.EOF:
		return bodyError("is empty")
	case err != nil:
		return bodyError(notJSON(body, err))
	case tok != json.Delim('{'):
		return bodyError("must be a JSON object")
	}
	f := &fields{given: map[string]json.RawMessage{}, problems: map[string]string{}}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bodyError(notJSON(body, err))
		}
		name := tok.(string) // inside an object, Token returns a key or an error
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return bodyError(notJSON(body, err))
		}
		switch {
		case !slices.Contains(known, name):
			f.fail(name, unknownField(name, known))
		case seen[name]:
			f.fail(name, "is given more than once")
			delete(f.given, name) // neither value is used
		default:
			f.given[name] = value
		}
		seen[name] = true
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return bodyError(notJSON(body, err))
	}
	end := int(dec.InputOffset())
	if _, err := dec.Token(); err != io.EOF {
		at := end + len(body[end:]) - len(bytes.TrimLeft(body[end:], " \t\r\n"))
		return bodyError(fmt.Sprintf("has data after the JSON object (at byte %d)", at))
	}
	return f, nil
}

// notJSON words a decoding failure as the "body" problem with the zero-based
// offset of the offending byte, never encoding/json's text (it speaks of Go
// types). The offset comes from json.Unmarshal, which counts bytes the same way
// wherever the error is; the Decoder's offsets differ between Token and Decode.
func notJSON(body []byte, err error) string {
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) && errors.As(json.Unmarshal(body, new(json.RawMessage)), &syntax) {
		return fmt.Sprintf("is not valid JSON (at byte %d)", syntax.Offset-1)
	}
	return fmt.Sprintf("is not valid JSON (it ends early, at byte %d)", len(body))
}

// unknownField is the problem for a name not in known, suggesting the known name
// it matches ignoring case.
func unknownField(name string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(name, k) {
			return fmt.Sprintf("unknown field; did you mean %q?", k)
		}
	}
	return "unknown field"
}

// fields is one decoded body: the raw value of each known field given once, and
// the problems found so far.
type fields struct {
	given    map[string]json.RawMessage // name -> JSON text; null included
	problems map[string]string          // name -> why; the first problem found wins
}

func (f *fields) fail(name, why string) {
	if _, failed := f.problems[name]; !failed {
		f.problems[name] = why
	}
}

// get returns name's JSON text; false when it is absent, null or already failed,
// recording "is required" if it is.
func (f *fields) get(name string, required bool) (json.RawMessage, bool) {
	v, given := f.given[name]
	if _, failed := f.problems[name]; failed || !given || string(v) == "null" {
		if required {
			f.fail(name, "is required")
		}
		return nil, false
	}
	return v, true
}

// str returns name's JSON string; false when it has none or it is not a string.
func (f *fields) str(name string, required bool) (string, bool) {
	v, ok := f.get(name, required)
	if !ok {
		return "", false
	}
	if v[0] != '"' {
		f.fail(name, "must be a string")
		return "", false
	}
	// encoding/json would decode a lone surrogate as U+FFFD: the stored text
	// would differ from what was sent.
	if hasLoneSurrogate(v) {
		f.fail(name, `contains an invalid \u escape (lone surrogate)`)
		return "", false
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		f.fail(name, "must be a string")
		return "", false
	}
	return s, true
}

// hasLoneSurrogate reports whether the JSON string literal lit (already known
// to be valid JSON) holds a \u escape of a UTF-16 surrogate that is not half of
// a high-low pair.
func hasLoneSurrogate(lit []byte) bool {
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		i++ // the escaped byte: skipping it keeps an escaped backslash from being read twice
		if lit[i] != 'u' {
			continue
		}
		r := hex4(lit[i+1:])
		i += 4
		switch {
		case 0xDC00 <= r && r <= 0xDFFF: // a low half with no high half before it
			return true
		case 0xD800 <= r && r <= 0xDBFF:
			if i+6 >= len(lit) || lit[i+1] != '\\' || lit[i+2] != 'u' {
				return true
			}
			if low := hex4(lit[i+3:]); low < 0xDC00 || low > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

// hex4 reads the four hex digits that start b, as every \u escape in valid JSON has.
func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n)
}

// boolean returns the required JSON boolean name; false when it is missing or not a boolean.
func (f *fields) boolean(name string) (bool, bool) {
	v, ok := f.get(name, true)
	if ok && string(v) != "true" && string(v) != "false" {
		f.fail(name, "must be a boolean")
		return false, false
	}
	return string(v) == "true", ok
}

// number returns name's plain decimal, written as a JSON string or as a JSON
// number whose text is read as is (never through float64); false when it has
// none or it is not a plain decimal.
func (f *fields) number(name string, required bool) (decimal, bool) {
	v, ok := f.get(name, required)
	if !ok {
		return decimal{}, false
	}
	text := string(v)
	switch {
	case v[0] == '"':
		if text, ok = f.str(name, required); !ok {
			return decimal{}, false
		}
	case v[0] != '-' && (v[0] < '0' || v[0] > '9'):
		f.fail(name, "must be a string or a number")
		return decimal{}, false
	}
	d, ok := parseDecimal(text)
	if !ok {
		f.fail(name, `must be a plain decimal number such as "12.50" (no sign, exponent or spaces)`)
	}
	return d, ok
}

// oneOf returns name's string when it is exactly one of allowed; false when it
// is missing or not allowed, suggesting the spelling it matches ignoring case.
func (f *fields) oneOf(name string, allowed ...string) (string, bool) {
	s, ok := f.str(name, true)
	if !ok {
		return "", false
	}
	if slices.Contains(allowed, s) {
		return s, true
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		if strings.EqualFold(s, a) {
			f.fail(name, fmt.Sprintf("must be exactly %q", a))
			return "", false
		}
		quoted[i] = strconv.Quote(a)
	}
	f.fail(name, "must be one of "+strings.Join(quoted, ", "))
	return "", false
}

// asciiLower lower-cases ASCII letters and leaves every other byte alone.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// --- field rules ---

// productName returns the trimmed name; false when it is absent or breaks a rule.
func (f *fields) productName(required bool) (string, bool) {
	s, ok := f.str("productName", required)
	if !ok {
		return "", false
	}
	s = strings.TrimSpace(s)
	switch n := utf8.RuneCountInString(s); {
	case n == 0:
		f.fail("productName", "must not be empty")
	case n > maxNameRunes:
		f.fail("productName", fmt.Sprintf("must be at most %d characters (it has %d)", maxNameRunes, n))
	case strings.ContainsFunc(s, unicode.IsControl):
		f.fail("productName", "must not contain control characters")
	default:
		return s, true
	}
	return "", false
}

// description returns the description as given ("" means none); false when it
// is absent, null or breaks a rule.
func (f *fields) description() (string, bool) {
	s, ok := f.str("description", false)
	if !ok {
		return "", false
	}
	switch n := utf8.RuneCountInString(s); {
	case n > maxDescriptionRunes:
		f.fail("description", fmt.Sprintf("must be at most %d characters (it has %d)", maxDescriptionRunes, n))
	case strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' }):
		f.fail("description", "must not contain control characters other than tab and line breaks")
	default:
		return s, true
	}
	return "", false
}

// amount returns the amount when it is a plain decimal above zero; false when
// it is absent or not. Its fit in the currency's minor unit is minorUnits' job,
// so that a bad currency still leaves the amount's own problems reported.
func (f *fields) amount(required bool) (decimal, bool) {
	d, ok := f.number("amount", required)
	if ok && d.isZero() {
		f.fail("amount", "must be greater than zero")
		return decimal{}, false
	}
	return d, ok
}

// currency returns the upper-cased code; false when it is absent or not an
// active, chargeable ISO 4217 currency.
func (f *fields) currency(required bool) (string, bool) {
	s, ok := f.str("currency", required)
	if !ok {
		return "", false
	}
	// ASCII only before upper-casing: strings.ToUpper maps "ſ" to "S".
	if len(s) != 3 || strings.ContainsFunc(s, func(r rune) bool { return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') }) {
		f.fail("currency", `must be a three-letter ISO 4217 code such as "USD"`)
		return "", false
	}
	code := strings.ToUpper(s)
	if _, ok := currencyExponents[code]; ok {
		return code, true
	}
	if why, ok := currencyExclusions[code]; ok {
		f.fail("currency", why)
	} else {
		f.fail("currency", "is not an ISO 4217 currency code")
	}
	return "", false
}

// billingIntervals maps every accepted spelling (lower-cased) to the stored value.
var billingIntervals = map[string]string{
	"day": "day", "week": "week", "month": "month", "year": "year",
	"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annually": "year",
}

// billingInterval returns the stored interval, "" when absent, null or "";
// false only when the value breaks a rule.
func (f *fields) billingInterval() (string, bool) {
	s, _ := f.str("billingInterval", false)
	if _, failed := f.problems["billingInterval"]; failed {
		return "", false
	}
	if s == "" {
		return "", true
	}
	// Lower-cased as ASCII only: strings.ToLower maps the Kelvin sign to "k".
	interval, ok := billingIntervals[asciiLower(s)]
	if !ok {
		f.fail("billingInterval", `must be one of "day", "week", "month", "year"`)
	}
	return interval, ok
}

// fee returns ApplicationFeePercentage in basis points; false when it is
// absent or not a multiple of 0.01 between 0.01 and 100.
func (f *fields) fee() (int64, bool) {
	d, ok := f.number(feeField, false)
	if !ok {
		return 0, false
	}
	if d.places() > 2 {
		f.fail(feeField, "must have at most 2 decimal places")
		return 0, false
	}
	bp, ok := d.scaled(2, maxFeeBasisPoints)
	if !ok || bp == 0 {
		f.fail(feeField, "must be between 0.01 and 100")
		return 0, false
	}
	return bp, true
}

// --- query and headers ---

const (
	defaultListLimit = 20
	maxListLimit     = 100
)

// listParameters are the query parameters of the list endpoint.
var listParameters = []string{"limit", "after", "state", "isLive", "paymentMethod"}

// decodeListQuery reads the list endpoint's query string. state defaults to
// active. On failure it returns an *invalidError naming every bad parameter.
func decodeListQuery(rawQuery, providerName string) (listFilter, error) {
	f := listFilter{Limit: defaultListLimit, State: stateActive}
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return listFilter{}, newInvalidError(map[string]string{"query": "is not a valid URL query string"})
	}
	problems := map[string]string{}
	for name, given := range values {
		switch {
		case !slices.Contains(listParameters, name):
			problems[name] = strings.Replace(unknownField(name, listParameters), "field", "query parameter", 1)
		case len(given) > 1:
			problems[name] = "is given more than once"
		}
	}
	get := func(name string) (string, bool) {
		if _, bad := problems[name]; bad || len(values[name]) == 0 {
			return "", false
		}
		return values[name][0], true
	}
	if v, ok := get("limit"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || !allDigits(v) || n < 1 || n > maxListLimit {
			problems["limit"] = fmt.Sprintf("must be a whole number from 1 to %d", maxListLimit)
		}
		f.Limit = n
	}
	if v, ok := get("after"); ok {
		if !validButtonID(v) {
			problems["after"] = "must be a button id, the next of a previous page"
		}
		f.After = v
	}
	if v, ok := get("state"); ok {
		switch v {
		case stateActive, stateDeleted:
			f.State = v
		case "all":
			f.State = ""
		default:
			problems["state"] = `must be one of "active", "deleted", "all"`
		}
	}
	if v, ok := get("isLive"); ok {
		if v != "true" && v != "false" {
			problems["isLive"] = `must be "true" or "false"`
		}
		live := v == "true"
		f.IsLive = &live
	}
	if v, ok := get("paymentMethod"); ok {
		if v != providerName && v != "Stripe" && v != "StripeConnect" {
			problems["paymentMethod"] = fmt.Sprintf("must be one of %q, %q, %q", providerName, "Stripe", "StripeConnect")
		}
		f.PaymentMethod = v
	}
	if len(problems) > 0 {
		return listFilter{}, newInvalidError(problems)
	}
	return f, nil
}

// parseIfMatch reads an If-Match header: the ETag get sent, "<version>". It
// returns 0 when the header is absent or "*" (any version), and an
// *invalidError when it is not a version.
func parseIfMatch(header string) (int64, error) {
	if header == "" || header == "*" {
		return 0, nil
	}
	digits, quoted := strings.CutPrefix(header, `"`)
	digits, closed := strings.CutSuffix(digits, `"`)
	version, err := strconv.ParseInt(digits, 10, 64)
	if !quoted || !closed || !allDigits(digits) || err != nil || version < 1 {
		return 0, newInvalidError(map[string]string{"If-Match": `must be the ETag get sent, a version in quotes such as "3"`})
	}
	return version, nil
}

// validIdempotencyKey accepts 1 to 255 printable ASCII characters.
func validIdempotencyKey(key string) bool {
	if key == "" || len(key) > 255 {
		return false
	}
	for _, c := range []byte(key) {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// --- amounts ---

// decimal is a non-negative plain decimal split at its dot, without leading
// zeros in the whole part or trailing zeros in the fraction ("007.50" is "7", "5").
type decimal struct{ whole, frac string }

// parseDecimal reads digits, optionally followed by a dot and more digits. It
// returns false for anything else: a sign, an exponent, spaces, a dot at either end.
func parseDecimal(s string) (decimal, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || dot && frac == "" || !allDigits(whole) || !allDigits(frac) {
		return decimal{}, false
	}
	return decimal{strings.TrimLeft(whole, "0"), strings.TrimRight(frac, "0")}, true
}

func allDigits(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < '0' || r > '9' })
}

func (d decimal) isZero() bool { return d.whole == "" && d.frac == "" }

// places is how many decimal places d needs.
func (d decimal) places() int { return len(d.frac) }

// scaled returns d * 10^exp; false when d needs more than exp places or the
// result is above limit. Digit strings of any length are safe.
func (d decimal) scaled(exp int, limit int64) (int64, bool) {
	if d.places() > exp {
		return 0, false
	}
	digits := d.whole + d.frac + strings.Repeat("0", exp-d.places())
	if digits == "" { // zero with no places: "0" in JPY
		return 0, true
	}
	// A digit string too long for int64 is a range error, not an overflow.
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil && n <= limit
}

// minorUnits returns d in currency's minor units, or why it cannot be: more
// decimal places than the currency has, above maxAmountMinor, or a currency that
// is no longer in the table (a button stored before a code was withdrawn).
func minorUnits(d decimal, currency string) (int64, string) {
	exp, ok := currencyExponents[currency]
	switch {
	case !ok:
		return 0, fmt.Sprintf("cannot be expressed in %s, which is no longer an active currency", currency)
	case d.places() > exp && exp == 0:
		return 0, fmt.Sprintf("cannot be expressed in %s, which has no decimal places", currency)
	case d.places() > exp:
		return 0, fmt.Sprintf("cannot be expressed in %s, which has at most %d decimal places", currency, exp)
	}
	n, ok := d.scaled(exp, maxAmountMinor)
	if !ok {
		return 0, fmt.Sprintf("is above the maximum of %s %s", formatAmount(maxAmountMinor, currency), currency)
	}
	return n, ""
}

// formatAmount writes minor units of currency as decimal text with the
// currency's decimal places: "19.90" USD, "500" JPY, "1.250" KWD. A code not in
// the table is written with 2.
func formatAmount(minor int64, currency string) string {
	exp, ok := currencyExponents[currency]
	if !ok {
		exp = 2
	}
	return formatScaled(minor, exp)
}

// formatFee writes basis points as a percentage with two decimals: 250 -> "2.50".
func formatFee(basisPoints int64) string { return formatScaled(basisPoints, 2) }

func formatScaled(n int64, exp int) string {
	sign, digits := "", strconv.FormatUint(uint64(n), 10)
	if n < 0 {
		sign, digits = "-", strconv.FormatUint(-uint64(n), 10)
	}
	if exp == 0 {
		return sign + digits
	}
	if len(digits) <= exp {
		digits = strings.Repeat("0", exp-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-exp] + "." + digits[len(digits)-exp:]
}

// --- currencies ---

// currencyExponents holds every active ISO 4217 currency (List One, amendments
// through late 2026) with its minor unit: the decimal places an amount may have.
// Withdrawn codes are left out: ANG (replaced by XCG), BGN (euro, 2026), CUC,
// HRK, SLL, ZWL and older ones.
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

// currencyExclusions are ISO 4217 codes that name no money a button can charge,
// or no longer name any, each with the reason given to the client.
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
