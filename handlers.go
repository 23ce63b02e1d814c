package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mathrand "math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
)

const maxBodyBytes = 64 << 10 // every request body's cap (64 KiB)

var errNoPath = &apiError{code: "not_found", message: "no such path"}

// statusOf is the one table from an error's code to its HTTP status.
var statusOf = map[string]int{
	"invalid_request":        http.StatusBadRequest,
	"unauthorized":           http.StatusUnauthorized,
	"forbidden":              http.StatusForbidden,
	"not_found":              http.StatusNotFound,
	"method_not_allowed":     http.StatusMethodNotAllowed,
	"wrong_state":            http.StatusConflict,
	"idempotency_in_flight":  http.StatusConflict,
	"precondition_failed":    http.StatusPreconditionFailed,
	"payload_too_large":      http.StatusRequestEntityTooLarge,
	"unsupported_media_type": http.StatusUnsupportedMediaType,
	"idempotency_mismatch":   http.StatusUnprocessableEntity,
	"rate_limited":           http.StatusTooManyRequests,
	"canceled":               499, // the client went away: nobody reads this answer, the access log does
	"internal":               http.StatusInternalServerError,
	"unavailable":            http.StatusServiceUnavailable,
}

// config is what the command line decides about the API.
type config struct {
	providerName string  // the own processor's paymentMethod value
	rate         float64 // requests a second per key, 0 for no limit
	burst        int
	metrics      bool // serve /metrics
}

// server holds what the handlers share. There is no package-level state.
type server struct {
	http.Handler
	store        storage
	log          *slog.Logger
	providerName string
	limiter      *rateLimiter // per API key
	failures     *rateLimiter // failed authentications, per client address
	goodKeys     sync.Map     // SHA-256 -> apiKey of keys that authenticated: no failure limit, a write's key
	keysLoaded   atomic.Int64 // when goodKeys was last loaded from the database, in Unix nanoseconds
	inFlight     sync.Map     // account and Idempotency-Key of writes still running
	metrics      metrics
	shares       sync.Map // account -> its shares of the reader connections (see share)
	stopping     context.Context
	stop         context.CancelFunc // answers every request waiting on the change feed at once
}

// newServer returns the whole HTTP API. Every response, the mux's own 404 and 405 included, is the JSON envelope,
// but /openapi.json and /metrics.
func newServer(st storage, log *slog.Logger, cfg config) *server {
	s := &server{store: st, log: log, providerName: cfg.providerName, limiter: newRateLimiter(cfg.rate, cfg.burst),
		failures: newRateLimiter(20, 100), metrics: metrics{routes: map[string]*routeMetrics{}}}
	s.stopping, s.stop = context.WithCancel(context.Background())
	mux := http.NewServeMux()
	allowed := map[string]string{} // path -> the methods its route answers, for a 405's Allow
	route := func(pattern string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		allowed[path] = strings.Replace(method, "GET", "GET, HEAD", 1)
		mux.Handle(pattern, h)
	}
	route("POST /product-payment/create", s.keyed(true, s.handleCreate))
	route("GET /product-payment/get/{id}", s.handleGet) // checks the key in its own query
	route("GET /product-payment/list", s.keyed(false, s.handleList))
	route("GET /product-payment/history/{id}", s.keyed(false, s.handleHistory))
	route("GET /product-payment/changes", s.keyed(false, s.handleChanges))
	route("POST /product-payment/update/{id}", s.keyed(true, s.handleUpdate))
	route("DELETE /product-payment/delete/{id}", s.keyed(true, s.changeState("delete", "deleted")))
	route("POST /product-payment/restore/{id}", s.keyed(true, s.changeState("restore", "restored")))
	route("GET /healthz", s.handleHealth)
	route("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) { w.Write(openAPIDocument) })
	if cfg.metrics {
		route("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8") // Prometheus text format
			s.metrics.write(w, s.store)
		})
	}
	for path, methods := range allowed { // a path without a method: every method its route does not answer
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", methods)
			s.writeError(w, r, &apiError{code: "method_not_allowed",
				message: "method " + r.Method + " is not allowed here; allowed: " + methods})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { s.writeError(w, r, errNoPath) })
	s.Handler = s.withBasics(mux)
	return s
}

// openAPIDocument is the API's OpenAPI 3.1 description, served as it is.
//
//go:embed openapi.json
var openAPIDocument []byte

