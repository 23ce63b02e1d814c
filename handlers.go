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
	"log/slog"
	"math"
	mathrand "math/rand/v2"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// config is what the command line decides about the API.
type config struct {
	providerName string  // the paymentMethod of the service's own processor
	rate         float64 // requests a second per key; 0 for no limit
	burst        int
}

// server is the HTTP API. It holds no package-level state.
type server struct {
	store        *store
	log          *slog.Logger
	providerName string
	limiter      *rateLimiter
	inFlight     sync.Map // account and Idempotency-Key of every write running
}

// keyedHandler handles a request whose API key has been admitted, for the key's account; an error
// it returns is the answer.
type keyedHandler func(w http.ResponseWriter, r *http.Request, who actor) error

// openAPIDocument describes the API; it is served as it is.
//
//go:embed openapi.json
var openAPIDocument []byte

// newServer returns the whole API. Every answer but the OpenAPI document is the JSON envelope, the
// mux's own 404 and 405 included.
func newServer(st *store, log *slog.Logger, cfg config) http.Handler {
	limiter := &rateLimiter{rate: cfg.rate, burst: float64(cfg.burst)}
	limiter.buckets = map[string]*bucket{}
	s := &server{store: st, log: log, providerName: cfg.providerName, limiter: limiter}
	mux := http.NewServeMux()
	// route serves method on path. The path alone, a pattern the mux tries after it, answers every
	// other method: a 405 in the envelope, where the mux's own would be plain text.
	route := func(method, path string, h http.HandlerFunc) {
		mux.HandleFunc(method+" "+path, h)
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			allowed := strings.Replace(method, "GET", "GET, HEAD", 1)
			w.Header().Set("Allow", allowed)
			s.writeError(w, r, &apiError{code: codeMethodNotAllowed,
				message: "method " + r.Method + " is not allowed here; allowed: " + allowed})
		})
	}
	route("POST", "/product-payment/create", s.keyed(true, s.handleCreate))
	route("GET", "/product-payment/get/{id}", s.keyed(false, s.handleGet))
	route("GET", "/product-payment/list", s.keyed(false, s.handleList))
	route("GET", "/product-payment/history/{id}", s.keyed(false, s.handleHistory))
	route("POST", "/product-payment/update/{id}", s.keyed(true, s.handleUpdate))
	route("DELETE", "/product-payment/delete/{id}", s.keyed(true, s.handleStateChange("delete")))
	route("POST", "/product-payment/restore/{id}", s.keyed(true, s.handleStateChange("restore")))
	route("GET", "/healthz", s.handleHealth)
	route("GET", "/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Write(openAPIDocument)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errNoPath)
	})
	return s.withBasics(mux)
}

var errNoPath = &apiError{code: codeNotFound, message: "no such path"}

// --- handlers, one per operation ---

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ping(ctx); err != nil {
		s.writeError(w, r, &apiError{code: codeUnavailable, message: "the database does not answer",
			cause: err})
		return
	}
	s.send(w, r, render(200, envelope{IsSuccess: true, Data: "ok", Message: "the database answers"},
		0), nil)
}

func (s *server) handleCreate(w http.ResponseWriter, r *http.Request, who actor) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	b, refusal := decodeCreate(body, s.providerName)
	return s.write(w, r, who, body, "created", refusal, func(tx writeTx) (button, bool, error) {
		b, err := tx.create(who, b)
		return b, true, err
	})
}

func (s *server) handleGet(w http.ResponseWriter, r *http.Request, who actor) error {
	b, err := s.store.get(r.Context(), who.Account, r.PathValue("id"))
	if err != nil {
		return err
	}
	s.writeData(w, r, b, b.Version)
	return nil
}

