package main

import (
	"bytes"
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
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxBodyBytes caps every request body (64 KiB).
const maxBodyBytes = 64 << 10

// server holds what the handlers share. There is no package-level state.
type server struct {
	store        *store
	log          *slog.Logger
	providerName string // the own processor's paymentMethod value
	limiter      *rateLimiter
	inFlight     claims // Idempotency-Keys whose first request is still running
}

// newServer returns the whole HTTP API. Every response, the mux's own 404 and
// 405 included, is the JSON envelope.
func newServer(st *store, log *slog.Logger, providerName string, limiter *rateLimiter) http.Handler {
	s := &server{store: st, log: log, providerName: providerName, limiter: limiter}
	mux := http.NewServeMux()
	mux.Handle("POST /product-payment/create", s.withKey(s.handleCreate))
	mux.HandleFunc("GET /product-payment/get/{id}", s.handleGet) // checks the key in its own query
	mux.Handle("GET /product-payment/list", s.withKey(s.handleList))
	mux.Handle("GET /product-payment/history/{id}", s.withKey(s.handleHistory))
	mux.Handle("POST /product-payment/update/{id}", s.withKey(s.handleUpdate))
	mux.Handle("DELETE /product-payment/delete/{id}", s.withKey(s.handleDelete))
	mux.Handle("POST /product-payment/restore/{id}", s.withKey(s.handleRestore))
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /openapi.json", s.handleOpenAPI)
	return s.withBasics(s.enveloped(mux))
}

// openAPIDocument is the API's OpenAPI 3.1 description, served as it is.
//
//go:embed openapi.json
var openAPIDocument []byte

func (s *server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	w.Write(openAPIDocument)
}

// handleHealth answers 200 when the database answers a real query, else 503.
func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ping(ctx); err != nil {
		s.log.Warn("health check failed", "requestId", requestID(r.Context()), "err", err)
		s.writeError(w, r, &apiError{http.StatusServiceUnavailable, "unavailable", "the database does not answer"})
		return
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: "ok", Message: "the database answers"})
}

// --- handlers, one per operation ---

// keyedHandler is a handler that runs once the caller's key is known.
type keyedHandler func(w http.ResponseWriter, r *http.Request, who actor)

func (s *server) handleCreate(w http.ResponseWriter, r *http.Request, who actor) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.respond(w, r, who, body, "created", func(who actor) (string, error) {
		b, err := decodeCreate(body, s.providerName)
		if err != nil {
			return "", s.store.reject(r.Context(), who, err)
		}
		b, err = s.store.createButton(r.Context(), who, b)
		return b.ID, err
	})
}

// handleGet reads the button and checks the key in the same query (see
// getButtonWithKey), so it admits the key itself rather than through withKey.
func (s *server) handleGet(w http.ResponseWriter, r *http.Request) {
	secret, ok := s.apiKeyHeader(w, r)
	if !ok {
		return
	}
	key, b, err := s.store.getButtonWithKey(r.Context(), secret, r.PathValue("id"))
	if !s.admit(w, r, key, err) {
		return
	}
	if b.ID == "" {
		s.writeError(w, r, errNotFound)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(b.Version, 10)))
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: viewOf(b), Message: "ok"})
}

// listPage is the data of a list response.
type listPage struct {
	Items   []buttonView `json:"items"`
	HasMore bool         `json:"hasMore"`
	Next    *string      `json:"next"` // the after= of the next page
}

func (s *server) handleList(w http.ResponseWriter, r *http.Request, who actor) {
	f, err := decodeListQuery(r.URL.RawQuery, s.providerName)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page := f
	page.Limit++ // one more than asked says whether there is a next page
	buttons, err := s.store.listButtons(r.Context(), who.Account, page)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := listPage{HasMore: len(buttons) > f.Limit}
	if data.HasMore {
		buttons = buttons[:f.Limit]
		data.Next = &buttons[len(buttons)-1].ID
	}
	data.Items = make([]buttonView, len(buttons))
	for i, b := range buttons {
		data.Items[i] = viewOf(b)
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: data, Message: "ok"})
}