// handleHealth answers 200 when the database answers, 503 when it does not or refuses writes.
func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ping(ctx); err != nil {
		s.writeError(w, r, &apiError{code: "unavailable", message: "the database does not answer", cause: err})
		return
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: "ok", Message: "the database answers"})
}

// --- handlers, one per operation ---

func (s *server) handleCreate(w http.ResponseWriter, r *http.Request, who actor) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	b, refusal := decodeCreate(body, s.providerName)
	s.respond(w, r, who, body, "created", refusal, func(who actor) (outcome, error) {
		return s.store.createButton(r.Context(), who, b)
	})
}

func (s *server) handleGet(w http.ResponseWriter, r *http.Request) {
	var b button
	_, ok := s.admit(w, r, false, func(ctx context.Context, secret string) (key apiKey, err error) {
		key, b, err = s.store.getButtonWithKey(ctx, secret, r.PathValue("id"))
		return key, err
	})
	switch {
	case !ok:
	case b.ID == "":
		s.writeError(w, r, errNotFound)
	default:
		w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(b.Version, 10)))
		s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: viewOf(b), Message: "ok"})
	}
}

// page is the data of every answer that lists: the items, whether more follow, and the cursor that asks for them.
type page[T, C any] struct {
	Items   []T  `json:"items"`
	HasMore bool `json:"hasMore"`
	Next    C    `json:"next"`
}

func (s *server) handleList(w http.ResponseWriter, r *http.Request, who actor) {
	f, err := decodeListQuery(r.URL.RawQuery, s.providerName)
	release, ok := s.share(w, r, who.Account, err)
	if !ok {
		return
	}
	defer release()
	limit := f.Limit
	f.Limit++ // one more than asked says whether there is a next page
	buttons, scanEnd, err := s.store.listButtons(r.Context(), who.Account, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := page[buttonView, *string]{HasMore: len(buttons) > limit || scanEnd != ""}
	if len(buttons) > limit {
		buttons, scanEnd = buttons[:limit], buttons[limit-1].ID
	}
	if data.HasMore {
		data.Next = &scanEnd
	}
	data.Items = viewsOf(buttons)
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: data, Message: "ok"})
}

// historyItem is one change as the history endpoint shows it.
type historyItem struct {
	Version   int64             `json:"version"`
	At        timestamp         `json:"at"`
	Action    string            `json:"action"`
	KeyID     string            `json:"keyId"`
	RequestID string            `json:"requestId"`
	Changes   map[string]change `json:"changes"`
}

type change struct {
	From any `json:"from"`
	To   any `json:"to"`
}

func (s *server) handleHistory(w http.ResponseWriter, r *http.Request, who actor) {
	limit, after, err := decodeHistoryQuery(r.URL.RawQuery)
	release, ok := s.share(w, r, who.Account, err)
	if !ok {
		return
	}
	defer release()
	entries, current, err := s.store.buttonHistory(r.Context(), who.Account, r.PathValue("id"), after, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := page[historyItem, *int64]{Items: make([]historyItem, len(entries))}
	for i, e := range entries {
		was, is := map[string]any{}, auditedFields(e.After)
		if e.Action != "create" {
			was = auditedFields(e.Before)
		}
		data.Items[i] = historyItem{Version: e.Version, At: e.At, Action: e.Action, KeyID: e.KeyID,
			RequestID: e.RequestID, Changes: map[string]change{}}
		for name, to := range is {
			if from := was[name]; from != to {
				data.Items[i].Changes[name] = change{from, to}
			}
		}
		for name, from := range was { // metadata keys the change removed
			if _, kept := is[name]; !kept {
				data.Items[i].Changes[name] = change{from, nil}
			}
		}
	}
	if n := len(data.Items); n > 0 && data.Items[n-1].Version < current {
		data.HasMore, data.Next = true, &data.Items[n-1].Version
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: data, Message: "ok"})
}

// auditedFields are a button's fields as get renders them, the ones history reports changes of (the id, version,
// changeSeq and times are left out), each metadata key on its own as "metadata.KEY".
func auditedFields(b button) map[string]any {
	var fields map[string]any
	view, _ := json.Marshal(viewOf(b))
	json.Unmarshal(view, &fields)
	for _, name := range []string{"id", "metadata", "version", "changeSeq", "createdAt", "updatedAt", "deletedAt"} {
		delete(fields, name)
	}
	for key, value := range b.Metadata {
		fields["metadata."+key] = value
	}
	return fields
}

