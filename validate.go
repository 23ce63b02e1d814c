package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	feeField       = "ApplicationFeePercentage"
	maxBody        = 64 << 10
	maxAmountMinor = 1_000_000_000_000_000 // 10^15 minor units, so every amount fits in an int64
)

var (
	// fixedFields are set only when a button is created. An update that names one is refused, not
	// ignored, so that a client never believes it changed them.
	fixedFields  = []string{"paymentMethod", "paymentType", "isLive", "billingInterval"}
	updateFields = []string{"productName", "description", "amount", "currency", feeField,
		"metadata"}
	createFields = append(slices.Clone(updateFields), fixedFields...)

	paymentMethods   = []string{"the service", "Stripe", "StripeConnect"} // as the seed writes them
	billingIntervals = []string{"day", "week", "month", "year"}
)

// fields holds a decoded body or query string. values maps each known name, given once, to its
// value. A JSON null is nil, and a number in a body is a json.Number, which keeps its text.
// problems maps the name of each field found wrong to the reason why.
type fields struct {
	values   map[string]any
	problems map[string]string
}

// fail records why name is wrong, unless a problem with name was already recorded.
func (f *fields) fail(name, why string) {
	if _, failed := f.problems[name]; !failed {
		f.problems[name] = why
	}
}

func (f *fields) has(name string) bool { return f.values[name] != nil } // a null counts as absent

// invalid returns the 400 error that names every field in problems, or nil when there are none.
func invalid(problems map[string]string) error {
	if len(problems) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(problems))
	message := fmt.Sprintf("%d fields are invalid: %s", len(names), strings.Join(names, ", "))
	if len(names) == 1 {
		message = names[0] + " " + problems[names[0]]
	}
	return &apiError{code: codeInvalid, message: message, fields: problems}
}

// --- characters and amounts ---

const (
	digits    = "0123456789"
	letters   = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	nameChars = letters + digits + "._-" // allowed in metadata keys, account names and request ids
)

// orNil returns a pointer to s, or nil when s is "", which means the value is absent.
func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// onlyOf reports whether every character of s is one of allowed.
func onlyOf(s, allowed string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return !strings.ContainsRune(allowed, r) })
}

// decimal is a plain decimal number split at its dot. The whole part has no leading zeros and the
// fraction has no trailing zeros, so "007.50" is {"7", "5"}.
type decimal struct{ whole, frac string }

// parseDecimal accepts digits, optionally followed by a dot and more digits. It accepts nothing
// else: no sign, no exponent and no spaces.
func parseDecimal(s string) (decimal, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	ok := whole != "" && onlyOf(whole, digits) && (!dot || frac != "" && onlyOf(frac, digits))
	return decimal{strings.TrimLeft(whole, "0"), strings.TrimRight(frac, "0")}, ok
}

// scaled returns d * 10^exp, and false when d has more than exp decimal places or the result is
// above limit. It pads d's digits with zeros to exp places, so "19.9" at exp 2 is 1990. The leading
// "0" makes "0.0" read as 0. A digit string too long for an int64 is a range error, never an
// overflow.
func (d decimal) scaled(exp int, limit int64) (int64, bool) {
	if len(d.frac) > exp {
		return 0, false
	}
	text := "0" + d.whole + d.frac + strings.Repeat("0", exp-len(d.frac))
	n, err := strconv.ParseInt(text, 10, 64)
	return n, err == nil && n <= limit
}

// formatScaled writes n / 10^exp with exp decimal places.
func formatScaled(n int64, exp int) string {
	text := fmt.Sprintf("%0*d", exp+1, n)
	if exp == 0 {
		return text
	}
	return text[:len(text)-exp] + "." + text[len(text)-exp:]
}

// --- bodies and query strings ---

// readBody returns the request body after checking its media type and the 64 KiB size cap. A
// request without a Content-Type is read as JSON.
func readBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil || mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json") {
			return nil, &apiError{code: codeMediaType, message: "Content-Type must be JSON"}
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, invalid(map[string]string{"body": "could not be read"})
	} else if len(body) > maxBody {
		return nil, &apiError{code: codeTooLarge, message: "body is larger than 64 KiB"}
	}
	return body, nil
}

