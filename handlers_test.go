package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testEnv is a real server on a real SQLite file, with one key for account
// "acme" and one for account "other".
type testEnv struct {
	t      testing.TB
	url    string
	store  *store
	dbPath string
	key    string // account acme
	keyID  string // id of key
	keyB   string // account other
}

// serverOptions are what a test may change about the server under test.
type serverOptions struct {
	providerName string
	rate         float64
	burst        int
}

func newTestServer(t testing.TB) *testEnv {
	t.Helper()
	return newTestServerWith(t, serverOptions{})
}

func newTestServerWith(t testing.TB, opts serverOptions) *testEnv {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "test.db")
	st, err := openStore(dbPath)
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	env := &testEnv{t: t, store: st, dbPath: dbPath}
	env.key, env.keyID = env.mintKey("acme")
	env.keyB, _ = env.mintKey("other")
	env.url = serveStore(t, st, opts)
	return env
}

// serveStore serves st over a real HTTP server until the test ends, then
// closes both, and returns the server's URL.
func serveStore(t testing.TB, st *store, opts serverOptions) string {
	t.Helper()
	if opts.providerName == "" {
		opts.providerName = "the service"
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(newServer(st, logger, opts.providerName, newRateLimiter(opts.rate, opts.burst)))
	t.Cleanup(func() {
		srv.Close()
		if err := st.close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return srv.URL
}

// mintKey creates a key for account and returns its secret and id.
func (e *testEnv) mintKey(account string) (secret, id string) {
	e.t.Helper()
	secret, id, err := e.store.createKey(context.Background(), account)
	if err != nil {
		e.t.Fatalf("createKey(%q): %v", account, err)
	}
	return secret, id
}

// response is what a test reads back from one request.
type response struct {
	status int
	header http.Header
	raw    []byte
	env    struct {
		IsSuccess bool              `json:"isSuccess"`
		Data      json.RawMessage   `json:"data"`
		Message   string            `json:"message"`
		Code      string            `json:"code"`
		Errors    map[string]string `json:"errors"`
	}
	request string // "METHOD path body", for failure messages
}

// dataString is the envelope's data as a string ("" if it is not one).
func (r response) dataString() string {
	var s string
	json.Unmarshal(r.env.Data, &s)
	return s
}

// do sends one request with key as X-API-KEY ("" for none) and decodes the
// envelope, failing the test if the body is not one.
func (e *testEnv) do(method, path, key, body string, headers ...string) response {
	e.t.Helper()
	r, err := callAPI(http.DefaultClient, method, e.url+path, key, body, headers...)
	if err != nil {
		e.t.Fatalf("%s: %v", r.request, err)
	}
	return r
}

// callAPI sends one request with key as X-API-KEY ("" for none) and headers
// as name, value pairs, and reads the envelope it is answered with.
func callAPI(client *http.Client, method, url, key, body string, headers ...string) (response, error) {
	r := response{request: method + " " + url + " " + body}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return r, err
	}
	// Without GetBody the transport never sends a request twice on its own
	// (it would, for one with an Idempotency-Key), so one call is one request.
	req.GetBody = nil
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.status, r.header = resp.StatusCode, resp.Header
	if r.raw, err = io.ReadAll(resp.Body); err != nil {
		return r, err
	}
	if err := json.Unmarshal(r.raw, &r.env); err != nil {
		return r, fmt.Errorf("body is not the envelope: %v: %s", err, r.raw)
	}
	return r, nil
}

// want checks status, isSuccess and code together.
func (r response) want(t testing.TB, status int, code string) {
	t.Helper()
	if r.status != status || r.env.IsSuccess != (status == 200) || r.env.Code != code {
		t.Fatalf("%s\ngot status %d isSuccess %v code %q, want %d %v %q\nbody: %s",
			r.request, r.status, r.env.IsSuccess, r.env.Code, status, status == 200, code, r.raw)
	}
}

// validCreate is a create body every test starts from; overrides replace or
// (with a nil value) remove fields.
func validCreate(overrides map[string]any) string {
	body := map[string]any{
		"productName":   "Pro plan",
		"description":   "Monthly access",
		"amount":        "19.90",
		"currency":      "USD",
		"paymentMethod": "Stripe",
		"paymentType":   "one_time",
		"isLive":        false,
	}
	for k, v := range overrides {
		if v == nil {
			delete(body, k)
		} else {
			body[k] = v
		}
	}
	b, _ := json.Marshal(body)
	return string(b)
}

// raw marks an override value that goes into the body as JSON text as it is.
type raw string

func (r raw) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// create makes a button for key and returns its id.
func (e *testEnv) create(key, body string) string {
	e.t.Helper()
	r := e.do("POST", "/product-payment/create", key, body)
	r.want(e.t, 200, "")
	return r.dataString()
}

// stored reads a button straight from the database, bypassing the API.
func (e *testEnv) stored(account, id string) (button, error) {
	return readStoredButton(e.store, account, id)
}

// readStoredButton reads account's button id from st's tables, or errNotFound.
func readStoredButton(st *store, account, id string) (button, error) {
	return scanButton(st.reader.QueryRow(`SELECT `+buttonColumns+` FROM buttons WHERE account = ? AND id = ?`, account, id))
}

// countButtons counts every row in the buttons table.
func (e *testEnv) countButtons() int {
	e.t.Helper()
	var n int
	if err := e.store.reader.QueryRow(`SELECT count(*) FROM buttons`).Scan(&n); err != nil {
		e.t.Fatalf("count buttons: %v", err)
	}
	return n
}

// getView reads a button through the API.
func (e *testEnv) getView(key, id string) map[string]any {
	e.t.Helper()
	r := e.do("GET", "/product-payment/get/"+id, key, "")
	r.want(e.t, 200, "")
	var v map[string]any
	if err := json.Unmarshal(r.env.Data, &v); err != nil {
		e.t.Fatalf("get data: %v", err)
	}
	return v
}

func TestCreateFieldRules(t *testing.T) {
	e := newTestServer(t)
	long := func(n int) string { return strings.Repeat("é", n) }
	tests := []struct {
		name      string
		overrides map[string]any
		wantField string // "" means the create succeeds
		check     func(b button) string
	}{
		{"productName 1 character", map[string]any{"productName": "x"}, "", nil},
		{"productName 250 characters", map[string]any{"productName": long(250)}, "", nil},
		{"productName 251 characters", map[string]any{"productName": long(251)}, "productName", nil},
		{"productName is trimmed", map[string]any{"productName": "  Pro  "}, "",
			func(b button) string { return cmp(b.ProductName, "Pro") }},
		{"productName blank", map[string]any{"productName": "   "}, "productName", nil},
		{"productName missing", map[string]any{"productName": nil}, "productName", nil},
		{"productName null", map[string]any{"productName": raw("null")}, "productName", nil},
		{"productName control character", map[string]any{"productName": "Pro\x07"}, "productName", nil},
		{"productName number", map[string]any{"productName": 5}, "productName", nil},
		{"description absent", map[string]any{"description": nil}, "",
			func(b button) string { return cmp(b.Description, "") }},
		{"description 5000 characters with newlines", map[string]any{"description": "a\tb\n" + strings.Repeat("d", 4996)}, "", nil},
		{"description 5001 characters", map[string]any{"description": strings.Repeat("d", 5001)}, "description", nil},
		{"description control character", map[string]any{"description": "a\x00b"}, "description", nil},
		{"amount as string", map[string]any{"amount": "10.50"}, "",
			func(b button) string { return cmp(b.AmountMinor, int64(1050)) }},
		{"amount as number keeps its text", map[string]any{"amount": raw("19.99")}, "",
			func(b button) string { return cmp(b.AmountMinor, int64(1999)) }},
		{"amount smallest USD", map[string]any{"amount": "0.01"}, "", nil},
		{"amount zero", map[string]any{"amount": "0.00"}, "amount", nil},
		{"amount three decimals USD", map[string]any{"amount": "1.001"}, "amount", nil},
		{"amount trailing zeros USD", map[string]any{"amount": "1.500"}, "",
			func(b button) string { return cmp(b.AmountMinor, int64(150)) }},
		{"amount negative", map[string]any{"amount": "-1"}, "amount", nil},
		{"amount exponent", map[string]any{"amount": raw("1e3")}, "amount", nil},
		{"amount with spaces", map[string]any{"amount": " 1.00"}, "amount", nil},
		{"amount 10^15 minor units", map[string]any{"amount": "10000000000000.00"}, "", nil},
		{"amount over 10^15 minor units", map[string]any{"amount": "10000000000000.01"}, "amount", nil},
		{"amount boolean", map[string]any{"amount": true}, "amount", nil},
		{"amount JPY whole", map[string]any{"amount": "500", "currency": "JPY"}, "",
			func(b button) string { return cmp(b.AmountMinor, int64(500)) }},
		{"amount JPY fraction", map[string]any{"amount": "500.5", "currency": "JPY"}, "amount", nil},
		{"amount KWD three decimals", map[string]any{"amount": "1.250", "currency": "KWD"}, "",
			func(b button) string { return cmp(b.AmountMinor, int64(1250)) }},
		{"amount KWD four decimals", map[string]any{"amount": "1.2501", "currency": "KWD"}, "amount", nil},
		{"currency lower case is stored upper", map[string]any{"currency": "eur"}, "",
			func(b button) string { return cmp(b.Currency, "EUR") }},
		{"currency unknown", map[string]any{"currency": "ABC"}, "currency", nil},
		{"currency metal", map[string]any{"currency": "XAU"}, "currency", nil},
		{"currency test code", map[string]any{"currency": "XTS"}, "currency", nil},
		{"currency missing", map[string]any{"currency": nil}, "currency", nil},
		{"subscription monthly", map[string]any{"paymentType": "subscription", "billingInterval": "Monthly"}, "",
			func(b button) string { return cmp(b.BillingInterval, "month") }},
		{"subscription annually", map[string]any{"paymentType": "subscription", "billingInterval": "annually"}, "",
			func(b button) string { return cmp(b.BillingInterval, "year") }},
		{"subscription without interval", map[string]any{"paymentType": "subscription"}, "billingInterval", nil},
		{"subscription bad interval", map[string]any{"paymentType": "subscription", "billingInterval": "fortnight"}, "billingInterval", nil},
		{"one_time with empty interval", map[string]any{"billingInterval": ""}, "", nil},
		{"one_time with interval", map[string]any{"billingInterval": "month"}, "billingInterval", nil},
		{"paymentType unknown", map[string]any{"paymentType": "once"}, "paymentType", nil},
		{"paymentMethod own processor", map[string]any{"paymentMethod": "the service"}, "",
			func(b button) string { return cmp(b.PaymentMethod, "the service") }},
		{"paymentMethod wrong case", map[string]any{"paymentMethod": "stripe"}, "paymentMethod", nil},
		{"paymentMethod unknown", map[string]any{"paymentMethod": "PayPal"}, "paymentMethod", nil},
		{"isLive true", map[string]any{"isLive": true}, "",
			func(b button) string { return cmp(b.IsLive, true) }},
		{"isLive as string", map[string]any{"isLive": "true"}, "isLive", nil},
		{"isLive missing", map[string]any{"isLive": nil}, "isLive", nil},
		{"fee 0.01", map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "0.01"}, "",
			func(b button) string { return cmp(b.FeeBasisPoints, int64(1)) }},
		{"fee 100", map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": raw("100")}, "",
			func(b button) string { return cmp(b.FeeBasisPoints, int64(10000)) }},
		{"fee 0", map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "0"}, "ApplicationFeePercentage", nil},
		{"fee 100.01", map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "100.01"}, "ApplicationFeePercentage", nil},
		{"fee three decimals", map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "2.505"}, "ApplicationFeePercentage", nil},
		{"fee missing for StripeConnect", map[string]any{"paymentMethod": "StripeConnect"}, "ApplicationFeePercentage", nil},
		{"fee with Stripe", map[string]any{"ApplicationFeePercentage": "2.50"}, "ApplicationFeePercentage", nil},
		{"fee name in wrong case", map[string]any{"paymentMethod": "StripeConnect", "applicationFeePercentage": "2.50"}, "applicationFeePercentage", nil},
		{"unknown field", map[string]any{"colour": "red"}, "colour", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.countButtons()
			body := validCreate(tt.overrides)
			r := e.do("POST", "/product-payment/create", e.key, body)
			if tt.wantField != "" {
				r.want(t, 400, "invalid_request")
				if _, ok := r.env.Errors[tt.wantField]; !ok {
					t.Errorf("%s\ngot errors %v, want one for %q", r.request, r.env.Errors, tt.wantField)
				}
				if got := e.countButtons(); got != before {
					t.Errorf("%s\ngot %d buttons stored, want %d", r.request, got, before)
				}
				return
			}
			r.want(t, 200, "")
			b, err := e.stored("acme", r.dataString())
			if err != nil {
				t.Fatalf("%s\nread back %q: %v", r.request, r.dataString(), err)
			}
			if tt.check != nil {
				if msg := tt.check(b); msg != "" {
					t.Errorf("%s\n%s", r.request, msg)
				}
			}
		})
	}
}