// handleChanges answers the change feed: the account's buttons changed after since, each once, as it is now, in the
// order of their last change. With wait, a request that finds nothing holds, on no connection and with no polling,
// until the writer commits a change of this account, the wait ends, or the server shuts down.
func (s *server) handleChanges(w http.ResponseWriter, r *http.Request, who actor) {
	since, limit, wait, err := decodeChangesQuery(r.URL.RawQuery)
	deadline := time.Now().Add(wait) // the server's write timeout counts from there, not from the request
	http.NewResponseController(w).SetWriteDeadline(deadline.Add(15 * time.Second))
	var buttons []button
	for {
		release, ok := s.share(w, r, who.Account, err) // err: the query's problems, then nil
		if !ok {
			return
		}
		changed := s.store.watch(who.Account) // watched before the read: no commit falls between
		buttons, err = s.store.changes(r.Context(), who.Account, since, limit+1)
		release() // held for the read, not while waiting
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if len(buttons) > 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
		case <-r.Context().Done():
		case <-s.stopping.Done():
			deadline = time.Now()
		}
	}
	data := page[buttonView, int64]{HasMore: len(buttons) > int(limit), Next: since}
	buttons = buttons[:min(len(buttons), int(limit))]
	if len(buttons) > 0 {
		data.Next = buttons[len(buttons)-1].ChangeSeq
	}
	data.Items = viewsOf(buttons)
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: data, Message: "ok"})
}

func (s *server) handleUpdate(w http.ResponseWriter, r *http.Request, who actor) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ifMatch, refusal := parseIfMatch(r.Header.Get("If-Match"))
	apply, bodyRefusal := decodeUpdate(body)
	s.respond(w, r, who, body, "updated", cmp.Or(refusal, bodyRefusal), func(who actor) (outcome, error) {
		return s.store.changeButton(r.Context(), who, r.PathValue("id"), ifMatch, "update", apply)
	})
}

// changeState is the handler of delete and restore, whose only input besides the id is If-Match; any body is
// ignored.
func (s *server) changeState(action, message string) func(w http.ResponseWriter, r *http.Request, who actor) {
	return func(w http.ResponseWriter, r *http.Request, who actor) {
		ifMatch, refusal := parseIfMatch(r.Header.Get("If-Match"))
		s.respond(w, r, who, nil, message, refusal, func(who actor) (outcome, error) {
			return s.store.changeButton(r.Context(), who, r.PathValue("id"), ifMatch, action, nil)
		})
	}
}

// parseIfMatch reads an If-Match header: the ETag get sent, "<version>". It returns 0 when the header is absent or
// "*" (any version).
func parseIfMatch(header string) (int64, error) {
	if header == "" || header == "*" {
		return 0, nil
	}
	text, err := strconv.Unquote(header)
	version, _ := strconv.ParseInt(text, 10, 64)
	if err != nil || header[0] != '"' || !asciiIn(text, 1, 19, digits) || version < 1 {
		return 0, invalid(problems{"If-Match": `must be the ETag get sent, a version in quotes such as "3"`})
	}
	return version, nil
}