func (s *server) handleList(w http.ResponseWriter, r *http.Request, who actor) error {
	q, err := decodeListQuery(r.URL.RawQuery, s.providerName)
	if err != nil {
		return err
	}
	buttons, more, err := s.store.list(r.Context(), who.Account, q)
	if err != nil {
		return err
	}
	last := ""
	if len(buttons) > 0 {
		last = buttons[len(buttons)-1].ID
	}
	s.writeData(w, r, pageOf(buttons, more, last), 0)
	return nil
}

// pageOf is the data of an answer that lists: the items, whether more follow, and the cursor that
// asks for them.
func pageOf[T any](items []T, more bool, next any) map[string]any {
	if !more {
		next = nil
	}
	return map[string]any{"items": items, "hasMore": more, "next": next}
}

func (s *server) handleHistory(w http.ResponseWriter, r *http.Request, who actor) error {
	limit, after, err := decodeHistoryQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	entries, more, err := s.store.history(r.Context(), who.Account, r.PathValue("id"), after, limit)
	if err != nil {
		return err
	}
	items := []map[string]any{}
	for _, e := range entries {
		items = append(items, map[string]any{"version": e.Version, "at": e.After.UpdatedAt,
			"action": e.Action, "keyId": e.KeyID, "requestId": e.RequestID,
			"changes": changes(e.Before, e.After)})
		after = e.Version
	}
	s.writeData(w, r, pageOf(items, more, after), 0)
	return nil
}

// changes lists what a change did to the fields get shows, each metadata key on its own
// ("metadata.orderRef"), as {"from", "to"}; from before a create (no button), every field it set.
func changes(before, after button) map[string]any {
	was, is := auditedFields(before), auditedFields(after)
	changed := map[string]any{}
	for _, fields := range []map[string]any{was, is} { // a metadata key may come or go
		for name := range fields {
			if was[name] != is[name] {
				changed[name] = map[string]any{"from": was[name], "to": is[name]}
			}
		}
	}
	return changed
}

// auditedFields are the fields of b that history reports changes of.
func auditedFields(b button) map[string]any {
	fields := map[string]any{}
	if b.ID == "" {
		return fields
	}
	text, _ := json.Marshal(b)
	json.Unmarshal(text, &fields)
	for _, name := range []string{"id", "metadata", "version", "createdAt", "updatedAt",
		"deletedAt"} {
		delete(fields, name)
	}
	for key, value := range b.Metadata {
		fields["metadata."+key] = value
	}
	return fields
}

func (s *server) handleUpdate(w http.ResponseWriter, r *http.Request, who actor) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	ifMatch, refusal := parseIfMatch(r.Header.Get("If-Match"))
	update, err := decodeUpdate(body)
	// change runs only when nothing was refused, and so update is set.
	change := func(tx writeTx) (button, bool, error) {
		return tx.change(who, r.PathValue("id"), ifMatch, "update", update.edit)
	}
	return s.write(w, r, who, body, "updated", cmp.Or(refusal, err), change)
}

// handleStateChange handles delete and restore, whose only input but the id is If-Match: a body is
// ignored.
func (s *server) handleStateChange(action string) keyedHandler {
	return func(w http.ResponseWriter, r *http.Request, who actor) error {
		ifMatch, refusal := parseIfMatch(r.Header.Get("If-Match"))
		return s.write(w, r, who, nil, action+"d", refusal, func(tx writeTx) (button, bool, error) {
			return tx.change(who, r.PathValue("id"), ifMatch, action, nil)
		})
	}
}