// cmp returns "" when got equals want, else a failure message.
func cmp[T comparable](got, want T) string {
	if got == want {
		return ""
	}
	return fmt.Sprintf("got %v, want %v", got, want)
}

func TestCreateReportsEveryFailingField(t *testing.T) {
	e := newTestServer(t)
	r := e.do("POST", "/product-payment/create", e.key,
		`{"productName":"","amount":"-1","currency":"usd","paymentMethod":"Stripe","paymentType":"one_time","isLive":"yes"}`)
	r.want(t, 400, "invalid_request")
	var got []string
	for k := range r.env.Errors {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := []string{"amount", "isLive", "productName"}; !slices.Equal(got, want) {
		t.Errorf("got failing fields %v, want %v", got, want)
	}
	if r.dataString() != "" || string(r.env.Data) != `""` {
		t.Errorf(`got data %s, want ""`, r.env.Data)
	}
}

func TestCreateBodyDecoding(t *testing.T) {
	e := newTestServer(t)
	tests := []struct {
		name, body, wantField string
	}{
		{"duplicate field", `{"productName":"a","productName":"b","amount":"1","currency":"USD","paymentMethod":"Stripe","paymentType":"one_time","isLive":true}`, "productName"},
		{"trailing data", validCreate(nil) + `{}`, "body"},
		{"not an object", `["productName"]`, "body"},
		{"empty body", ``, "body"},
		{"broken JSON", `{"productName":`, "body"},
		{"invalid UTF-8", strings.Replace(validCreate(nil), "Pro plan", "Pro \xff plan", 1), "body"},
		{"lone surrogate", strings.Replace(validCreate(nil), "Pro plan", `Pro \ud800 plan`, 1), "productName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", "/product-payment/create", e.key, tt.body)
			r.want(t, 400, "invalid_request")
			if _, ok := r.env.Errors[tt.wantField]; !ok {
				t.Errorf("%s\ngot errors %v, want one for %q", r.request, r.env.Errors, tt.wantField)
			}
			if n := e.countButtons(); n != 0 {
				t.Errorf("got %d buttons stored, want 0", n)
			}
		})
	}
	t.Run("did you mean", func(t *testing.T) {
		r := e.do("POST", "/product-payment/create", e.key, validCreate(map[string]any{"ProductName": "x"}))
		r.want(t, 400, "invalid_request")
		if got := r.env.Errors["ProductName"]; !strings.Contains(got, `"productName"`) {
			t.Errorf(`got %q, want a suggestion of "productName"`, got)
		}
	})
}