// respond runs op, the operation of a write request, and answers with its outcome: message (or "unchanged") and the
// button's id on success. A refusal found before op (a body or header that breaks a rule) is the answer instead.
// With an Idempotency-Key, a repeat of a finished request gets the first answer again, byte for byte; the same key
// with another request is a 422, and while the first is still running a 409. The answer is rendered once and stored
// with the change, or with the refusal.
func (s *server) respond(w http.ResponseWriter, r *http.Request, who actor, body []byte, message string,
	refusal error, op func(actor) (outcome, error)) {
	if refusal != nil {
		op = func(who actor) (outcome, error) { return outcome{}, s.store.reject(r.Context(), who, refusal) }
	}
	render := func(out outcome, err error) storedResponse {
		if err != nil {
			status, env := errorEnvelope(err)
			return s.answer(r, status, env)
		}
		if !out.Changed {
			message = "unchanged"
		}
		return s.answer(r, http.StatusOK, envelope{IsSuccess: true, Data: out.ID, Message: message})
	}
	key, given := r.Header["Idempotency-Key"]
	if !given {
		out, err := op(who)
		s.send(w, r, render(out, err), err)
		return
	}
	if len(key) != 1 || len(key[0]) < 1 || len(key[0]) > 255 ||
		strings.ContainsFunc(key[0], func(c rune) bool { return c < ' ' || c > '~' }) {
		s.writeError(w, r, invalid(problems{"Idempotency-Key": "must be 1 to 255 printable ASCII characters, sent once"}))
		return
	}
	slot := who.Account + "\x00" + key[0]
	if _, running := s.inFlight.LoadOrStore(slot, true); running {
		s.writeError(w, r, &apiError{code: "idempotency_in_flight",
			message: "a request with this Idempotency-Key is still running; retry shortly"})
		return
	}
	defer s.inFlight.Delete(slot)
	// Claimed first, looked up second: a first request that held the claim has committed its answer by the time the
	// claim is free.
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("If-Match"))
	h.Write(body)
	fingerprint := h.Sum(nil) // the same request: method, path, query, If-Match and body
	prior, err := s.store.findResponse(r.Context(), who, key[0])
	switch {
	case err == nil && !bytes.Equal(prior.Fingerprint, fingerprint):
		s.writeError(w, r, &apiError{code: "idempotency_mismatch",
			message: "this Idempotency-Key was used with a different request; use a new key"})
	case err == nil:
		w.Header().Set("Idempotent-Replayed", "true")
		s.send(w, r, prior, nil)
	case err != errNotFound:
		s.writeError(w, r, err)
	default:
		who.Idempotency = &idempotencyKey{Key: key[0], Fingerprint: fingerprint, Render: render}
		out, err := op(who)
		if answer := who.Idempotency.Answer; answer.Body != nil {
			s.send(w, r, answer, err)
			return
		}
		s.send(w, r, render(out, err), err)
	}
}

// --- query strings ---

// query is a request's query string and the problems found in it.
type query struct {
	values url.Values
	problems
}

// readQuery parses raw, noting unknown and repeated parameters. A known name "metadata[KEY]" stands for every
// metadata[...] parameter.
func readQuery(raw string, known ...string) *query {
	q := &query{problems: problems{}}
	var err error
	if q.values, err = url.ParseQuery(raw); err != nil {
		q.problems["query"] = "is not a valid URL query string"
	}
	for name, given := range q.values {
		pattern := name
		if strings.HasPrefix(name, "metadata[") && strings.HasSuffix(name, "]") {
			pattern = "metadata[KEY]"
		}
		switch {
		case !slices.Contains(known, pattern):
			q.problems[name] = unknownName("query parameter", name, known)
		case len(given) > 1:
			q.problems[name] = "is given more than once"
		}
	}
	return q
}

// get returns the parameter's value; false when it is absent or already refused.
func (q *query) get(name string) (string, bool) {
	_, bad := q.problems[name]
	return q.values.Get(name), !bad && q.values.Has(name)
}

// whole returns the parameter as a whole number from min to max, def when absent.
func (q *query) whole(name string, min, max, def int64) int64 {
	v, ok := q.get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if ok && (err != nil || !asciiIn(v, 1, 19, digits) || n < min || n > max) {
		q.fail(name, fmt.Sprintf("must be a whole number from %d to %d", min, max))
	}
	if !ok {
		return def
	}
	return n
}

// decodeListQuery reads the list endpoint's query string; state defaults to active.
func decodeListQuery(rawQuery, providerName string) (listFilter, error) {
	q := readQuery(rawQuery, "limit", "after", "state", "isLive", "paymentMethod", "metadata[KEY]")
	f := listFilter{Limit: int(q.whole("limit", 1, 100, 20)), State: stateActive, Metadata: map[string]string{}}
	if v, ok := q.get("after"); ok {
		if !validButtonID(v) {
			q.fail("after", "must be a button id, the next of a previous page")
		}
		f.After = v
	}
	if v, ok := q.get("state"); ok {
		if f.State = v; v == "all" {
			f.State = ""
		} else if v != stateActive && v != stateDeleted {
			q.fail("state", `must be one of "active", "deleted", "all"`)
		}
	}
	if v, ok := q.get("isLive"); ok {
		if v != "true" && v != "false" {
			q.fail("isLive", `must be "true" or "false"`)
		}
		f.IsLive = new(v == "true")
	}
	if v, ok := q.get("paymentMethod"); ok {
		if methods := []string{providerName, "Stripe", "StripeConnect"}; !slices.Contains(methods, v) {
			q.fail("paymentMethod", "must be one of "+quoted(methods))
		}
		f.PaymentMethod = v
	}
	for name := range q.values {
		key := strings.TrimSuffix(strings.TrimPrefix(name, "metadata["), "]")
		if v, ok := q.get(name); ok && key != name {
			switch {
			case !asciiIn(key, 1, maxMetadataKeyBytes, nameChars):
				q.fail(name, fmt.Sprintf("must name a key of 1 to %d of A-Z a-z 0-9 _ - .", maxMetadataKeyBytes))
			case q.text(name, v, maxMetadataRunes, unicode.IsControl, "control characters") && v != "":
				f.Metadata[key] = v
			default:
				q.fail(name, fmt.Sprintf("must be a value of 1 to %d characters", maxMetadataRunes))
			}
		}
	}
	return f, invalid(q.problems)
}