// historyItem is one change as the history endpoint shows it.
type historyItem struct {
	At        string            `json:"at"`
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
	entries, err := s.store.buttonHistory(r.Context(), who.Account, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	items := make([]historyItem, len(entries))
	var before map[string]any // nothing before the create
	for i, e := range entries {
		after := auditedFields(e.Button)
		items[i] = historyItem{At: formatTime(e.At), Action: e.Action, KeyID: e.KeyID,
			RequestID: e.RequestID, Changes: map[string]change{}}
		for name, to := range after {
			if from := before[name]; from != to {
				items[i].Changes[name] = change{from, to}
			}
		}
		before = after
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: map[string]any{"items": items}, Message: "ok"})
}

// auditedFields are a button's fields as get renders them, the ones history
// reports changes of (version and times change every time, so they are left out).
func auditedFields(b button) map[string]any {
	v := viewOf(b)
	orNull := func(s *string) any {
		if s == nil {
			return nil
		}
		return *s
	}
	return map[string]any{
		"productName":              v.ProductName,
		"description":              orNull(v.Description),
		"amount":                   v.Amount,
		"currency":                 v.Currency,
		"billingInterval":          orNull(v.BillingInterval),
		"paymentMethod":            v.PaymentMethod,
		"paymentType":              v.PaymentType,
		"isLive":                   v.IsLive,
		"ApplicationFeePercentage": orNull(v.ApplicationFeePercentage),
		"state":                    v.State,
	}
}

func (s *server) handleUpdate(w http.ResponseWriter, r *http.Request, who actor) {
	id := r.PathValue("id")
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.respond(w, r, who, body, "updated", func(who actor) (string, error) {
		ifMatch, err := parseIfMatch(r.Header.Get("If-Match"))
		if err != nil {
			return id, s.store.reject(r.Context(), who, err)
		}
		u, err := decodeUpdate(body)
		if err != nil {
			return id, s.store.reject(r.Context(), who, err)
		}
		_, err = s.store.updateButton(r.Context(), who, id, ifMatch, u.apply)
		return id, err
	})
}

func (s *server) handleDelete(w http.ResponseWriter, r *http.Request, who actor) {
	s.changeState(w, r, who, "deleted", s.store.deleteButton)
}

func (s *server) handleRestore(w http.ResponseWriter, r *http.Request, who actor) {
	s.changeState(w, r, who, "restored", s.store.restoreButton)
}

// changeState runs delete or restore, whose only input besides the id is
// If-Match; any body is ignored.
func (s *server) changeState(w http.ResponseWriter, r *http.Request, who actor, message string,
	change func(ctx context.Context, who actor, id string, ifMatch int64) (button, error)) {
	id := r.PathValue("id")
	s.respond(w, r, who, nil, message, func(who actor) (string, error) {
		ifMatch, err := parseIfMatch(r.Header.Get("If-Match"))
		if err != nil {
			return id, s.store.reject(r.Context(), who, err)
		}
		_, err = change(r.Context(), who, id, ifMatch)
		return id, err
	})
}

// respond runs op, the operation of a write request, and answers with its
// outcome. With an Idempotency-Key, a repeat of a finished request gets the
// first answer again, byte for byte; the same key with another request is a
// 422, and while the first is still running a 409. The answer is stored by op
// in the same transaction as its change.
func (s *server) respond(w http.ResponseWriter, r *http.Request, who actor, body []byte, message string, op func(actor) (string, error)) {
	key, given := r.Header["Idempotency-Key"]
	if !given {
		id, err := op(who)
		s.reply(w, r, id, message, err)
		return
	}
	if len(key) != 1 || !validIdempotencyKey(key[0]) {
		s.writeError(w, r, newInvalidError(map[string]string{
			"Idempotency-Key": "must be 1 to 255 printable ASCII characters, sent once"}))
		return
	}
	slot := who.Account + "\x00" + key[0]
	if !s.inFlight.claim(slot) {
		s.writeError(w, r, &apiError{http.StatusConflict, "idempotency_in_flight",
			"a request with this Idempotency-Key is still running; retry shortly"})
		return
	}
	defer s.inFlight.release(slot)
	// Claimed first, looked up second: a first request that held the claim
	// has committed its answer by the time the claim is free.
	fingerprint := requestFingerprint(r, body)
	prior, err := s.store.findResponse(r.Context(), who.Account, key[0])
	switch {
	case err == nil && !bytes.Equal(prior.Fingerprint, fingerprint):
		s.writeError(w, r, &apiError{http.StatusUnprocessableEntity, "idempotency_mismatch",
			"this Idempotency-Key was used with a different request"})
		return
	case err == nil:
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(prior.Status)
		w.Write(prior.Body)
		return
	case !errors.Is(err, errNotFound):
		s.writeError(w, r, err)
		return
	}
	who.Idempotency = &idempotencyKey{Key: key[0], Fingerprint: fingerprint,
		Answer: func(id string, err error) (int, []byte, bool) {
			status, env := outcome(id, message, err)
			body, encodeErr := json.Marshal(env)
			return status, body, encodeErr == nil && status < 500
		}}
	id, err := op(who)
	s.reply(w, r, id, message, err)
}