func TestProviderNameFlagNamesTheOwnProcessor(t *testing.T) {
	e := newTestServerWith(t, serverOptions{providerName: "Acme Pay"})
	id := e.create(e.key, validCreate(map[string]any{"paymentMethod": "Acme Pay"}))
	if v := e.getView(e.key, id); v["paymentMethod"] != "Acme Pay" {
		t.Errorf("got paymentMethod %v, want Acme Pay", v["paymentMethod"])
	}
	r := e.do("POST", "/product-payment/create", e.key, validCreate(map[string]any{"paymentMethod": "the service"}))
	r.want(t, 400, "invalid_request")
}

func TestGetRendersTheButton(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(map[string]any{
		"amount": "1.25", "currency": "kwd", "paymentMethod": "StripeConnect", "ApplicationFeePercentage": "2.5",
		"paymentType": "subscription", "billingInterval": "WEEKLY", "isLive": true, "description": nil,
	}))
	r := e.do("GET", "/product-payment/get/"+id, e.key, "")
	r.want(t, 200, "")
	if got := r.header.Get("ETag"); got != `"1"` {
		t.Errorf(`got ETag %q, want "1"`, got)
	}
	var v map[string]any
	json.Unmarshal(r.env.Data, &v)
	want := map[string]any{
		"id": id, "productName": "Pro plan", "description": nil, "amount": "1.250", "currency": "KWD",
		"billingInterval": "week", "paymentMethod": "StripeConnect", "paymentType": "subscription",
		"isLive": true, "ApplicationFeePercentage": "2.50", "state": "active", "version": float64(1),
		"deletedAt": nil,
	}
	for k, w := range want {
		if v[k] != w {
			t.Errorf("got %s %v, want %v", k, v[k], w)
		}
	}
	for _, k := range []string{"createdAt", "updatedAt"} {
		if s, _ := v[k].(string); !strings.HasSuffix(s, "Z") || len(s) != len("2006-01-02T15:04:05.000Z") {
			t.Errorf("got %s %v, want RFC 3339 UTC with milliseconds", k, v[k])
		}
	}
	if len(v) != 15 {
		t.Errorf("got %d fields in the button, want 15: %v", len(v), v)
	}
}