// decodeHistoryQuery reads the history endpoint's query: limit (1 to 100, default 100) and after, the version a
// previous page ended at.
func decodeHistoryQuery(rawQuery string) (limit, after int64, err error) {
	q := readQuery(rawQuery, "limit", "after")
	return q.whole("limit", 1, 100, 100), q.whole("after", 0, math.MaxInt64, 0), invalid(q.problems)
}

// decodeChangesQuery reads the change feed's query: since (a changeSeq, 0 for everything), limit (1 to 100, default
// 100) and wait (0 to 60 seconds).
func decodeChangesQuery(rawQuery string) (since, limit int64, wait time.Duration, err error) {
	q := readQuery(rawQuery, "since", "limit", "wait")
	since, limit = q.whole("since", 0, math.MaxInt64, 0), q.whole("limit", 1, 100, 100)
	return since, limit, time.Duration(q.whole("wait", 0, 60, 0)) * time.Second, invalid(q.problems)
}

// --- views ---

// buttonView is a button as the API shows it: amounts as decimal text in the currency's minor unit, times in RFC
// 3339 UTC, absent values as null.
type buttonView struct {
	ID                       string            `json:"id"`
	ProductName              string            `json:"productName"`
	Description              *string           `json:"description"`
	Amount                   string            `json:"amount"`
	Currency                 string            `json:"currency"`
	BillingInterval          *string           `json:"billingInterval"`
	PaymentMethod            string            `json:"paymentMethod"`
	PaymentType              string            `json:"paymentType"`
	IsLive                   bool              `json:"isLive"`
	ApplicationFeePercentage *string           `json:"ApplicationFeePercentage"`
	Metadata                 map[string]string `json:"metadata"`
	State                    string            `json:"state"`
	Version                  int64             `json:"version"`
	ChangeSeq                int64             `json:"changeSeq"`
	CreatedAt                timestamp         `json:"createdAt"`
	UpdatedAt                timestamp         `json:"updatedAt"`
	DeletedAt                timestamp         `json:"deletedAt"`
}

func viewOf(b button) buttonView {
	orNil := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	fee := ""
	if b.FeeBasisPoints != 0 {
		fee = formatScaled(b.FeeBasisPoints, 2) // a percentage: 250 -> "2.50"
	}
	if b.Metadata == nil {
		b.Metadata = metadata{} // shown as {}
	}
	return buttonView{ID: b.ID, ProductName: b.ProductName, Description: orNil(b.Description),
		Amount: formatAmount(b.AmountMinor, b.Currency), Currency: b.Currency, BillingInterval: orNil(b.BillingInterval),
		PaymentMethod: b.PaymentMethod, PaymentType: b.PaymentType, IsLive: b.IsLive, ApplicationFeePercentage: orNil(fee),
		Metadata: b.Metadata, State: b.State, Version: b.Version, ChangeSeq: b.ChangeSeq,
		CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt, DeletedAt: b.DeletedAt}
}

func viewsOf(buttons []button) []buttonView {
	views := make([]buttonView, len(buttons))
	for i, b := range buttons {
		views[i] = viewOf(b)
	}
	return views
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

// readBody returns the request body once it has checked the media type (a missing Content-Type is read as JSON) and
// the 64 KiB cap. A body announced as too large is refused before a byte of it is read.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil || (mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json")) {
			return nil, &apiError{code: "unsupported_media_type", message: "Content-Type must be application/json"}
		}
	}
	tooLarge := &apiError{code: "payload_too_large", message: "body is larger than 64 KiB"}
	if r.ContentLength > maxBodyBytes {
		return nil, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return nil, tooLarge
	case err != nil:
		return nil, invalid(problems{"body": "could not be read"})
	}
	return body, nil
}