// readObject reads the request's body (readBody) in two passes. The first checks that it is one
// JSON object with nothing after it. The second walks the object's names one by one, as they
// were written, which decoding into a struct or a map would not: it folds case, and keeps only
// the last of a repeated name.
func readObject(r *http.Request, known []string) (*fields, error) {
	body, err := readBody(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var object json.RawMessage
	if !utf8.Valid(body) { // encoding/json would quietly read bad bytes as U+FFFD
		return nil, invalid(map[string]string{"body": "must be valid UTF-8"})
	} else if dec.Decode(&object) != nil || object[0] != '{' || dec.Decode(new(any)) != io.EOF {
		return nil, invalid(map[string]string{"body": "must be one JSON object, nothing after it"})
	}
	f := &fields{values: map[string]any{}, problems: map[string]string{}}
	dec = json.NewDecoder(bytes.NewReader(object))
	dec.UseNumber() // numbers keep their text, so an amount is never converted to a float
	dec.Token()     // the object is known to be valid, so nothing below can fail
	for dec.More() {
		name, _ := dec.Token()
		var value any
		dec.Decode(&value)
		f.add(name.(string), value, known)
	}
	return f, nil
}

// readQuery reads a query string as readObject reads a body.
func readQuery(raw string, known ...string) *fields {
	f := &fields{values: map[string]any{}, problems: map[string]string{}}
	values, err := url.ParseQuery(raw)
	if err != nil {
		f.fail("query", "is not a valid URL query string")
	}
	for name, given := range values {
		for _, value := range given {
			f.add(name, value, known)
		}
	}
	return f
}

// add records value for name, unless name is unknown or was already given. When an unknown name
// matches a known one except for case, the problem suggests the known name.
func (f *fields) add(name string, value any, known []string) {
	_, repeated := f.values[name]
	i := slices.IndexFunc(known, func(k string) bool { return strings.EqualFold(k, name) })
	switch {
	case i >= 0 && known[i] != name:
		f.fail(name, fmt.Sprintf("unknown name; did you mean %q?", known[i]))
	case i < 0:
		f.fail(name, "unknown name")
	case repeated:
		f.fail(name, "is given more than once")
	default:
		f.values[name] = value
	}
}

// str returns name's value and whether it is a string. A value of another type is a problem.
func (f *fields) str(name string) (string, bool) {
	s, ok := f.values[name].(string)
	if !ok && f.has(name) {
		f.fail(name, "must be a string")
	}
	return s, ok
}

// oneOf returns name's string when it is exactly one of allowed, and "" otherwise. When the
// string differs from an allowed value only in case, the problem gives the exact spelling.
func (f *fields) oneOf(name string, allowed ...string) string {
	s, ok := f.str(name)
	if !ok || slices.Contains(allowed, s) {
		return s
	}
	i := slices.IndexFunc(allowed, func(a string) bool { return strings.EqualFold(a, s) })
	if i >= 0 {
		f.fail(name, fmt.Sprintf("must be exactly %q", allowed[i]))
	} else {
		f.fail(name, fmt.Sprintf("must be one of %q", allowed))
	}
	return ""
}

// --- create and update ---

// decodeCreate reads a create body into a new button, or refuses it with an invalid_request error
// that names every field that breaks a rule.
func decodeCreate(r *http.Request) (button, error) {
	f, err := readObject(r, createFields)
	if err != nil {
		return button{}, err
	}
	for _, name := range []string{"productName", "amount", "currency", "paymentMethod",
		"paymentType", "isLive"} {
		if !f.has(name) {
			f.fail(name, "is required")
		}
	}
	isLive, isBool := f.values["isLive"].(bool)
	if !isBool && f.has("isLive") {
		f.fail("isLive", "must be a boolean") // so the string "true" is refused
	}
	b := button{
		BillingInterval: orNil(f.oneOf("billingInterval", billingIntervals...)),
		PaymentMethod:   f.oneOf("paymentMethod", paymentMethods...),
		PaymentType:     f.oneOf("paymentType", "one_time", "subscription"),
		IsLive:          isLive,
	}
	if b.PaymentType == "subscription" && !f.has("billingInterval") {
		f.fail("billingInterval", "is required when paymentType is subscription")
	} else if b.PaymentType == "one_time" && f.has("billingInterval") {
		f.fail("billingInterval", "must be absent when paymentType is one_time")
	}
	if b.PaymentMethod == "StripeConnect" && !f.has(feeField) {
		f.fail(feeField, "is required when paymentMethod is StripeConnect")
	}
	// Check the fields that an update can also change, by the same rules. The fee rule reads
	// b.PaymentMethod, which is set above.
	err = f.apply(&b)
	return b, err
}

// decodeUpdate reads an update body and refuses it if its form is wrong. apply then checks its
// values against the button they change.
func decodeUpdate(r *http.Request) (*fields, error) {
	f, err := readObject(r, createFields)
	if err != nil {
		return nil, err
	}
	for _, name := range fixedFields {
		if f.has(name) {
			f.fail(name, "cannot be changed by update")
		}
	}
	_, clears := f.values["description"] // unlike any other field, null here clears it
	if !clears && !slices.ContainsFunc(updateFields, f.has) && len(f.problems) == 0 {
		f.fail("body", "has no field to update")
	}
	return f, invalid(f.problems)
}

// apply sets in b the fields that create and update share, or refuses the body with every problem
// found in it; then b is left as it was. The amount must fit the currency the button will have,
// and a new currency needs a new amount. The fee is allowed on a StripeConnect button only.
// Metadata is merged key by key.
func (f *fields) apply(b *button) error {
	next := *b
	if f.has("productName") {
		next.ProductName = f.productName()
	}
	if _, given := f.values["description"]; given {
		next.Description = orNil(f.description())
	}
	if f.has("currency") {
		next.Currency = f.currency() // "" if refused: the amount is then checked for its form only
	}
	if f.has("amount") {
		next.Amount = f.amount(next.Currency)
	} else if next.Currency != b.Currency && next.Currency != "" {
		f.fail("amount", "is required when currency changes")
	}
	if f.has(feeField) { // a paymentMethod refused at create is "": the fee keeps its own checks
		next.Fee = orNil(f.fee(next.PaymentMethod))
	}
	next.Metadata = f.metadata(b.Metadata)
	if err := invalid(f.problems); err != nil {
		return err
	}
	*b = next
	return nil
}

// --- field rules (each returns the value to store, or "" if the field is absent or refused) ---

// productName returns the product name with surrounding space trimmed. It must contain a letter,
// digit, punctuation mark or symbol. It must not contain a bidirectional control, which could make
// a checkout page show a different name.
func (f *fields) productName() string {
	s, ok := f.str("productName")
	if !ok {
		return ""
	}
	s = strings.TrimSpace(s)
	if !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S)
	}) {
		f.fail("productName", "must have at least one letter, digit, punctuation mark or symbol")
		return ""
	}
	return f.text("productName", s, 250, func(r rune) bool {
		return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
	}, "control characters or bidirectional controls")
}