func TestUpdate(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))

	r := e.do("POST", "/product-payment/update/"+id, e.key, `{"productName":" New name ","amount":"12.00","description":null}`)
	r.want(t, 200, "")
	if r.dataString() != id || r.env.Message != "updated" {
		t.Errorf("got data %q message %q, want %q updated", r.dataString(), r.env.Message, id)
	}
	b, _ := e.stored("acme", id)
	if b.ProductName != "New name" || b.AmountMinor != 1200 || b.Description != "" || b.Currency != "USD" || b.Version != 2 {
		t.Errorf("got %+v, want name, amount changed, description cleared, currency kept, version 2", b)
	}

	rejected := []struct{ name, body, field string }{
		{"empty object", `{}`, "body"},
		{"paymentMethod cannot change", `{"paymentMethod":"StripeConnect"}`, "paymentMethod"},
		{"isLive cannot change", `{"isLive":true}`, "isLive"},
		{"billingInterval cannot change", `{"billingInterval":"month"}`, "billingInterval"},
		{"paymentType cannot change", `{"paymentType":"subscription"}`, "paymentType"},
		{"amount not expressible in new currency", `{"currency":"JPY","amount":"12.50"}`, "amount"},
		{"fee on a Stripe button", `{"ApplicationFeePercentage":"2.00"}`, "ApplicationFeePercentage"},
		{"productName too long", `{"productName":"` + strings.Repeat("x", 251) + `"}`, "productName"},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", "/product-payment/update/"+id, e.key, tt.body)
			r.want(t, 400, "invalid_request")
			if _, ok := r.env.Errors[tt.field]; !ok {
				t.Errorf("%s\ngot errors %v, want one for %q", r.request, r.env.Errors, tt.field)
			}
			after, _ := e.stored("acme", id)
			if after != b {
				t.Errorf("%s\nbutton changed: got %+v, want %+v", r.request, after, b)
			}
		})
	}

	t.Run("currency change keeps an amount that fits", func(t *testing.T) {
		r := e.do("POST", "/product-payment/update/"+id, e.key, `{"currency":"jpy"}`)
		r.want(t, 200, "")
		b, _ := e.stored("acme", id)
		if b.Currency != "JPY" || b.AmountMinor != 12 {
			t.Errorf("got %s %d, want JPY 12", b.Currency, b.AmountMinor)
		}
	})
	t.Run("currency change to one the amount does not fit", func(t *testing.T) {
		other := e.create(e.key, validCreate(map[string]any{"amount": "10.50"}))
		r := e.do("POST", "/product-payment/update/"+other, e.key, `{"currency":"JPY"}`)
		r.want(t, 400, "invalid_request")
		b, _ := e.stored("acme", other)
		if b.Currency != "USD" || b.AmountMinor != 1050 {
			t.Errorf("got %s %d, want USD 1050 unchanged", b.Currency, b.AmountMinor)
		}
	})
	t.Run("fee on a StripeConnect button", func(t *testing.T) {
		connect := e.create(e.key, validCreate(map[string]any{"paymentMethod": "StripeConnect", "ApplicationFeePercentage": "1"}))
		e.do("POST", "/product-payment/update/"+connect, e.key, `{"ApplicationFeePercentage":"99.99"}`).want(t, 200, "")
		b, _ := e.stored("acme", connect)
		if b.FeeBasisPoints != 9999 {
			t.Errorf("got fee %d basis points, want 9999", b.FeeBasisPoints)
		}
	})
}

