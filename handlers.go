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
	"time"
	"unicode"
)

// statusOf is the one table from an error's code to its HTTP status.
var statusOf = map[string]int{
	codeInvalid:          http.StatusBadRequest,
	codeUnauthorized:     http.StatusUnauthorized,
	codeForbidden:        http.StatusForbidden,
	codeNotFound:         http.StatusNotFound,
	codeMethodNotAllowed: http.StatusMethodNotAllowed,
	codeWrongState:       http.StatusConflict,
	codeInFlight:         http.StatusConflict,
	codePrecondition:     http.StatusPreconditionFailed,
	codeTooLarge:         http.StatusRequestEntityTooLarge,
	codeMediaType:        http.StatusUnsupportedMediaType,
	codeMismatch:         http.StatusUnprocessableEntity,
	codeRateLimited:      http.StatusTooManyRequests,
	codeCanceled:         499,
	codeInternal:         http.StatusInternalServerError,
	codeUnavailable:      http.StatusServiceUnavailable,
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
	knownKeys    knownKeys
	inFlight     sync.Map // account and Idempotency-Key of the writes still running
	metrics      metrics
}

// newServer returns the whole HTTP API. Every response, the mux's own 404 and 405 included, is the JSON envelope,
// but /openapi.json and /metrics.
func newServer(st storage, log *slog.Logger, cfg config) *server {
	s := &server{store: st, log: log, providerName: cfg.providerName, limiter: newRateLimiter(cfg.rate, cfg.burst),
		failures: newRateLimiter(20, 100), metrics: metrics{routes: map[string]*routeMetrics{}}}
	mux := http.NewServeMux()
	allowed := map[string]string{} // path -> the methods its route answers, for a 405's Allow
	route := func(pattern string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		allowed[path] = strings.Replace(method, "GET", "GET, HEAD", 1)
		mux.Handle(pattern, h)
	}
	route("POST /product-payment/create", s.keyed(true, s.handleCreate))
	route("GET /product-payment/get/{id}", s.handleGet)
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
			s.writeError(w, r, &apiError{code: codeMethodNotAllowed,
				message: "method " + r.Method + " is not allowed here; allowed: " + methods})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { s.writeError(w, r, errNoPath) })
	s.Handler = s.withBasics(mux)
	return s
}

var errNoPath = &apiError{code: codeNotFound, message: "no such path"}

// openAPIDocument is the API's OpenAPI 3.1 description, served as it is.
//
//go:embed openapi.json
var openAPIDocument []byte

// --- handlers, one per operation ---

// handleHealth answers 200 when the database answers and takes writes, 503 when it does not.
func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ping(ctx); err != nil {
		s.writeError(w, r, &apiError{code: codeUnavailable, message: "the database does not answer or refuses writes",
			cause: err})
		return
	}
	s.send(w, r, render(http.StatusOK, envelope{IsSuccess: true, Data: "ok", Message: "the database answers"}), nil)
}

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