// --- envelope and errors ---

// envelope is every response body.
type envelope struct {
	IsSuccess bool              `json:"isSuccess"`
	Data      any               `json:"data"`
	Message   string            `json:"message"`
	Code      string            `json:"code,omitempty"`
	Errors    map[string]string `json:"errors,omitempty"`
}

// internalError is what a client sees of a bug.
var internalError = []byte(`{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`)

// answer renders env, sent with status. An envelope that cannot be encoded becomes the internal error, logged.
func (s *server) answer(r *http.Request, status int, env envelope) storedResponse {
	body, err := json.Marshal(env)
	if err != nil {
		s.log.Error("encode response", "requestId", requestID(r.Context()), "err", err)
		return storedResponse{Status: http.StatusInternalServerError, Body: internalError}
	}
	return storedResponse{Status: status, Body: body}
}

func (s *server) writeJSON(w http.ResponseWriter, r *http.Request, status int, env envelope) {
	s.send(w, r, s.answer(r, status, env), nil)
}

// errorEnvelope is the status and envelope of err. An error that is not an *apiError is a bug: the client reads
// only "internal error".
func errorEnvelope(err error) (int, envelope) {
	var e *apiError
	if !errors.As(err, &e) || statusOf[e.code] == 0 {
		e = &apiError{code: "internal", message: "internal error"}
	}
	return statusOf[e.code], envelope{Data: "", Message: e.message, Code: e.code, Errors: e.fields}
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, env := errorEnvelope(err)
	s.send(w, r, s.answer(r, status, env), err)
}

// send writes a rendered answer. A 5xx is logged as an error with its cause, which the client never sees; a 503
// says when to retry.
func (s *server) send(w http.ResponseWriter, r *http.Request, answer storedResponse, err error) {
	if err == errUnknownKey { // revoked since admit found it in memory, or unknown
		s.goodKeys.Delete(sha256.Sum256([]byte(r.Header.Get("X-API-KEY"))))
	}
	if answer.Status >= 500 {
		s.log.Error("request failed", "requestId", requestID(r.Context()), "status", answer.Status, "err", err)
	}
	if answer.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(answer.Status)
	w.Write(answer.Body)
}

// --- wrappers ---

// keyed admits the request's key and, for a write, its scope before h runs, and so before any body is read.
func (s *server) keyed(write bool, h func(w http.ResponseWriter, r *http.Request, who actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if key, ok := s.admit(w, r, write, s.store.authenticate); ok {
			h(w, r, actor{Account: key.Account, KeyID: key.ID, RequestID: requestID(r.Context())})
		}
	}
}

// admit looks up the request's X-API-KEY with lookup. It answers 401 for a missing, unknown or revoked key, 429
// once the client's address has failed too often (without a lookup, unless the key is one that has authenticated),
// 403 for a read-only key on a write, and 429 for a key over its rate limit; else it names the key in the access
// line and lets the request go on.
func (s *server) admit(w http.ResponseWriter, r *http.Request, write bool,
	lookup func(ctx context.Context, secret string) (apiKey, error)) (apiKey, bool) {
	refuse := func(err error, wait time.Duration) (apiKey, bool) {
		if wait > 0 { // a Retry-After of whole seconds, at least one
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
		}
		s.writeError(w, r, err)
		return apiKey{}, false
	}
	secret := r.Header.Get("X-API-KEY")
	hash := sha256.Sum256([]byte(secret))
	cached, known := s.goodKeys.Load(hash)
	if host, _, _ := net.SplitHostPort(r.RemoteAddr); !known {
		if ok, wait := s.failures.allow(host, time.Now()); !ok && !s.isLiveKey(r.Context(), hash) {
			// Held for its Retry-After: a flood that waits for answers costs a request a connection a second.
			select {
			case <-time.After(time.Duration(math.Ceil(wait.Seconds())) * time.Second):
			case <-r.Context().Done():
			}
			return refuse(&apiError{code: "rate_limited",
				message: "too many requests without a valid API key from this address; retry later"}, wait)
		}
	}
	if secret == "" {
		return refuse(&apiError{code: "unauthorized", message: "the X-API-KEY header is required"}, 0)
	}
	key, _ := cached.(apiKey)
	if !known || !write { // a write's key is looked up again in its own transaction (store.go, writeAnswered)
		var err error
		if key, err = lookup(r.Context(), secret); err != nil {
			return refuse(err, 0)
		}
		s.goodKeys.LoadOrStore(hash, key) // a known key costs no store: reads repeat it on every request
	}
	if info, _ := r.Context().Value(requestInfoKey{}).(*requestInfo); info != nil {
		info.keyID = key.ID
	}
	if write && key.ReadOnly {
		return refuse(&apiError{code: "forbidden", message: "this API key is read-only"}, 0)
	}
	if ok, wait := s.limiter.allow(key.ID, time.Now()); !ok {
		return refuse(&apiError{code: "rate_limited", message: "too many requests for this API key; retry later"}, wait)
	}
	return key, true
}