func TestStateMachine(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))
	steps := []struct {
		method, path, body string
		status             int
		code, state        string
		version            int64
	}{
		{"POST", "/product-payment/restore/", "", 409, "wrong_state", "active", 1},
		{"DELETE", "/product-payment/delete/", "", 200, "", "deleted", 2},
		{"DELETE", "/product-payment/delete/", "", 409, "wrong_state", "deleted", 2},
		{"POST", "/product-payment/update/", `{"amount":"5.00"}`, 409, "wrong_state", "deleted", 2},
		{"POST", "/product-payment/restore/", "", 200, "", "active", 3},
		{"POST", "/product-payment/update/", `{"amount":"5.00"}`, 200, "", "active", 4},
	}
	for i, s := range steps {
		r := e.do(s.method, s.path+id, e.key, s.body)
		r.want(t, s.status, s.code)
		b, err := e.stored("acme", id)
		if err != nil || b.State != s.state || b.Version != s.version {
			t.Fatalf("step %d %s: got state %q version %d (%v), want %q %d", i, r.request, b.State, b.Version, err, s.state, s.version)
		}
		if (b.State == stateDeleted) == b.DeletedAt.IsZero() {
			t.Errorf("step %d: got deletedAt %v with state %q", i, b.DeletedAt, b.State)
		}
	}
	// A deleted button can still be read.
	e.do("DELETE", "/product-payment/delete/"+id, e.key, "").want(t, 200, "")
	if v := e.getView(e.key, id); v["state"] != "deleted" || v["deletedAt"] == nil {
		t.Errorf("got state %v deletedAt %v, want deleted with a time", v["state"], v["deletedAt"])
	}
}