// handleGet admits the key and reads the button in one query: get is the hottest path.
func (s *server) handleGet(w http.ResponseWriter, r *http.Request) {
	_, b, err := s.admit(r, false, r.PathValue("id"))
	switch {
	case err != nil:
		s.writeError(w, r, err)
	case b.ID == "":
		s.writeError(w, r, errNotFound)
	default:
		s.writeData(w, r, viewOf(b), b.Version)
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
	var buttons []button
	var next *string
	if err == nil {
		buttons, next, err = s.store.listButtons(r.Context(), who.Account, f)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeData(w, r, page[buttonView, *string]{Items: viewsOf(buttons), HasMore: next != nil, Next: next}, 0)
}

func (s *server) handleHistory(w http.ResponseWriter, r *http.Request, who actor) {
	limit, after, err := decodeHistoryQuery(r.URL.RawQuery)
	var entries []historyEntry
	var next *int64
	if err == nil {
		entries, next, err = s.store.buttonHistory(r.Context(), who.Account, r.PathValue("id"), after, limit)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := page[historyItem, *int64]{Items: make([]historyItem, len(entries)), HasMore: next != nil, Next: next}
	for i, e := range entries {
		data.Items[i] = historyItemOf(e)
	}
	s.writeData(w, r, data, 0)
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

// historyItemOf shows a change as the fields it changed, from the button before it to the button after it.
func historyItemOf(e historyEntry) historyItem {
	item := historyItem{Version: e.Version, At: e.At, Action: e.Action, KeyID: e.KeyID, RequestID: e.RequestID,
		Changes: map[string]change{}}
	was, is := map[string]any{}, auditedFields(e.After)
	if e.Action != "create" {
		was = auditedFields(e.Before)
	}
	for name, to := range is {
		if from := was[name]; from != to {
			item.Changes[name] = change{from, to}
		}
	}
	for name, from := range was { // metadata keys the change removed
		if _, kept := is[name]; !kept {
			item.Changes[name] = change{from, nil}
		}
	}
	return item
}

// auditedFields are a button's fields as get shows them, the ones history reports changes of (the id, version,
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
// order of their last change. Clients poll it with the next it answered.
func (s *server) handleChanges(w http.ResponseWriter, r *http.Request, who actor) {
	since, limit, err := decodeChangesQuery(r.URL.RawQuery)
	var buttons []button
	var more bool
	if err == nil {
		buttons, more, err = s.store.changes(r.Context(), who.Account, since, limit)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := page[buttonView, int64]{Items: viewsOf(buttons), HasMore: more, Next: since}
	if len(buttons) > 0 {
		data.Next = buttons[len(buttons)-1].ChangeSeq
	}
	s.writeData(w, r, data, 0)
}

func (s *server) handleUpdate(w http.ResponseWriter, r *http.Request, who actor) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ifMatch, refusal := parseIfMatch(r.Header.Get("If-Match"))
	u, bodyRefusal := decodeUpdate(body)
	s.respond(w, r, who, body, "updated", cmp.Or(refusal, bodyRefusal), func(who actor) (outcome, error) {
		return s.store.changeButton(r.Context(), who, r.PathValue("id"), ifMatch, "update", u.apply)
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

// respond answers a write: refusal, when the body or a header broke a rule, else the outcome of op, the write
// itself (see answerOf).
//
// With an Idempotency-Key the answer is stored with the change, or with the refusal, in one transaction, and a
// repeat of the same request gets it again, byte for byte; the key with another request is a 422, and while the
// first is still running a 409.
func (s *server) respond(w http.ResponseWriter, r *http.Request, who actor, body []byte, message string,
	refusal error, op func(actor) (outcome, error)) {
	if refusal != nil { // no write to run; with an Idempotency-Key, an answer to keep
		op = func(who actor) (outcome, error) { return outcome{}, s.store.keepRefusal(r.Context(), who, refusal) }
	}
	key, given := r.Header["Idempotency-Key"]
	switch {
	case !given && refusal != nil:
		s.writeError(w, r, refusal)
		return
	case !given:
		out, err := op(who)
		s.send(w, r, answerOf(message, out, err), err)
		return
	case len(key) != 1 || len(key[0]) < 1 || len(key[0]) > 255 ||
		strings.ContainsFunc(key[0], func(c rune) bool { return c < ' ' || c > '~' }):
		s.writeError(w, r, invalid(problems{"Idempotency-Key": "must be 1 to 255 printable ASCII characters, sent once"}))
		return
	}
	slot := who.Account + "\x00" + key[0]
	if _, running := s.inFlight.LoadOrStore(slot, true); running {
		s.writeError(w, r, &apiError{code: codeInFlight,
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
	prior, err := s.store.findAnswer(r.Context(), who.Account, key[0])
	switch {
	case err == nil && !bytes.Equal(prior.Fingerprint, fingerprint):
		s.writeError(w, r, &apiError{code: codeMismatch,
			message: "this Idempotency-Key was used with a different request; use a new key"})
	case err == nil:
		w.Header().Set("Idempotent-Replayed", "true")
		s.send(w, r, prior, nil)
	case err != errNotFound:
		s.writeError(w, r, err)
	default:
		who.Idempotency = &idempotencyKey{Key: key[0], Fingerprint: fingerprint, Message: message}
		out, err := op(who)
		s.send(w, r, answerOf(message, out, err), err) // the bytes the store kept, unless a fault kept none
	}
}

// answerOf renders the answer to a write, a pure function of its arguments, so that the answer a store keeps for an
// Idempotency-Key is byte for byte the one sent: on success, message (or "unchanged") and the button's id, with its
// version for the ETag; else err's envelope.
func answerOf(message string, out outcome, err error) answer {
	if err != nil {
		return renderError(err)
	}
	if !out.Changed {
		message = "unchanged"
	}
	a := render(http.StatusOK, envelope{IsSuccess: true, Data: out.ID, Message: message})
	a.Version = out.Version
	return a
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

// render encodes env, to be sent with status. It cannot fail for the values the handlers give it; if it did, the
// client would read the internal error.
func render(status int, env envelope) answer {
	body, err := json.Marshal(env)
	if err != nil {
		return answer{Status: http.StatusInternalServerError, Body: internalError}
	}
	return answer{Status: status, Body: body}
}

// renderError renders err with its status. An error that is not an *apiError is a bug: the client reads only
// "internal error".
func renderError(err error) answer {
	var e *apiError
	if !errors.As(err, &e) || statusOf[e.code] == 0 {
		e = &apiError{code: codeInternal, message: "internal error"}
	}
	return render(statusOf[e.code], envelope{Data: "", Message: e.message, Code: e.code, Errors: e.fields})
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.send(w, r, renderError(err), err)
}

// writeData answers 200 with data; a version, when not 0, goes in the ETag.
func (s *server) writeData(w http.ResponseWriter, r *http.Request, data any, version int64) {
	a := render(http.StatusOK, envelope{IsSuccess: true, Data: data, Message: "ok"})
	a.Version = version
	s.send(w, r, a, nil)
}

// send writes a rendered answer, err being what it answers. A 429 or 503 says when to retry; a 5xx is logged as an
// error with its cause, which the client never sees.
func (s *server) send(w http.ResponseWriter, r *http.Request, a answer, err error) {
	if a.Version > 0 {
		w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(a.Version, 10)))
	}
	if e := (*apiError)(nil); errors.As(err, &e) && (e.code == codeRateLimited || e.code == codeUnavailable) {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(e.retry.Seconds()))))) // whole seconds
	}
	if a.Status >= 500 {
		s.log.Error("request failed", "requestId", requestID(r.Context()), "status", a.Status, "err", err)
	}
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// --- authentication and limits ---

// keyed runs h once the request's key is admitted, before any body is read; else it answers why not.
func (s *server) keyed(write bool, h func(w http.ResponseWriter, r *http.Request, who actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if key, _, err := s.admit(r, write, ""); err != nil {
			s.writeError(w, r, err)
		} else {
			h(w, r, actor{Account: key.Account, KeyID: key.ID, RequestID: requestID(r.Context())})
		}
	}
}

// admit returns the live key the request's X-API-KEY names and, given a button id, that button of its account (see
// authenticate). It fails with 429 once the client's address has failed authentication too often (without a
// lookup), 401 for a missing, unknown or revoked key, 403 for a read-only key on a write, and 429 for a key over its
// rate limit.
func (s *server) admit(r *http.Request, write bool, id string) (apiKey, button, error) {
	secret := r.Header.Get("X-API-KEY")
	hash := sha256.Sum256([]byte(secret))
	if host, _, _ := net.SplitHostPort(r.RemoteAddr); !s.knownKeys.has(r.Context(), s.store, hash) {
		if ok, wait := s.failures.allow(host, time.Now()); !ok {
			return apiKey{}, button{}, &apiError{code: codeRateLimited, retry: wait,
				message: "too many requests without a valid API key from this address; retry later"}
		}
	}
	if secret == "" {
		return apiKey{}, button{}, &apiError{code: codeUnauthorized, message: "the X-API-KEY header is required"}
	}
	key, b, err := s.store.authenticate(r.Context(), hash, id)
	if err == errUnknownKey {
		s.knownKeys.forget(hash) // revoked since it was read: the failure limit applies to it again
	}
	if err != nil {
		return apiKey{}, button{}, err
	}
	if info, _ := r.Context().Value(requestInfoKey{}).(*requestInfo); info != nil {
		info.keyID = key.ID // for the access line
	}
	if write && key.ReadOnly {
		return apiKey{}, button{}, &apiError{code: codeForbidden, message: "this API key is read-only"}
	}
	if ok, wait := s.limiter.allow(key.ID, time.Now()); !ok {
		return apiKey{}, button{}, &apiError{code: codeRateLimited, retry: wait,
			message: "too many requests for this API key; retry later"}
	}
	return key, b, nil
}

// knownKeys holds the SHA-256 of every live key, read again at most once a second when asked about one it lacks. It
// spares those keys the failed-authentication limit, so that a valid key keeps working from an address that floods
// the server with bad ones; whether a key is live is for authenticate alone to say, and a key it refuses is forgotten.
type knownKeys struct {
	mu     sync.Mutex
	hashes map[[sha256.Size]byte]bool
	read   time.Time
}

func (k *knownKeys) has(ctx context.Context, st storage, hash [sha256.Size]byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.hashes[hash] && time.Since(k.read) > time.Second {
		k.read = time.Now()
		if keys, err := st.listKeys(ctx); err == nil {
			k.hashes = map[[sha256.Size]byte]bool{}
			for _, key := range keys {
				k.hashes[[sha256.Size]byte(key.Hash)] = key.RevokedAt.IsZero()
			}
		}
	}
	return k.hashes[hash]
}

func (k *knownKeys) forget(hash [sha256.Size]byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.hashes, hash)
}

// --- what every request goes through ---

// requestInfo is what the access line says of a request beyond what the request itself holds.
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

// readBody returns the request body once it has checked the media type (a missing Content-Type is read as JSON) and
// the 64 KiB cap. A body announced as too large is refused before a byte of it is read.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	const maxBodyBytes = 64 << 10
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil || (mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json")) {
			return nil, &apiError{code: codeMediaType, message: "Content-Type must be application/json"}
		}
	}
	tooLarge := &apiError{code: codeTooLarge, message: "body is larger than 64 KiB"}
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

// --- query strings and headers ---

// maxCursor bounds every number a query string takes: the largest integer any JSON client reads exactly, and small
// enough that no sum of it overflows.
const maxCursor = 1<<53 - 1

// readQuery reads a query string as fields, each value a string, noting unknown and repeated parameters. A known
// name "metadata[KEY]" stands for every metadata[...] parameter.
func readQuery(raw string, known ...string) *fields {
	f := &fields{given: map[string]any{}, problems: problems{}}
	values, err := url.ParseQuery(raw)
	if err != nil {
		f.fail("query", "is not a valid URL query string")
	}
	for name, given := range values {
		pattern := name
		if strings.HasPrefix(name, "metadata[") && strings.HasSuffix(name, "]") {
			pattern = "metadata[KEY]"
		}
		switch {
		case !slices.Contains(known, pattern):
			f.fail(name, unknownName("query parameter", name, known))
		case len(given) > 1:
			f.fail(name, "is given more than once")
		default:
			f.given[name] = given[0]
		}
	}
	return f
}

// whole returns the parameter as a whole number from min to max, def when absent.
func (f *fields) whole(name string, min, max, def int64) int64 {
	s, ok := f.str(name, false)
	n, err := strconv.ParseInt(s, 10, 64)
	if ok && (err != nil || !asciiIn(s, 1, 19, digits) || n < min || n > max) {
		f.fail(name, fmt.Sprintf("must be a whole number from %d to %d", min, max))
	}
	if !ok {
		return def
	}
	return n
}

// decodeListQuery reads the list endpoint's query string; state defaults to active.
func decodeListQuery(rawQuery, providerName string) (listFilter, error) {
	f := readQuery(rawQuery, "limit", "after", "state", "isLive", "paymentMethod", "metadata[KEY]")
	filter := listFilter{Limit: int(f.whole("limit", 1, 100, 20)), State: stateActive, Metadata: map[string]string{}}
	if after, ok := f.str("after", false); ok {
		if filter.After = after; !validButtonID(after) {
			f.fail("after", "must be a button id, the next of a previous page")
		}
	}
	if state, ok := f.oneOf("state", false, stateActive, stateDeleted, "all"); ok {
		filter.State = state
	}
	if isLive, ok := f.oneOf("isLive", false, "true", "false"); ok {
		filter.IsLive = new(isLive == "true")
	}
	filter.PaymentMethod, _ = f.oneOf("paymentMethod", false, providerName, "Stripe", "StripeConnect")
	for name := range f.given {
		if key, ok := strings.CutPrefix(name, "metadata["); ok {
			key = strings.TrimSuffix(key, "]")
			switch value, _ := f.str(name, false); {
			case !asciiIn(key, 1, maxMetadataKeyBytes, nameChars):
				f.fail(name, fmt.Sprintf("must name a key of 1 to %d of A-Z a-z 0-9 _ - .", maxMetadataKeyBytes))
			case value == "":
				f.fail(name, fmt.Sprintf("must be a value of 1 to %d characters", maxMetadataRunes))
			case f.text(name, value, maxMetadataRunes, unicode.IsControl, "control characters"):
				filter.Metadata[key] = value
			}
		}
	}
	if len(filter.Metadata) > maxMetadataKeys { // as many as a button may hold; more would only grow the query
		f.fail("metadata", fmt.Sprintf("must have at most %d metadata[KEY] filters", maxMetadataKeys))
	}
	return filter, invalid(f.problems)
}

// decodeHistoryQuery reads the history endpoint's query: limit (1 to 100, default 100) and after, the version a
// previous page ended at.
func decodeHistoryQuery(rawQuery string) (limit, after int64, err error) {
	f := readQuery(rawQuery, "limit", "after")
	return f.whole("limit", 1, 100, 100), f.whole("after", 0, maxCursor, 0), invalid(f.problems)
}

// decodeChangesQuery reads the change feed's query: since (a changeSeq, 0 for everything) and limit (1 to 100,
// default 100).
func decodeChangesQuery(rawQuery string) (since, limit int64, err error) {
	f := readQuery(rawQuery, "since", "limit")
	return f.whole("since", 0, maxCursor, 0), f.whole("limit", 1, 100, 100), invalid(f.problems)
}

// parseIfMatch reads an If-Match header: the ETag get sent, "<version>". It returns 0 when the header is absent or
// "*" (any version).
func parseIfMatch(header string) (int64, error) {
	if header == "" || header == "*" {
		return 0, nil
	}
	text, err := strconv.Unquote(header)
	version, _ := strconv.ParseInt(text, 10, 64)
	if err != nil || header[0] != '"' || strconv.FormatInt(version, 10) != text || version < 1 {
		return 0, invalid(problems{"If-Match": `must be the ETag get sent, a version in quotes such as "3"`})
	}
	return version, nil
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
