package main

import (
	"context"
	_ "embed"
	"errors"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// openAPIDocument describes the API.
//
//go:embed openapi.json
var openAPIDocument []byte

// server is the HTTP API. It holds no package-level state.
type server struct {
	store *store
	log   *slog.Logger
}

// reply is a handler's answer when it succeeds: the envelope's data and message, and the button's
// version, sent as the ETag (0 for none).
type reply struct {
	data    any
	message string
	version int64
}

// newServer returns the whole API. Every answer except the OpenAPI document is the JSON envelope,
// including the 404 and 405 the mux would otherwise write itself.
func newServer(st *store, log *slog.Logger) http.Handler {
	s := &server{store: st, log: log}
	mux := http.NewServeMux()
	// route serves method on path, and answers any other method with a 405 in the envelope (the
	// mux's own 405 is plain text). The mux prefers a pattern with a method to the bare path, so
	// the bare path gets only the other methods. GET also serves HEAD.
	route := func(method, path string, h http.HandlerFunc) {
		mux.HandleFunc(method+" "+path, h)
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			allowed := strings.Replace(method, "GET", "GET, HEAD", 1)
			w.Header().Set("Allow", allowed)
			s.send(w, r, reply{}, &apiError{code: codeMethodNotAllowed,
				message: "method " + r.Method + " is not allowed here; allowed: " + allowed})
		})
	}
	route("POST", "/product-payment/create", s.withKey(true, s.handleCreate))
	route("GET", "/product-payment/get/{id}", s.withKey(false, s.handleGet))
	route("GET", "/product-payment/list", s.withKey(false, s.handleList))
	route("POST", "/product-payment/update/{id}", s.withKey(true, s.handleUpdate))
	route("DELETE", "/product-payment/delete/{id}", s.withKey(true, s.handleDelete))
	route("POST", "/product-payment/restore/{id}", s.withKey(true, s.handleRestore))
	route("GET", "/healthz", s.handleHealth)
	route("GET", "/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Write(openAPIDocument)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.send(w, r, reply{}, errNoPath)
	})
	return s.withBasics(mux)
}

var errNoPath = &apiError{code: codeNotFound, message: "no such path"}

// --- handlers, one per operation ---

func (s *server) handleCreate(r *http.Request, key apiKey) (reply, error) {
	b, err := decodeCreate(r)
	if err != nil {
		return reply{}, err
	}
	b, err = s.store.create(r.Context(), key.Account, b)
	return reply{data: b.ID, message: "created", version: b.Version}, err
}

func (s *server) handleGet(r *http.Request, key apiKey) (reply, error) {
	b, version, err := s.store.get(r.Context(), key.Account, r.PathValue("id"))
	return reply{data: b, message: "ok", version: version}, err
}

func (s *server) handleList(r *http.Request, key apiKey) (reply, error) {
	q, err := decodeListQuery(r.URL.RawQuery)
	if err != nil {
		return reply{}, err
	}
	buttons, next, err := s.store.list(r.Context(), key.Account, q)
	page := map[string]any{"items": buttons, "hasMore": next != "", "next": orNil(next)}
	return reply{data: page, message: "ok"}, err
}

func (s *server) handleUpdate(r *http.Request, key apiKey) (reply, error) {
	update, err := decodeUpdate(r)
	if err != nil {
		return reply{}, err
	}
	return s.changeButton(r, key, "updated", func(b *button) error {
		if b.State == "deleted" {
			return &apiError{code: codeWrongState, message: "button is deleted; restore it first"}
		}
		return update.apply(b)
	})
}

func (s *server) handleDelete(r *http.Request, key apiKey) (reply, error) {
	return s.changeButton(r, key, "deleted", func(b *button) error {
		if b.State == "deleted" {
			return &apiError{code: codeWrongState, message: "button is already deleted"}
		}
		b.State, b.DeletedAt = "deleted", orNil(now())
		return nil
	})
}

func (s *server) handleRestore(r *http.Request, key apiKey) (reply, error) {
	return s.changeButton(r, key, "restored", func(b *button) error {
		if b.State == "active" {
			return &apiError{code: codeWrongState, message: "button is not deleted"}
		}
		b.State, b.DeletedAt = "active", nil
		return nil
	})
}