func TestTenancy(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))
	before, _ := e.stored("acme", id)
	for _, op := range []struct{ method, path, body string }{
		{"GET", "/product-payment/get/", ""},
		{"POST", "/product-payment/update/", `{"amount":"1.00"}`},
		{"DELETE", "/product-payment/delete/", ""},
		{"POST", "/product-payment/restore/", ""},
	} {
		e.do(op.method, op.path+id, e.keyB, op.body).want(t, 404, "not_found")
	}
	// Account other's create makes a button of its own, invisible to acme.
	otherID := e.create(e.keyB, validCreate(nil))
	e.do("GET", "/product-payment/get/"+otherID, e.key, "").want(t, 404, "not_found")
	after, err := e.stored("acme", id)
	if err != nil || after != before {
		t.Errorf("got %+v (%v), want acme's button unchanged: %+v", after, err, before)
	}
	if b, err := e.stored("other", otherID); err != nil || b.Account != "other" {
		t.Errorf("got %+v (%v), want other's button", b, err)
	}
}

func TestStatusCodes(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))
	tests := []struct {
		name, method, path, key, body string
		headers                       []string
		status                        int
		code                          string
	}{
		{"missing key", "GET", "/product-payment/get/" + id, "", "", nil, 401, "unauthorized"},
		{"unknown key", "GET", "/product-payment/get/" + id, "pbk_nope", "", nil, 401, "unauthorized"},
		{"unknown id", "GET", "/product-payment/get/btn_01JD0000000000000000000000", e.key, "", nil, 404, "not_found"},
		{"malformed id", "GET", "/product-payment/get/42", e.key, "", nil, 404, "not_found"},
		{"unknown path", "GET", "/nope", e.key, "", nil, 404, "not_found"},
		{"dot-dot path is not redirected", "GET", "/product-payment/get/../create", e.key, "", nil, 404, "not_found"},
		{"double slash is not redirected", "GET", "/product-payment//get/" + id, e.key, "", nil, 404, "not_found"},
		{"encoded dot segment", "GET", "/product-payment/get/%2e%2e/x", e.key, "", nil, 404, "not_found"},
		{"trailing slash", "POST", "/product-payment/create/", e.key, validCreate(nil), nil, 404, "not_found"},
		{"wrong method", "GET", "/product-payment/create", e.key, "", nil, 405, "method_not_allowed"},
		{"not JSON", "POST", "/product-payment/create", e.key, validCreate(nil), []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"JSON with charset", "POST", "/product-payment/create", e.key, validCreate(nil), []string{"Content-Type", "application/json; charset=utf-8"}, 200, ""},
		{"a +json type", "POST", "/product-payment/create", e.key, validCreate(nil), []string{"Content-Type", "application/vnd.paybuttons+json"}, 200, ""},
		{"too large", "POST", "/product-payment/create", e.key, validCreate(map[string]any{"description": strings.Repeat("x", 70_000)}), nil, 413, "payload_too_large"},
		{"auth before body", "POST", "/product-payment/create", "", "{", nil, 401, "unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.countButtons()
			r := e.do(tt.method, tt.path, tt.key, tt.body, tt.headers...)
			r.want(t, tt.status, tt.code)
			if tt.status != 200 && e.countButtons() != before {
				t.Errorf("%s stored a button", r.request)
			}
			if tt.status == 405 && r.header.Get("Allow") != "POST" {
				t.Errorf("got Allow %q, want POST", r.header.Get("Allow"))
			}
		})
	}
}