func (f *fields) description() string {
	s, _ := f.str("description")
	return f.text("description", s, 5000, func(r rune) bool {
		return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r)
	}, "control characters other than tab and line breaks")
}

// text returns s, the value of name, when s has at most max characters and none of them is bad or
// U+FFFD. No product's text means U+FFFD: it is what encoding/json reads a lone surrogate such as
// "\udfff" as.
func (f *fields) text(name, s string, max int, bad func(rune) bool, badWhy string) string {
	if n := utf8.RuneCountInString(s); n > max {
		f.fail(name, fmt.Sprintf("must be at most %d characters (it has %d)", max, n))
		return ""
	} else if strings.ContainsFunc(s, bad) {
		f.fail(name, "must not contain "+badWhy)
		return ""
	} else if strings.ContainsRune(s, utf8.RuneError) {
		f.fail(name, `must not contain U+FFFD, which a lone surrogate such as "\udfff" becomes`)
		return ""
	}
	return s
}

// currency returns an active ISO 4217 code, upper-cased.
func (f *fields) currency() string {
	s, ok := f.str("currency")
	if !ok {
		return ""
	} else if len(s) != 3 || !onlyOf(s, letters) {
		f.fail("currency", `must be a three-letter ISO 4217 code such as "USD"`)
		return ""
	}
	code := strings.ToUpper(s) // s is only ASCII letters, so no "ſ" can become "S"
	if _, active := currencyExponents[code]; !active {
		f.fail("currency", "is not an active ISO 4217 currency (no fund, metal or test codes)")
		return ""
	}
	return code
}

// amount returns the amount with as many decimal places as currency has: "19.90" USD, "500" JPY.
// When currency is "" (absent or refused), it checks only the amount's own form.
func (f *fields) amount(currency string) string {
	d, ok := f.decimal("amount")
	if !ok {
		return ""
	} else if d.whole == "" && d.frac == "" {
		f.fail("amount", "must be greater than zero")
		return ""
	} else if currency == "" { // nothing to check the amount against
		return ""
	}
	exp := currencyExponents[currency]
	if len(d.frac) > exp {
		f.fail("amount", fmt.Sprintf("cannot be expressed in %s, which has %d decimal places",
			currency, exp))
		return ""
	}
	n, fits := d.scaled(exp, maxAmountMinor)
	if !fits {
		f.fail("amount", fmt.Sprintf("is above the maximum of %s %s",
			formatScaled(maxAmountMinor, exp), currency))
		return ""
	}
	return formatScaled(n, exp)
}

// fee returns ApplicationFeePercentage with two decimal places, such as "2.50". The fee must be
// 0.01 to 100, with at most 2 decimal places, and only a StripeConnect button may have one. A
// method of "" was already refused for its own reason, so the fee is not refused because of it.
func (f *fields) fee(method string) string {
	d, ok := f.decimal(feeField)
	if !ok {
		return ""
	} else if method != "StripeConnect" && method != "" {
		f.fail(feeField, "is only allowed when paymentMethod is StripeConnect")
		return ""
	}
	basisPoints, fits := d.scaled(2, 10_000) // refuses a third decimal place
	if !fits || basisPoints == 0 {
		f.fail(feeField, "must be 0.01 to 100, with at most 2 decimal places")
		return ""
	}
	return formatScaled(basisPoints, 2)
}