// requestFingerprint identifies a request for Idempotency-Key reuse: method,
// path, query and body.
func requestFingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", r.Method, r.URL.EscapedPath(), r.URL.RawQuery)
	h.Write(body)
	return h.Sum(nil)
}

// claims is a set of keys, each held by at most one request at a time.
type claims struct {
	mu   sync.Mutex
	held map[string]bool
}

// claim takes k and reports whether it was free.
func (c *claims) claim(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[k] {
		return false
	}
	if c.held == nil {
		c.held = map[string]bool{}
	}
	c.held[k] = true
	return true
}

func (c *claims) release(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, k)
}

// reply answers a write with the outcome of its operation.
func (s *server) reply(w http.ResponseWriter, r *http.Request, id, message string, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	status, env := outcome(id, message, nil)
	s.writeJSON(w, r, status, env)
}

// outcome is the status and envelope that answer a write: the button id and
// message on success, else the error's.
func outcome(id, message string, err error) (int, envelope) {
	if err != nil {
		return errorEnvelope(err)
	}
	return http.StatusOK, envelope{IsSuccess: true, Data: id, Message: message}
}

// buttonView is a button as the API shows it: amounts as decimal text in the
// currency's minor unit, times in RFC 3339 UTC, absent values as null.
type buttonView struct {
	ID                       string  `json:"id"`
	ProductName              string  `json:"productName"`
	Description              *string `json:"description"`
	Amount                   string  `json:"amount"`
	Currency                 string  `json:"currency"`
	BillingInterval          *string `json:"billingInterval"`
	PaymentMethod            string  `json:"paymentMethod"`
	PaymentType              string  `json:"paymentType"`
	IsLive                   bool    `json:"isLive"`
	ApplicationFeePercentage *string `json:"ApplicationFeePercentage"`
	State                    string  `json:"state"`
	Version                  int64   `json:"version"`
	CreatedAt                string  `json:"createdAt"`
	UpdatedAt                string  `json:"updatedAt"`
	DeletedAt                *string `json:"deletedAt"`
}

func viewOf(b button) buttonView {
	v := buttonView{
		ID:            b.ID,
		ProductName:   b.ProductName,
		Amount:        formatAmount(b.AmountMinor, b.Currency),
		Currency:      b.Currency,
		PaymentMethod: b.PaymentMethod,
		PaymentType:   b.PaymentType,
		IsLive:        b.IsLive,
		State:         b.State,
		Version:       b.Version,
		CreatedAt:     formatTime(b.CreatedAt),
		UpdatedAt:     formatTime(b.UpdatedAt),
	}
	if b.Description != "" {
		v.Description = &b.Description
	}
	if b.BillingInterval != "" {
		v.BillingInterval = &b.BillingInterval
	}
	if b.FeeBasisPoints != 0 {
		fee := formatFee(b.FeeBasisPoints)
		v.ApplicationFeePercentage = &fee
	}
	if !b.DeletedAt.IsZero() {
		deleted := formatTime(b.DeletedAt)
		v.DeletedAt = &deleted
	}
	return v
}

// --- body ---