// write answers a write request: with refusal when it broke a rule before its change could run,
// else with what change did in a transaction of its own: message, or "unchanged" when it changed
// nothing.
//
// With an Idempotency-Key the answer is kept in the same transaction as the change (a crash keeps
// both or neither), and a repeat of the same request (method, path, query, If-Match and body) gets
// it again, byte for byte. The key with another request is a 422, and while the first request runs,
// a 409. A 5xx is never kept: a retry runs afresh.
func (s *server) write(w http.ResponseWriter, r *http.Request, who actor, body []byte,
	message string, refusal error, change func(writeTx) (button, bool, error)) error {
	keys, idempotent := r.Header["Idempotency-Key"]
	var fingerprint [sha256.Size]byte
	if idempotent {
		if len(keys) > 1 || len(keys[0]) < 1 || len(keys[0]) > 255 ||
			strings.ContainsFunc(keys[0], func(c rune) bool { return c < ' ' || c > '~' }) {
			return invalid(map[string]string{
				"Idempotency-Key": "must be 1 to 255 printable ASCII characters, sent once"})
		}
		slot := who.Account + "\x00" + keys[0]
		if _, running := s.inFlight.LoadOrStore(slot, true); running {
			return &apiError{code: codeInFlight,
				message: "a request with this Idempotency-Key is still running; retry shortly"}
		}
		defer s.inFlight.Delete(slot)
		fingerprint = sha256.Sum256(fmt.Appendf(nil, "%s %s?%s\n%s\n%s", r.Method,
			r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("If-Match"), body))
		// Looked up once claimed: a first request that held the claim has committed its answer.
		kept, err := s.store.findAnswer(r.Context(), who.Account, keys[0])
		if err == nil && !bytes.Equal(kept.Fingerprint, fingerprint[:]) {
			return &apiError{code: codeMismatch,
				message: "this Idempotency-Key was used with a different request; use a new key"}
		} else if err == nil {
			w.Header().Set("Idempotent-Replayed", "true")
			s.send(w, r, kept, nil)
			return nil
		} else if err != errNotFound {
			return err
		}
	} else if refusal != nil {
		return refusal
	}

	tx, err := s.store.begin(r.Context())
	if err != nil {
		return err
	}
	defer tx.Rollback()
	b, changed, err := button{}, false, refusal
	if refusal == nil {
		b, changed, err = change(tx)
	}
	if err == nil && !changed {
		message = "unchanged"
	}
	a := render(200, envelope{IsSuccess: true, Data: b.ID, Message: message}, b.Version)
	if err != nil {
		a = renderError(err)
	}
	if a.Status >= 500 { // a fault: nothing is kept, so a retry runs afresh
		s.send(w, r, a, err)
		return nil
	}
	if idempotent {
		a.Fingerprint = fingerprint[:]
		if err := tx.keepAnswer(who.Account, keys[0], a); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.send(w, r, a, nil)
	return nil
}

// --- the envelope ---

// envelope is every response body.
type envelope struct {
	IsSuccess bool              `json:"isSuccess"`
	Data      any               `json:"data"`
	Message   string            `json:"message"`
	Code      string            `json:"code,omitempty"`
	Errors    map[string]string `json:"errors,omitempty"`
}

// internalError is all a client sees of a bug.
var internalError = []byte(
	`{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`)

// render encodes env, to be sent with status and version as its ETag (none for 0); should that
// fail, it is a 500.
func render(status int, env envelope, version int64) answer {
	body, err := json.Marshal(env)
	if err != nil {
		return answer{Status: 500, Body: internalError}
	}
	return answer{Status: status, Body: body, Version: version}
}

// renderError renders err with the status of its code. An error that is not an *apiError is a fault
// (see fault).
func renderError(err error) answer {
	var e *apiError
	if !errors.As(err, &e) {
		e = fault(err)
	}
	env := envelope{Data: "", Message: e.message, Code: e.code.name, Errors: e.fields}
	return render(e.code.status, env, 0)
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.send(w, r, renderError(err), err)
}

func (s *server) writeData(w http.ResponseWriter, r *http.Request, data any, version int64) {
	s.send(w, r, render(200, envelope{IsSuccess: true, Data: data, Message: "ok"}, version), nil)
}

// send writes a rendered answer to err, or to no error. A 429 or 503 says when to retry; a 5xx is
// logged with its cause, which the client never sees.
func (s *server) send(w http.ResponseWriter, r *http.Request, a answer, err error) {
	if a.Version > 0 {
		w.Header().Set("ETag", `"`+strconv.FormatInt(a.Version, 10)+`"`)
	}
	e := (*apiError)(nil)
	if errors.As(err, &e) && e.code == codeRateLimited {
		seconds := math.Ceil(e.retry.Seconds()) // whole seconds, at least 1
		w.Header().Set("Retry-After", strconv.Itoa(int(seconds)))
	} else if a.Status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	if a.Status >= 500 {
		if e != nil && e.cause != nil {
			err = e.cause
		}
		s.log.Error("request failed", "requestId", r.Header.Get("X-Request-Id"), "status", a.Status,
			"err", err)
	}
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// --- keys, limits, and what every request goes through ---

// keyed runs h once the request's X-API-KEY is admitted, before any body is read: 401 for a
// missing, unknown or revoked key, 403 for a read-only key on a write, 429 for a key over its rate
// limit.
func (s *server) keyed(write bool, h keyedHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret := r.Header.Get("X-API-KEY")
		if secret == "" {
			s.writeError(w, r, &apiError{code: codeUnauthorized, message: "X-API-KEY is required"})
			return
		}
		key, err := s.store.authenticate(r.Context(), secret)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if rec, ok := w.(*statusRecorder); ok {
			rec.keyID = key.ID // for the access log
		}
		if write && key.ReadOnly {
			err = &apiError{code: codeForbidden, message: "this API key is read-only"}
		} else if wait := s.limiter.wait(key.ID, time.Now()); wait > 0 {
			err = &apiError{code: codeRateLimited, retry: wait,
				message: "too many requests for this API key; retry later"}
		} else {
			err = h(w, r, actor{key.Account, key.ID, r.Header.Get("X-Request-Id")})
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	}
}

// rateLimiter is a token bucket per API key: rate tokens a second, up to burst. A rate of 0 turns
// it off.
type rateLimiter struct {
	rate, burst float64
	mu          sync.Mutex
	buckets     map[string]*bucket // by key id: as many as there are keys
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was counted
}

// wait takes a token from key's bucket and returns 0 or, when it is empty, how long until it holds
// one.
func (l *rateLimiter) wait(key string, t time.Time) time.Duration {
	if l.rate == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		b = &bucket{tokens: l.burst, at: t}
		l.buckets[key] = b
	}
	b.tokens, b.at = min(l.burst, b.tokens+t.Sub(b.at).Seconds()*l.rate), t
	if b.tokens < 1 {
		return time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	}
	b.tokens--
	return 0
}

// withBasics sets the headers of every answer and gives the request its id: the caller's
// X-Request-Id when it is sane, which the request's header then holds. It turns a panic into a
// logged 500, and logs one line per request (never a key, only its id). A path the mux would
// redirect ("..", "//", a trailing slash) or answer in plain text ("*") is a 404.
func (s *server) withBasics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start, id := time.Now(), r.Header.Get("X-Request-Id")
		if len(id) < 1 || len(id) > 128 || !onlyOf(id, nameChars+":") {
			id = "req_" + strconv.FormatUint(mathrand.Uint64(), 36) // unique, not secret
			r.Header.Set("X-Request-Id", id)
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", id)
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic", "requestId", id, "panic", v, "stack", string(debug.Stack()))
				rec.WriteHeader(500)
				rec.Write(internalError)
			}
			s.log.Info("request", "method", r.Method, "route", r.Pattern, "status", rec.status,
				"duration", time.Since(start), "requestId", id, "keyId", rec.keyID)
		}()
		if !strings.HasPrefix(r.URL.Path, "/") || path.Clean(r.URL.Path) != r.URL.Path {
			s.writeError(rec, r, errNoPath)
		} else {
			next.ServeHTTP(rec, r)
		}
	})
}

// statusRecorder notes for the access log a response's status, and the key that asked for it.
type statusRecorder struct {
	http.ResponseWriter
	status int
	keyID  string
}

func (w *statusRecorder) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}