func TestHeadersOnEveryResponse(t *testing.T) {
	e := newTestServer(t)
	for _, r := range []response{
		e.do("POST", "/product-payment/create", e.key, validCreate(nil)),
		e.do("GET", "/nope", "", ""),
		e.do("PUT", "/product-payment/create", e.key, ""),
		e.do("GET", "/product-payment/get/x", "", ""),
	} {
		for header, want := range map[string]string{
			"Content-Type":           "application/json",
			"Cache-Control":          "no-store",
			"X-Content-Type-Options": "nosniff",
		} {
			if got := r.header.Get(header); got != want {
				t.Errorf("%s: got %s %q, want %q", r.request, header, got, want)
			}
		}
		if !strings.HasPrefix(r.header.Get("X-Request-Id"), "req_") {
			t.Errorf("%s: got X-Request-Id %q, want a new req_ id", r.request, r.header.Get("X-Request-Id"))
		}
	}
	if got := e.do("GET", "/nope", "", "", "X-Request-Id", "trace-42").header.Get("X-Request-Id"); got != "trace-42" {
		t.Errorf("got X-Request-Id %q, want the caller's trace-42 echoed", got)
	}
	if got := e.do("GET", "/nope", "", "", "X-Request-Id", "bad id\u00e9").header.Get("X-Request-Id"); !strings.HasPrefix(got, "req_") {
		t.Errorf("got X-Request-Id %q, want a new id in place of an insane one", got)
	}
}