// readBody returns the request body once it has checked the media type (a
// missing Content-Type is read as JSON) and the 64 KiB cap. A body announced as
// too large is refused before a byte of it is read.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil || (mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json")) {
			return nil, &apiError{http.StatusUnsupportedMediaType, "unsupported_media_type",
				"Content-Type must be application/json"}
		}
	}
	tooLarge := &apiError{http.StatusRequestEntityTooLarge, "payload_too_large", "body is larger than 64 KiB"}
	if r.ContentLength > maxBodyBytes {
		return nil, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return nil, tooLarge
	}
	if err != nil {
		return nil, newInvalidError(map[string]string{"body": "could not be read"})
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

// apiError is an answer decided by the HTTP layer itself (auth, limits, media type, routing).
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

// writeJSON marshals v before writing the header, so that a value that cannot
// be encoded still becomes a clean 500.
func (s *server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v envelope) {
	body, err := json.Marshal(v)
	if err != nil {
		s.log.Error("encode response", "requestId", requestID(r.Context()), "err", err)
		status = http.StatusInternalServerError
		body = []byte(`{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`)
	}
	w.WriteHeader(status)
	w.Write(body)
}

// errorEnvelope is the one place an error becomes a status and a code. An
// unexpected error reads only "internal error".
func errorEnvelope(err error) (int, envelope) {
	env := envelope{Data: ""}
	var status int
	var invalid *invalidError
	var wrongState *stateError
	var known *apiError
	switch {
	case errors.As(err, &known):
		status, env.Code, env.Message = known.status, known.code, known.message
	case errors.As(err, &invalid):
		status, env.Code, env.Message, env.Errors = http.StatusBadRequest, "invalid_request", invalid.message, invalid.fields
	case errors.Is(err, errNotFound):
		status, env.Code, env.Message = http.StatusNotFound, "not_found", "no such button"
	case errors.As(err, &wrongState):
		status, env.Code, env.Message = http.StatusConflict, "wrong_state", wrongState.reason
	case errors.Is(err, errPreconditionFailed):
		status, env.Code, env.Message = http.StatusPreconditionFailed, "precondition_failed",
			"the button has changed since the version in If-Match; get it again"
	case errors.Is(err, errUnavailable), errors.Is(err, errClosed):
		status, env.Code, env.Message = http.StatusServiceUnavailable, "unavailable", "the database is busy; retry shortly"
	default:
		status, env.Code, env.Message = http.StatusInternalServerError, "internal", "internal error"
	}
	return status, env
}

// writeError answers with err's envelope. A 5xx is logged with the request id
// and the details the client never sees; a 503 says when to retry.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, env := errorEnvelope(err)
	switch {
	case status == http.StatusServiceUnavailable:
		s.log.Warn("database unavailable", "requestId", requestID(r.Context()), "err", err)
		w.Header().Set("Retry-After", "1")
	case status >= 500:
		s.log.Error("internal error", "requestId", requestID(r.Context()), "err", err)
	}
	s.writeJSON(w, r, status, env)
}

// --- wrappers ---

// withKey authenticates the X-API-KEY header and applies the key's rate limit
// before next runs, and so before any body is read.
func (s *server) withKey(next keyedHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := s.apiKeyHeader(w, r)
		if !ok {
			return
		}
		key, err := s.store.authenticate(r.Context(), secret)
		if s.admit(w, r, key, err) {
			next(w, r, actor{Account: key.Account, KeyID: key.ID, RequestID: requestID(r.Context())})
		}
	})
}

// apiKeyHeader returns the X-API-KEY header, or answers 401 if there is none.
func (s *server) apiKeyHeader(w http.ResponseWriter, r *http.Request) (string, bool) {
	secret := r.Header.Get("X-API-KEY")
	if secret == "" {
		s.writeError(w, r, &apiError{http.StatusUnauthorized, "unauthorized", "the X-API-KEY header is required"})
	}
	return secret, secret != ""
}

// admit answers 401 for an unknown or revoked key (authErr errUnknownKey), the
// fault for any other authErr, and 429 for a key over its rate limit; else it
// names the key in the access line and says the request may go on.
func (s *server) admit(w http.ResponseWriter, r *http.Request, key apiKey, authErr error) bool {
	switch {
	case errors.Is(authErr, errUnknownKey):
		s.writeError(w, r, &apiError{http.StatusUnauthorized, "unauthorized", "the API key is not valid"})
		return false
	case authErr != nil:
		s.writeError(w, r, authErr)
		return false
	}
	if info, _ := r.Context().Value(requestInfoKey{}).(*requestInfo); info != nil {
		info.keyID = key.ID
	}
	if ok, wait := s.limiter.allow(key.ID, time.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		s.writeError(w, r, &apiError{http.StatusTooManyRequests, "rate_limited", "too many requests for this API key; retry later"})
		return false
	}
	return true
}

