package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
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
}

// newServer returns the whole HTTP API. Every response, the mux's own 404 and
// 405 included, is the JSON envelope.
func newServer(st *store, log *slog.Logger, providerName string, limiter *rateLimiter) http.Handler {
	s := &server{store: st, log: log, providerName: providerName, limiter: limiter}
	mux := http.NewServeMux()
	mux.Handle("POST /product-payment/create", s.withKey(s.handleCreate))
	mux.Handle("GET /product-payment/get/{id}", s.withKey(s.handleGet))
	mux.Handle("POST /product-payment/update/{id}", s.withKey(s.handleUpdate))
	mux.Handle("DELETE /product-payment/delete/{id}", s.withKey(s.handleDelete))
	mux.Handle("POST /product-payment/restore/{id}", s.withKey(s.handleRestore))
	return s.withBasics(s.enveloped(mux))
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
	b, err := decodeCreate(body, s.providerName)
	if err == nil {
		b, err = s.store.createButton(r.Context(), who, b)
	}
	s.reply(w, r, b.ID, "created", err)
}

func (s *server) handleGet(w http.ResponseWriter, r *http.Request, who actor) {
	b, err := s.store.getButton(r.Context(), who.Account, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(b.Version, 10)))
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: viewOf(b), Message: "ok"})
}

func (s *server) handleUpdate(w http.ResponseWriter, r *http.Request, who actor) {
	id := r.PathValue("id")
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	u, err := decodeUpdate(body)
	if err == nil {
		_, err = s.store.updateButton(r.Context(), who, id, u.apply)
	}
	s.reply(w, r, id, "updated", err)
}

func (s *server) handleDelete(w http.ResponseWriter, r *http.Request, who actor) {
	id := r.PathValue("id")
	_, err := s.store.deleteButton(r.Context(), who, id)
	s.reply(w, r, id, "deleted", err)
}

func (s *server) handleRestore(w http.ResponseWriter, r *http.Request, who actor) {
	id := r.PathValue("id")
	_, err := s.store.restoreButton(r.Context(), who, id)
	s.reply(w, r, id, "restored", err)
}

// reply answers a write: the button id and message on success, else the error.
func (s *server) reply(w http.ResponseWriter, r *http.Request, id, message string, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, envelope{IsSuccess: true, Data: id, Message: message})
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
		return nil, &apiError{http.StatusBadRequest, "invalid_request", "the body could not be read"}
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

// writeError is the one place an error becomes a status and a code. Details of
// unexpected errors are logged with the request id; the client reads only
// "internal error".
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
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
	case errors.Is(err, errUnavailable), errors.Is(err, errClosed):
		s.log.Warn("database unavailable", "requestId", requestID(r.Context()), "err", err)
		w.Header().Set("Retry-After", "1")
		status, env.Code, env.Message = http.StatusServiceUnavailable, "unavailable", "the database is busy; retry shortly"
	default:
		s.log.Error("internal error", "requestId", requestID(r.Context()), "err", err)
		status, env.Code, env.Message = http.StatusInternalServerError, "internal", "internal error"
	}
	s.writeJSON(w, r, status, env)
}

// --- wrappers ---

// withKey authenticates the X-API-KEY header and applies the key's rate limit
// before next runs, and so before any body is read.
func (s *server) withKey(next keyedHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := r.Header.Get("X-API-KEY")
		if secret == "" {
			s.writeError(w, r, &apiError{http.StatusUnauthorized, "unauthorized", "the X-API-KEY header is required"})
			return
		}
		key, err := s.store.authenticate(r.Context(), secret)
		if errors.Is(err, errNotFound) {
			s.writeError(w, r, &apiError{http.StatusUnauthorized, "unauthorized", "the API key is not valid"})
			return
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if ok, wait := s.limiter.allow(key.ID, time.Now()); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			s.writeError(w, r, &apiError{http.StatusTooManyRequests, "rate_limited", "too many requests for this API key; retry later"})
			return
		}
		next(w, r, actor{Account: key.Account, KeyID: key.ID, RequestID: requestID(r.Context())})
	})
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

type requestIDKey struct{}

// requestID returns the id withBasics gave the request.
func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// withBasics sets the headers every response carries, gives the request its id
// (the caller's X-Request-Id when it is sane) and turns a panic into a logged 500.
func (s *server) withBasics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !saneRequestID(id) {
			id = "req_" + randomCrockford(20)
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic", "requestId", id, "panic", v, "stack", string(debug.Stack()))
				s.writeError(w, r, &apiError{http.StatusInternalServerError, "internal", "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
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