// decimal returns name's value as a plain decimal, read from a JSON string or a JSON number's
// text. The bool is false when the value is absent or refused.
func (f *fields) decimal(name string) (decimal, bool) {
	text, isText := f.values[name].(string)
	if number, ok := f.values[name].(json.Number); ok {
		text, isText = number.String(), true
	}
	d, ok := parseDecimal(text)
	if !isText && f.has(name) {
		f.fail(name, "must be a string or a number")
	} else if !ok && f.has(name) {
		f.fail(name, `must be a plain decimal number such as "12.50" (no sign, exponent or spaces)`)
	}
	return d, ok
}

// metadata returns stored with the body's metadata merged in. A string value sets its key, and
// null or "" removes the key.
func (f *fields) metadata(stored map[string]string) map[string]string {
	merged := maps.Clone(stored)
	if merged == nil {
		merged = map[string]string{}
	}
	object, isObject := f.values["metadata"].(map[string]any)
	if f.has("metadata") && !isObject {
		f.fail("metadata", "must be an object of string keys to string values")
	}
	for _, key := range slices.Sorted(maps.Keys(object)) { // the same body, the same answer
		value := object[key]
		s, isString := value.(string)
		if len(key) < 1 || len(key) > 40 || !onlyOf(key, nameChars) {
			f.fail("metadata", fmt.Sprintf("has the key %.40q: a key is 1 to 40 of A-Z a-z 0-9 _-.",
				key))
		} else if !isString && value != nil {
			f.fail("metadata."+key, "must be a string, or null to remove the key")
		} else if s == "" {
			delete(merged, key)
		} else {
			merged[key] = f.text("metadata."+key, s, 500, unicode.IsControl, "control characters")
		}
	}
	if len(merged) > 50 {
		f.fail("metadata", fmt.Sprintf("must have at most 50 keys (it would have %d)", len(merged)))
	}
	return merged
}

// --- the list query and If-Match ---

// decodeListQuery reads the query string of a list request. It accepts limit (1 to 100, 20 by
// default), after, and the filters.
func decodeListQuery(raw string) (listQuery, error) {
	f := readQuery(raw, "limit", "after", "state", "isLive", "paymentMethod")
	q := listQuery{Limit: 20, State: "active"}
	if limit, ok := f.str("limit"); ok {
		n, err := strconv.Atoi(limit)
		if err != nil || !onlyOf(limit, digits) || n < 1 || n > 100 {
			f.fail("limit", "must be a whole number from 1 to 100")
		}
		q.Limit = n
	}
	q.After, _ = f.str("after")
	if q.After != "" && !validButtonID(q.After) {
		f.fail("after", "must be a button id: the next of the previous page")
	}
	if f.has("state") {
		q.State = f.oneOf("state", "active", "deleted", "all")
	}
	if isLive := f.oneOf("isLive", "true", "false"); isLive != "" {
		live := isLive == "true"
		q.IsLive = &live
	}
	q.PaymentMethod = f.oneOf("paymentMethod", paymentMethods...)
	return q, invalid(f.problems)
}

// parseIfMatch reads the If-Match header, which holds a version in quotes, as the ETag gives it.
// For no header or "*", it returns 0, which matches any version.
func parseIfMatch(header string) (int64, error) {
	if header == "" || header == "*" {
		return 0, nil
	}
	number, opened := strings.CutPrefix(header, `"`)
	number, closed := strings.CutSuffix(number, `"`)
	version, err := strconv.ParseInt(number, 10, 64)
	if !opened || !closed || err != nil || version < 1 || strconv.FormatInt(version, 10) != number {
		return 0, invalid(map[string]string{
			"If-Match": `must be a version in quotes, as the ETag gives it: "3"`})
	}
	return version, nil
}

// currencyExponents maps every active ISO 4217 currency (amendments through late 2026) to its
// number of decimal places. Fund, precious metal, testing and withdrawn codes are left out, because
// no button can charge them.
var currencyExponents = func() map[string]int {
	exponents := map[string]int{}
	for exp, codes := range []string{
		0: "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX VND VUV XAF XOF XPF",
		2: `AED AFN ALL AMD AOA ARS AUD AWG AZN BAM BBD BDT BMD BND BOB BRL BSD BTN BWP BYN BZD
			CAD CDF CHF CNY COP CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP
			GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR JMD
			KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP
			MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR
			RON RSD RUB SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS
			TMT TOP TRY TTD TWD TZS UAH USD UYU UZS VED VES WST XCD XCG YER ZAR ZMW ZWG`,
		3: "BHD IQD JOD KWD LYD OMR TND",
	} {
		for _, code := range strings.Fields(codes) {
			exponents[code] = exp
		}
	}
	return exponents
}()