// enveloped routes through mux, but answers what the mux would answer in plain
// text (404, 405, and redirects to a cleaned path) with the envelope instead.
func (s *server) enveloped(mux *http.ServeMux) http.Handler {
	notFound := &apiError{http.StatusNotFound, "not_found", "no such path"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A path with "..", "//", "." or a trailing slash would be redirected.
		if r.URL.Path == "" || path.Clean(r.URL.Path) != r.URL.Path {
			s.writeError(w, r, notFound)
			return
		}
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Ask the mux's own handler whether this is a 404 or a 405, and which
		// methods the path allows.
		probe := &probeWriter{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if probe.status != http.StatusMethodNotAllowed {
			s.writeError(w, r, notFound)
			return
		}
		w.Header().Set("Allow", probe.header.Get("Allow"))
		s.writeError(w, r, &apiError{http.StatusMethodNotAllowed, "method_not_allowed",
			"method " + r.Method + " is not allowed here; allowed: " + probe.header.Get("Allow")})
	})
}

// probeWriter keeps the status and headers a handler writes and drops its body.
type probeWriter struct {
	header http.Header
	status int
}

func (p *probeWriter) Header() http.Header         { return p.header }
func (p *probeWriter) WriteHeader(status int)      { p.status = status }
func (p *probeWriter) Write(b []byte) (int, error) { return len(b), nil }

// requestInfo is what the access line says of a request beyond what the
// request itself holds; the wrappers fill it in as they learn it.
type requestInfo struct {
	id    string
	keyID string
}

type requestInfoKey struct{}

// requestID returns the id withBasics gave the request.
func requestID(ctx context.Context) string {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	if info == nil {
		return ""
	}
	return info.id
}

// withBasics sets the headers every response carries, gives the request its id
// (the caller's X-Request-Id when it is sane), turns a panic into a logged 500,
// and writes the access line: never the key, only its id.
func (s *server) withBasics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{id: r.Header.Get("X-Request-Id")}
		if !saneRequestID(info.id) {
			info.id = newRequestID()
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
				s.writeError(rec, r, &apiError{http.StatusInternalServerError, "internal", "internal error"})
			}
			// r.Pattern is the route the mux matched, "" for none.
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "request",
				slog.String("method", r.Method),
				slog.String("route", r.Pattern),
				slog.Int("status", rec.status),
				slog.Duration("duration", time.Since(start)),
				slog.Int("bytes", rec.bytes),
				slog.String("requestId", info.id),
				slog.String("keyId", info.keyID))
		}()
		next.ServeHTTP(rec, r)
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

// newRequestID makes the id of a request that came without a sane one. It
// must be unique, not secret: math/rand spares a system call a request.
func newRequestID() string {
	var id [13]byte // 65 bits
	n := mathrand.Uint64()
	for i := range id {
		id[i] = crockford[n&31]
		n >>= 5
	}
	return "req_" + string(id[:])
}

// saneRequestID accepts 1 to 128 characters of letters, digits and ._:- so a
// caller's id can go into logs and headers unescaped.
func saneRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// --- rate limit ---

// rateLimiter is a token bucket per API key: rate tokens a second up to burst.
// A rate of 0 turns it off.
type rateLimiter struct {
	rate  float64
	burst float64

	mu      sync.Mutex
	buckets map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*tokenBucket{}}
}

// allow takes a token from key's bucket; when there is none it says how long
// until there will be.
func (l *rateLimiter) allow(key string, t time.Time) (bool, time.Duration) {
	if l.rate <= 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		b = &tokenBucket{tokens: l.burst, at: t}
		l.buckets[key] = b
	}
	b.tokens = min(l.burst, b.tokens+t.Sub(b.at).Seconds()*l.rate)
	b.at = t
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}