func TestHeadAnswersLikeGetWithoutABody(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))
	req, _ := http.NewRequest("HEAD", e.url+"/product-payment/get/"+id, nil)
	req.Header.Set("X-API-KEY", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"1"` || len(body) != 0 {
		t.Errorf("HEAD: got %d ETag %q and %d body bytes, want 200, \"1\" and none", resp.StatusCode, resp.Header.Get("ETag"), len(body))
	}
}

func TestRateLimit(t *testing.T) {
	e := newTestServerWith(t, serverOptions{rate: 0.001, burst: 2})
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	e.do("GET", "/product-payment/get/x", e.key, "").want(t, 404, "not_found")
	r := e.do("POST", "/product-payment/create", e.key, validCreate(nil))
	r.want(t, 429, "rate_limited")
	if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 1 {
		t.Errorf("got Retry-After %q on a 429, want whole seconds, at least 1", r.header.Get("Retry-After"))
	}
	if n := e.countButtons(); n != 0 {
		t.Errorf("got %d buttons after a 429, want 0", n)
	}
	// Each key has its own bucket.
	e.do("GET", "/product-payment/get/x", e.keyB, "").want(t, 404, "not_found")
}

func TestRevokedKeyStopsOnTheNextRequest(t *testing.T) {
	e := newTestServer(t)
	spare, _ := e.mintKey("acme")
	id := e.create(e.key, validCreate(nil))
	// Revoke from another process's point of view: the CLI opens the file itself.
	var out bytes.Buffer
	if err := run(context.Background(), []string{"paybuttons", "keys", "revoke", "-db", e.dbPath, e.keyID}, noEnv, &out, io.Discard); err != nil {
		t.Fatalf("keys revoke: %v", err)
	}
	r := e.do("GET", "/product-payment/get/"+id, e.key, "")
	r.want(t, 401, "unauthorized")
	if unknown := e.do("GET", "/product-payment/get/"+id, "pbk_unknown", ""); unknown.env.Message != r.env.Message {
		t.Errorf("got %q for a revoked key and %q for an unknown one, want the same", r.env.Message, unknown.env.Message)
	}
	// Rotation: the account's other key still works.
	e.getView(spare, id)
}

func noEnv(string) string { return "" }

func TestRestartKeepsEverything(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, validCreate(nil))
	e.do("POST", "/product-payment/update/"+id, e.key, `{"amount":"7.00"}`).want(t, 200, "")
	want, _ := e.stored("acme", id)
	if err := e.store.close(); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(e.dbPath)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer st.close()
	got, err := readStoredButton(st, "acme", id)
	if err != nil || got != want {
		t.Errorf("after restart got %+v (%v), want %+v", got, err, want)
	}
	if _, err := st.authenticate(context.Background(), e.key); err != nil {
		t.Errorf("after restart the key does not authenticate: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe to read while run writes to it.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

// running is a run(...) serving in the background.
type running struct {
	url    string
	stderr *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

// startRun starts run with "serve" args and waits until it listens. The
// server is stopped when the test ends, if stop was not called before.
func startRun(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{stderr: newSyncBuffer(), cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- run(ctx, append([]string{"paybuttons", "-addr", "127.0.0.1:0"}, args...), noEnv, io.Discard, r.stderr)
	}()
	t.Cleanup(func() { r.stop() })
	for i := 0; i < 1000; i++ {
		if r.url = listeningURL(r.stderr.String()); r.url != "" {
			return r
		}
		select {
		case err := <-r.done:
			t.Fatalf("run returned early: %v\n%s", err, r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("run did not say where it listens:\n%s", r.stderr.String())
	return nil
}

// listeningURL finds the address of the "listening" log line, text or JSON.
func listeningURL(logs string) string {
	for _, line := range strings.Split(logs, "\n") {
		if _, after, ok := strings.Cut(line, "url="); ok {
			return strings.Fields(after)[0]
		}
		var entry struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" {
			return entry.URL
		}
	}
	return ""
}

// stop cancels run's context and returns what run returned.
func (r *running) stop() error {
	r.cancel()
	err, ok := <-r.done
	if ok {
		close(r.done)
	}
	return err
}

// mintedKey is the first-start key run printed on a line of its own, or "".
func (r *running) mintedKey() string {
	for _, line := range strings.Split(r.stderr.String(), "\n") {
		if strings.HasPrefix(line, "pbk_") {
			return line
		}
	}
	return ""
}

func TestRunServesAndStopsCleanly(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "run.db")
	srv := startRun(t, "-db", dbPath)
	key := srv.mintedKey()
	if key == "" {
		t.Fatalf("got no key on stderr:\n%s", srv.stderr.String())
	}
	req, _ := http.NewRequest("POST", srv.url+"/product-payment/create", strings.NewReader(validCreate(nil)))
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("got create status %d with the minted key, want 200", resp.StatusCode)
	}
	if err := srv.stop(); err != nil {
		t.Fatalf("got run error %v, want nil", err)
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://")); err == nil {
		t.Error("the port still accepts connections after run returned")
	}
	// A second start prints no key: one exists.
	again := startRun(t, "-db", dbPath)
	if err := again.stop(); err != nil {
		t.Fatalf("second run: %v", err)
	}
	if strings.Contains(again.stderr.String(), "pbk_") {
		t.Errorf("second start printed a key:\n%s", again.stderr.String())
	}
}