// changeButton runs edit on the button the path names, if it still has the version If-Match names.
// It answers message, or "unchanged" when edit changed nothing.
func (s *server) changeButton(r *http.Request, key apiKey, message string,
	edit func(*button) error) (reply, error) {
	ifMatch, err := parseIfMatch(r.Header.Get("If-Match"))
	if err != nil {
		return reply{}, err
	}
	b, changed, err := s.store.change(r.Context(), key.Account, r.PathValue("id"), ifMatch, edit)
	if !changed {
		message = "unchanged"
	}
	return reply{data: b.ID, message: message, version: b.Version}, err
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	err := s.store.ping(ctx)
	if err != nil {
		err = &apiError{code: codeUnavailable, message: "the database does not answer", cause: err}
	}
	s.send(w, r, reply{data: "ok", message: "the database answers"}, err)
}

// --- what every request goes through ---

// accessLog records, for the log line withBasics writes for each request, the status sent and the
// id of the key that asked (withKey sets it).
type accessLog struct {
	http.ResponseWriter
	status int
	keyID  string
}

func (w *accessLog) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// withKey runs h for the request's key, once admit has let the key in.
func (s *server) withKey(write bool,
	h func(*http.Request, apiKey) (reply, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, err := s.admit(r, write)
		w.(*accessLog).keyID = key.ID // withBasics's access log names the key that asked
		if err != nil {
			s.send(w, r, reply{}, err)
			return
		}
		rep, err := h(r, key)
		s.send(w, r, rep, err)
	}
}

// admit returns the request's live key, before anything else is read. It answers 401 for a
// missing, unknown or revoked key, and 403 for a read-only key on a write. A write that carries
// Idempotency-Key is refused, so that no client believes a retry of it is safe.
func (s *server) admit(r *http.Request, write bool) (apiKey, error) {
	secret := r.Header.Get("X-API-KEY")
	if secret == "" {
		return apiKey{}, &apiError{code: codeUnauthorized, message: "X-API-KEY is required"}
	}
	key, err := s.store.authenticate(r.Context(), secret)
	if err == nil && write && key.ReadOnly {
		err = &apiError{code: codeForbidden, message: "this API key is read-only"}
	} else if err == nil && write && r.Header["Idempotency-Key"] != nil {
		err = invalid(map[string]string{"Idempotency-Key": "is not supported: after a lost " +
			"answer, list the newest buttons before sending a create again"})
	}
	return key, err
}

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

// send writes every answer: rep in the envelope, or err's code and message. An error that is not
// an *apiError is a fault: a 500 whose cause is logged, never sent. A client that hung up is not a
// fault; its answer is logged (and sent, to no one) with status 499, as nginx does.
func (s *server) send(w http.ResponseWriter, r *http.Request, rep reply, err error) {
	var e *apiError
	if err != nil && !errors.As(err, &e) {
		e = &apiError{code: codeInternal, message: "internal error", cause: err}
	}
	status, body := 200, []byte(nil)
	if e == nil {
		body = marshal(envelope{IsSuccess: true, Data: rep.data, Message: rep.message})
	} else {
		status = statusOf[e.code]
		body = marshal(envelope{Data: "", Message: e.message, Code: e.code, Errors: e.fields})
	}
	if rep.version > 0 && e == nil {
		w.Header().Set("ETag", `"`+strconv.FormatInt(rep.version, 10)+`"`)
	}
	if status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	if e != nil && r.Context().Err() != nil {
		status = 499
	} else if status >= 500 {
		s.log.Error("request failed", "requestId", w.Header().Get("X-Request-Id"), "status", status,
			"err", e.cause)
	}
	w.WriteHeader(status)
	w.Write(body)
}

// withBasics sets the headers of every answer, X-Request-Id among them: the caller's when it is
// sane, else a new one. It turns a panic into a logged 500, and logs one line per request (with a
// key's id, never its secret). A path the mux would redirect ("..", "//", a trailing slash) or
// answer in plain text ("*") is a 404.
func (s *server) withBasics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start, id := time.Now(), r.Header.Get("X-Request-Id")
		if len(id) < 1 || len(id) > 128 || !onlyOf(id, nameChars+":") {
			id = "req_" + strconv.FormatUint(mathrand.Uint64(), 36) // unique, not secret
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", id)
		access := &accessLog{ResponseWriter: w, status: 200}
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("panic", "requestId", id, "panic", v, "stack", string(debug.Stack()))
				access.WriteHeader(500)
				access.Write(internalError)
			}
			// ServeMux set the pattern it chose, and the path's id, on this same r.
			s.log.Info("request", "method", r.Method, "route", r.Pattern, "status", access.status,
				"duration", time.Since(start), "requestId", id, "keyId", access.keyID,
				"buttonId", r.PathValue("id"))
		}()
		if !strings.HasPrefix(r.URL.Path, "/") || path.Clean(r.URL.Path) != r.URL.Path {
			s.send(access, r, reply{}, errNoPath)
		} else {
			next.ServeHTTP(access, r)
		}
	})
}