// share answers queryErr, the problems of the request's query string, if there are any, and returns false. Else it
// waits for one of the account's 2 shares of the 4 reader connections, so that one account's reads queue behind each
// other and never take every connection (and both cores) from the others. After 5 s it answers unavailable.
func (s *server) share(w http.ResponseWriter, r *http.Request, account string, queryErr error) (
	release func(), ok bool) {
	if queryErr != nil {
		s.writeError(w, r, queryErr)
		return nil, false
	}
	v, _ := s.shares.LoadOrStore(account, make(chan struct{}, 2))
	select {
	case v.(chan struct{}) <- struct{}{}:
		return func() { <-v.(chan struct{}) }, true
	case <-time.After(5 * time.Second):
		s.writeError(w, r, &apiError{code: "unavailable", message: "this account's reads are queued too deep; retry shortly"})
	case <-r.Context().Done():
		s.writeError(w, r, classify(r.Context().Err()))
	}
	return nil, false
}

// isLiveKey reloads the hashes of the live keys, at most once a second, and reports whether hash is one: a valid
// key that has not been used since the server started still works from an address that floods it with bad ones.
func (s *server) isLiveKey(ctx context.Context, hash [sha256.Size]byte) bool {
	if last := s.keysLoaded.Load(); time.Since(time.Unix(0, last)) > time.Second &&
		s.keysLoaded.CompareAndSwap(last, time.Now().UnixNano()) {
		live, _ := s.store.liveKeys(ctx)
		for _, k := range live {
			s.goodKeys.Store([sha256.Size]byte(k.Hash), k)
		}
	}
	_, live := s.goodKeys.Load(hash)
	return live
}

// requestInfo is what the access line says of a request beyond what the request itself holds; the wrappers fill it
// in as they learn it.
type requestInfo struct{ id, keyID string }

type requestInfoKey struct{}

// requestID returns the id withBasics gave the request.
func requestID(ctx context.Context) string {
	if info, _ := ctx.Value(requestInfoKey{}).(*requestInfo); info != nil {
		return info.id
	}
	return ""
}

// withBasics sets the headers every response carries, gives the request its id (the caller's X-Request-Id when it
// is sane), turns a panic into a logged 500, writes the access line (never the key, only its id) and the metrics,
// and answers 404 for the paths the mux would answer with a redirect or in plain text.
func (s *server) withBasics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{id: r.Header.Get("X-Request-Id")}
		if !asciiIn(info.id, 1, 128, nameChars+":") {
			// Unique, not secret: math/rand spares a system call a request.
			info.id = "req_" + strconv.FormatUint(mathrand.Uint64(), 36)
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", info.id)
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		rec := &recordingWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic", "requestId", info.id, "panic", v, "stack", string(debug.Stack()))
				rec.WriteHeader(http.StatusInternalServerError)
				rec.Write(internalError)
			}
			route := r.Pattern // the route the mux matched; its own 404 ("/") and 405s (a bare path) are none
			if !strings.Contains(route, " ") {
				route = ""
			}
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("method", r.Method),
				slog.String("route", route), slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)),
				slog.Int("bytes", rec.bytes), slog.String("requestId", info.id), slog.String("keyId", info.keyID))
			s.metrics.observe(route, rec.status, time.Since(start))
		}()
		if !strings.HasPrefix(r.URL.Path, "/") || path.Clean(r.URL.Path) != r.URL.Path { // "*", "..", "//", "/x/"
			s.writeError(rec, r, errNoPath)
		} else {
			next.ServeHTTP(rec, r)
		}
	})
}

// recordingWriter notes the status and the size of a response for the access line.
type recordingWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *recordingWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
