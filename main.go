// Command paybuttons stores the configurations of checkout payment buttons and serves them over a JSON/HTTP API
// backed by one SQLite file.
//
// Read it in this order: this file (the model every file shares, then the commands), handlers.go (the HTTP API),
// validate.go (request decoding and every field rule), store.go (SQLite). Data walks one way:
// handler -> decode and validate -> store -> envelope.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// --- the model: the nouns every file shares ---

// The error codes a client can see; handlers.go's statusOf gives each its HTTP status.
const (
	codeInvalid          = "invalid_request"
	codeUnauthorized     = "unauthorized"
	codeForbidden        = "forbidden"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeWrongState       = "wrong_state"
	codeInFlight         = "idempotency_in_flight"
	codePrecondition     = "precondition_failed"
	codeTooLarge         = "payload_too_large"
	codeMediaType        = "unsupported_media_type"
	codeMismatch         = "idempotency_mismatch"
	codeRateLimited      = "rate_limited"
	codeCanceled         = "canceled" // the client went away: nobody reads the answer, the access log does
	codeInternal         = "internal"
	codeUnavailable      = "unavailable"
)

// apiError is every failure a client is told about: code is stable and machine-readable, message is for people,
// fields holds every failing field of an invalid_request, retry is when a 429 may be retried. cause is logged, never
// sent.
type apiError struct {
	code    string
	message string
	fields  map[string]string
	retry   time.Duration
	cause   error
}

func (e *apiError) Error() string { return e.message }
func (e *apiError) Unwrap() error { return e.cause }

// LogValue is what a log line says of e: its message and its cause, which the client never sees.
func (e *apiError) LogValue() slog.Value {
	return slog.StringValue(fmt.Sprintf("%s (cause: %v)", e.message, e.cause))
}

var (
	errNotFound           = &apiError{code: codeNotFound, message: "no such button"}
	errUnknownKey         = &apiError{code: codeUnauthorized, message: "the API key is not valid"}
	errPreconditionFailed = &apiError{code: codePrecondition,
		message: "the button has changed since the version in If-Match; get it again"}
	errClosed = &apiError{code: codeUnavailable, message: "the server is shutting down; retry shortly"}
)

const stateActive, stateDeleted = "active", "deleted" // a button's two states

// button is one stored payment button; an absent optional value is its zero value.
type button struct {
	ID, Account     string
	ProductName     string
	Description     string
	AmountMinor     int64 // in the currency's minor unit (cents for USD, yen for JPY)
	Currency        string
	BillingInterval string // "day", "week", "month", "year" or ""
	PaymentMethod   string
	PaymentType     string // "one_time" or "subscription"
	IsLive          bool
	FeeBasisPoints  int64 // ApplicationFeePercentage in hundredths of a percent: 2.50% = 250
	Metadata        metadata
	State           string
	Version         int64
	ChangeSeq       int64 // its place in the database's one sequence of changes
	CreatedAt       timestamp
	UpdatedAt       timestamp
	DeletedAt       timestamp // zero while active
}

// sameAs reports whether b holds every value that a change could make differ from o's.
func (b button) sameAs(o button) bool {
	return b.ProductName == o.ProductName && b.Description == o.Description && b.AmountMinor == o.AmountMinor &&
		b.Currency == o.Currency && b.FeeBasisPoints == o.FeeBasisPoints && b.State == o.State &&
		maps.Equal(b.Metadata, o.Metadata)
}

// apiKey is a key's public record; only the secret's SHA-256 is stored.
type apiKey struct {
	ID, Account string
	Hash        []byte // the secret's SHA-256
	ReadOnly    bool   // may read buttons, never change them
	CreatedAt   timestamp
	LastUsedAt  timestamp // zero if never used
	RevokedAt   timestamp // zero while valid
}

// actor is who asks for a change: the account scopes every query; the ids go into the history.
type actor struct {
	Account, KeyID, RequestID string
	Idempotency               *idempotencyKey // when set, the write's answer is stored with it
}

// idempotencyKey is a client's Idempotency-Key on a write, with what the store needs to keep its answer:
// answerOf(Message, the outcome) is stored with the change, in the same transaction.
type idempotencyKey struct {
	Key         string
	Fingerprint []byte // identifies the request the key was first used with
	Message     string // the write's message on success: "created", "updated", ...
}

// outcome is what a write did to a button.
type outcome struct {
	ID      string
	Version int64 // the button's version after the write
	Changed bool  // false for an update that gave every field the value it had
}

// answer is a rendered response: what is sent, and what is stored for an Idempotency-Key.
type answer struct {
	Fingerprint []byte // of the request it answered, when stored
	Status      int
	Body        []byte
	Version     int64 // sent as the ETag, when not 0
}

// historyEntry is one change to a button, with the button before (zero for the create) and after it.
type historyEntry struct {
	Version                  int64 // the version the change made
	Action, KeyID, RequestID string
	At                       timestamp
	Before, After            button
}

// listFilter selects a page of an account's buttons, newest first.
type listFilter struct {
	Limit         int
	After         string // the last id of the previous page, or ""
	State         string // stateActive, stateDeleted or "all"
	IsLive        *bool
	PaymentMethod string            // "" for any
	Metadata      map[string]string // every key must hold its value
}

const timeLayout = "2006-01-02T15:04:05.000Z07:00" // RFC 3339, UTC, milliseconds

// timestamp is a time as stored and shown: text in timeLayout, NULL and null for the zero time.
type timestamp struct{ time.Time }

// now is the one clock every stored time comes from.
func now() timestamp { return timestamp{time.Now().UTC().Truncate(time.Millisecond)} }

func (t timestamp) String() string { return t.UTC().Format(timeLayout) }

func (t *timestamp) Scan(v any) (err error) {
	t.Time = time.Time{}
	if text, ok := v.(string); ok {
		t.Time, err = time.Parse(timeLayout, text)
	} else if v != nil {
		err = fmt.Errorf("timestamp: cannot read %T", v)
	}
	return err
}

func (t timestamp) Value() (driver.Value, error) {
	if t.IsZero() {
		return nil, nil
	}
	return t.String(), nil
}

func (t timestamp) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + t.String() + `"`), nil
}

// metadata is a button's own keys and values, stored as a JSON object, NULL when empty.
type metadata map[string]string

func (m *metadata) Scan(v any) error {
	*m = nil
	if text, ok := v.(string); ok {
		return json.Unmarshal([]byte(text), m)
	}
	return nil
}

func (m metadata) Value() (driver.Value, error) {
	if len(m) == 0 {
		return nil, nil
	}
	text, err := json.Marshal(m)
	return string(text), err
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idGenerator makes button ids: "btn_" and 26 Crockford base32 characters of 48 bits of Unix milliseconds then 80
// random bits (a ULID). Within a millisecond the random part counts up: the ids one process makes strictly
// increase, and a list cursor never misses a button made after it.
type idGenerator struct {
	mu     sync.Mutex
	hi, lo uint64 // the last id: the milliseconds and 16 random bits, then 64 more
}

func (g *idGenerator) next() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ms := uint64(time.Now().UnixMilli()); ms > g.hi>>16 {
		var r [10]byte
		rand.Read(r[:])
		g.hi, g.lo = ms<<16|uint64(binary.BigEndian.Uint16(r[:])), binary.BigEndian.Uint64(r[2:])
	} else if g.lo++; g.lo == 0 { // same millisecond, or the clock stepped back: count up
		g.hi++
	}
	var out [26]byte
	for i, hi, lo := 25, g.hi, g.lo; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo, hi = lo>>5|hi<<59, hi>>5
	}
	return "btn_" + string(out[:])
}

// validButtonID reports whether id has the form next makes: anything else is not found, without a query.
func validButtonID(id string) bool {
	rest, ok := strings.CutPrefix(id, "btn_")
	return ok && rest != "" && rest[0] <= '7' && asciiIn(rest, 26, 26, crockford)
}

// --- the commands ---

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paybuttons:", err)
		os.Exit(exitStatus(err))
	}
}

// usageError is a mistake in the command line: exit status 2, not 1.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func exitStatus(err error) int {
	var usage *usageError
	if errors.As(err, &usage) {
		return 2
	}
	return 1
}

const usage = `usage:
  paybuttons [serve] [-addr localhost:8080] [-db paybuttons.db] [-provider-name NAME]
                     [-rate 50] [-burst 100] [-max-conns 1024] [-metrics=true]
                     [-tls-cert FILE -tls-key FILE] [-log-format text|json] [-log-level info]
  paybuttons keys create -account NAME [-read-only] [-db FILE]
  paybuttons keys list   [-db FILE]
  paybuttons keys revoke [-db FILE] KEY_ID
  paybuttons backup      [-db FILE] DEST_FILE
  paybuttons check       [-db FILE]
Every flag can also be set with PAYBUTTONS_<FLAG> (PAYBUTTONS_DB, PAYBUTTONS_RATE, ...); a flag beats its variable.`

// run is the whole program: it parses args (args[0] is the program name), reads the environment through getenv and
// returns instead of exiting. Usage mistakes are *usageError.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	args = args[1:]
	command := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		command, args = args[0], args[1:]
	}
	switch command {
	case "serve":
		return serve(ctx, args, getenv, stderr)
	case "keys":
		if len(args) == 0 {
			return &usageError{"keys needs a command: create, list or revoke"}
		}
		return fileCommand(ctx, "keys "+args[0], args[1:], getenv, stdout, stderr)
	case "backup", "check":
		return fileCommand(ctx, command, args, getenv, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return &usageError{fmt.Sprintf("unknown command %q (try: serve, keys, backup, check)", command)}
}

// parseFlags fills fs from the environment (PAYBUTTONS_ and the flag's name in capitals, "-" as "_"), then from
// args, so a flag beats its variable. It returns the database file's flag, which every command has.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) (dbPath string, err error) {
	db := fs.String("db", "paybuttons.db", "SQLite database file")
	fs.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		name := "PAYBUTTONS_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && err == nil {
			if setErr := fs.Set(f.Name, v); setErr != nil {
				err = &usageError{fmt.Sprintf("%s=%q: %v", name, v, setErr)}
			}
		}
	})
	if err != nil {
		return "", err
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return "", &usageError{usage}
	} else if err != nil {
		return "", &usageError{err.Error()}
	}
	return *db, nil
}

// serve runs the HTTP API until ctx ends or SIGINT/SIGTERM arrives, then stops accepting, lets requests in flight
// finish (up to 10 s, then cuts off their connections), checkpoints the WAL and closes the database.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "localhost:8080", "address to listen on")
	providerName := fs.String("provider-name", "the service", "paymentMethod value of the own processor")
	rate := fs.Float64("rate", 50, "requests per second per API key (0: no limit)")
	burst := fs.Int("burst", 100, "requests an API key may send at once")
	maxConns := fs.Int("max-conns", 1024, "open connections at most")
	serveMetrics := fs.Bool("metrics", true, "serve GET /metrics")
	tlsCert := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	tlsKey := fs.String("tls-key", "", "TLS private key file (PEM)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	var logLevel slog.Level
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "least level logged: debug, info, warn or error")
	dbPath, err := parseFlags(fs, args, getenv)
	_, port, addrErr := net.SplitHostPort(*addr)
	if addrErr == nil {
		_, addrErr = net.LookupPort("tcp", port)
	}
	var tlsErr error // read before the first key is minted: a start that fails mints none
	if *tlsCert != "" && *tlsKey != "" {
		_, tlsErr = tls.LoadX509KeyPair(*tlsCert, *tlsKey)
	}
	switch {
	case err != nil:
		return err
	case fs.NArg() > 0:
		return &usageError{fmt.Sprintf("serve takes no arguments, got %q", fs.Arg(0))}
	case addrErr != nil:
		return &usageError{fmt.Sprintf("-addr %q must be host:port, with a port from 0 to 65535", *addr)}
	case math.IsNaN(*rate) || *rate != 0 && (*rate < 0.001 || *rate > 1e6):
		return &usageError{"-rate must be 0 (no limit) or from 0.001 to 1000000 requests a second"}
	case *burst < 1 || *burst > 1e6:
		return &usageError{"-burst must be from 1 to 1000000"}
	case *maxConns < 1 || *maxConns > 1e6:
		return &usageError{"-max-conns must be from 1 to 1000000"}
	case (*tlsCert == "") != (*tlsKey == ""):
		return &usageError{"-tls-cert and -tls-key go together"}
	case strings.TrimSpace(*providerName) == "" || *providerName == "Stripe" || *providerName == "StripeConnect":
		return &usageError{"-provider-name must be a name of its own, not empty, Stripe or StripeConnect"}
	case *logFormat != "text" && *logFormat != "json":
		return &usageError{"-log-format must be text or json"}
	case tlsErr != nil:
		return fmt.Errorf("-tls-cert and -tls-key: %w", tlsErr)
	}
	logOptions := &slog.HandlerOptions{Level: logLevel}
	logger := slog.New(slog.NewTextHandler(stderr, logOptions))
	if *logFormat == "json" {
		logger = slog.New(slog.NewJSONHandler(stderr, logOptions))
	}

	// In this order: a second server is refused before it touches the file, and a start that cannot listen mints no
	// key.
	if dbPath, err = dbFile(dbPath); err != nil {
		return err
	}
	release, err := claimServer(dbPath)
	if err != nil {
		return err
	}
	defer release()
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	defer st.close(false)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := mintFirstKey(ctx, st, stderr); err != nil {
		return err
	}

	conns := &connLimit{max: *maxConns, open: map[net.Conn]http.ConnState{}}
	srv := &http.Server{
		Handler:           newServer(st, logger, config{*providerName, *rate, *burst, *serveMetrics}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		// net/http reads up to 4 KiB past MaxHeaderBytes before it refuses: this makes 16 KiB the most it takes.
		MaxHeaderBytes:               16<<10 - 4<<10,
		DisableGeneralOptionsHandler: true, // OPTIONS * gets the envelope too
		ErrorLog:                     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		ConnState:                    conns.track,
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served, scheme := make(chan error, 1), "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	go func() {
		if scheme == "https" {
			served <- srv.ServeTLS(ln, *tlsCert, *tlsKey)
		} else {
			served <- srv.Serve(ln)
		}
	}()
	logger.Info("listening", "url", scheme+"://"+ln.Addr().String(), "db", dbPath)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	// The signal context is already done: shutdown gets a fresh 10 s of its own.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// A client that does not read its answer must not fail the stop: every change it asked for was committed or
		// refused before its answer was written.
		logger.Warn("cut off the connections of requests still running after 10 s", "err", err)
		srv.Close()
	}
	if err := st.close(true); errors.Is(err, errCheckpointBusy) {
		logger.Warn(err.Error())
	} else if err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// connLimit caps the open connections. At the cap a new connection takes the place of an idle keep-alive one, if
// there is one: idle sockets must not lock clients out. A connection with a request in progress is never cut.
type connLimit struct {
	mu   sync.Mutex
	max  int
	open map[net.Conn]http.ConnState
}

func (l *connLimit) track(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateNew:
		if len(l.open) >= l.max {
			l.closeAnIdleOne()
		}
		if len(l.open) >= l.max {
			c.Close() // its StateClosed comes later, and finds it untracked
			return
		}
		l.open[c] = state
	case http.StateClosed, http.StateHijacked:
		delete(l.open, c)
	default: // active or idle: a connection tracked since StateNew
		if _, tracked := l.open[c]; tracked {
			l.open[c] = state
		}
	}
}

func (l *connLimit) closeAnIdleOne() {
	for c, state := range l.open {
		if state == http.StateIdle {
			c.Close()
			delete(l.open, c)
			return
		}
	}
}

// mintFirstKey gives a database without any key one for account "default", and prints it once on stderr on a line
// of its own, so that `go run .` alone is enough to try the service.
func mintFirstKey(ctx context.Context, st *store, stderr io.Writer) error {
	if keys, err := st.listKeys(ctx); err != nil || len(keys) > 0 {
		return err
	}
	secret, id, err := st.createKey(ctx, "default", false)
	if err == nil {
		fmt.Fprintf(stderr, "paybuttons: no API key existed; created %s for account \"default\". "+
			"It is shown once, here:\n%s\n", id, secret)
	}
	return err
}

// fileCommand runs the commands that work on the database file beside a running server: keys create|list|revoke,
// backup (a consistent copy while servers write) and check (PRAGMA integrity_check: "ok", else exit status 1).
func fileCommand(ctx context.Context, name string, args []string, getenv func(string) string,
	stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	account, readOnly := new(string), new(bool)
	if name == "keys create" {
		fs.StringVar(account, "account", "", "account the new key belongs to")
		fs.BoolVar(readOnly, "read-only", false, "the new key may read buttons, never change them")
	}
	dbPath, err := parseFlags(fs, args, getenv)
	operand := map[string]string{"keys revoke": "KEY_ID", "backup": "DEST_FILE"}[name]
	switch {
	case err != nil:
		return err
	case !slices.Contains([]string{"keys create", "keys list", "keys revoke", "backup", "check"}, name):
		return &usageError{fmt.Sprintf("unknown command %q (try: keys create, keys list, keys revoke)", name)}
	case name == "keys create" && !asciiIn(*account, 1, 64, nameChars):
		return &usageError{"keys create needs -account NAME: 1 to 64 letters, digits, '.', '_' or '-'"}
	case operand == "" && fs.NArg() > 0:
		return &usageError{fmt.Sprintf("%s takes no arguments, got %q", name, fs.Arg(0))}
	case operand != "" && fs.NArg() != 1:
		return &usageError{fmt.Sprintf("%s needs exactly one %s", name, operand)}
	case name != "keys create" && !exists(dbPath):
		return fmt.Errorf("no database at %q", dbPath)
	}
	if dbPath, err = dbFile(dbPath); err != nil {
		return err
	}
	if name == "backup" || name == "check" {
		return backupOrCheck(ctx, name, dbPath, fs.Arg(0), stdout)
	}
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	defer st.close(false)
	switch name {
	case "keys create":
		var secret, id string
		if secret, id, err = st.createKey(ctx, *account, *readOnly); err == nil {
			fmt.Fprintln(stdout, secret)
			fmt.Fprintf(stderr, "paybuttons: created %s for account %q\n", id, *account)
		}
	case "keys list":
		var all []apiKey
		all, err = st.listKeys(ctx)
		for _, k := range all {
			scope := "read-write"
			if k.ReadOnly {
				scope = "read-only"
			}
			fmt.Fprintf(stdout, "%s\t%s\t%s\tcreated %s\tlast used %s\trevoked %s\n", k.ID, k.Account, scope,
				k.CreatedAt, orNever(k.LastUsedAt), orNever(k.RevokedAt))
		}
	case "keys revoke":
		err = st.revokeKey(ctx, fs.Arg(0))
	}
	return cmp.Or(err, st.close(false))
}

// orNever shows a time of keys list, "never" for none.
func orNever(t timestamp) string {
	if t.IsZero() {
		return "never"
	}
	return t.String()
}

// --- rate limits ---

// rateLimiter is a token bucket per key (an API key's id, or an address): rate tokens a second up to burst. A rate
// of 0 turns it off.
type rateLimiter struct {
	rate, burst float64
	mu          sync.Mutex
	buckets     map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*tokenBucket{}}
}

// allow takes a token from key's bucket; when there is none it says how long until there will be. Buckets that have
// filled up again are forgotten once there are many, so that many addresses cannot grow the map without bound.
func (l *rateLimiter) allow(key string, t time.Time) (bool, time.Duration) {
	if l.rate <= 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buckets) > 10_000 {
		maps.DeleteFunc(l.buckets, func(_ string, b *tokenBucket) bool {
			return b.tokens+t.Sub(b.at).Seconds()*l.rate >= l.burst
		})
	}
	b, ok := l.buckets[key]
	if !ok {
		b = &tokenBucket{tokens: l.burst, at: t}
		l.buckets[key] = b
	}
	b.tokens, b.at = min(l.burst, b.tokens+t.Sub(b.at).Seconds()*l.rate), t
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// --- metrics ---

// metrics counts each route pattern's requests by status, and their durations, for /metrics. Labels never hold an
// account, a key or a button id.
type metrics struct {
	mu     sync.Mutex
	routes map[string]*routeMetrics
}

type routeMetrics struct {
	statuses  map[int]int64
	durations [len(durationBounds) + 1]int64 // counts[i] up to durationBounds[i], the last above them all
	seconds   float64
}

// durationBounds are the request duration histogram's buckets, in seconds.
var durationBounds = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}

func (m *metrics) observe(route string, status int, d time.Duration) {
	route = cmp.Or(route, "unmatched")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.routes[route] == nil {
		m.routes[route] = &routeMetrics{statuses: map[int]int64{}}
	}
	rm := m.routes[route]
	rm.statuses[status]++
	i, _ := slices.BinarySearch(durationBounds[:], d.Seconds())
	rm.durations[i]++
	rm.seconds += d.Seconds()
}

// write writes m and st's statistics in the Prometheus text exposition format. It formats into a buffer: a slow
// reader must not hold the lock every request takes.
func (m *metrics) write(w io.Writer, st storage) {
	var out bytes.Buffer
	series := func(name, kind, help string) {
		fmt.Fprintf(&out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	m.mu.Lock()
	routes := slices.Sorted(maps.Keys(m.routes))
	series("paybuttons_http_requests_total", "counter", "Requests answered, by route pattern and status code.")
	for _, route := range routes {
		statuses := m.routes[route].statuses
		for _, status := range slices.Sorted(maps.Keys(statuses)) {
			fmt.Fprintf(&out, "paybuttons_http_requests_total{route=%q,code=\"%d\"} %d\n", route, status, statuses[status])
		}
	}
	const duration = "paybuttons_http_request_duration_seconds"
	series(duration, "histogram", "Time to answer a request, by route pattern.")
	for _, route := range routes {
		var total int64 // the buckets are cumulative
		for i, n := range m.routes[route].durations {
			le := "+Inf"
			if total += n; i < len(durationBounds) {
				le = strconv.FormatFloat(durationBounds[i], 'g', -1, 64)
			}
			fmt.Fprintf(&out, "%s_bucket{route=%q,le=%q} %d\n", duration, route, le, total)
		}
		fmt.Fprintf(&out, "%s_sum{route=%q} %g\n%s_count{route=%q} %d\n", duration, route, m.routes[route].seconds,
			duration, route, total)
	}
	m.mu.Unlock()
	commits, writes, size := st.stats()
	series("paybuttons_db_commits_total", "counter", "Transactions the writer committed.")
	fmt.Fprintf(&out, "paybuttons_db_commits_total %d\n", commits)
	series("paybuttons_db_writes_total", "counter", "Writes committed; over the commits, the mean batch.")
	fmt.Fprintf(&out, "paybuttons_db_writes_total %d\n", writes)
	series("paybuttons_db_size_bytes", "gauge", "Size of the database file.")
	fmt.Fprintf(&out, "paybuttons_db_size_bytes %d\n", size)
	w.Write(out.Bytes())
}

// --- the database file: one name, one server, backup, check ---
// They work on the file, beside the commands that run them; every query of the server is in store.go.

// dbFile returns the one path of the database file at path: its symlinks resolved, so that every name reaching the
// file leads to one lock and one WAL. It fails if the directory does not exist, or if the file has more than one
// hard link: SQLite keeps a WAL per name, and two WALs for one file corrupt it.
func dbFile(path string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return "", fmt.Errorf("database directory %q does not exist", filepath.Dir(path))
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	} else {
		path = filepath.Join(dir, filepath.Base(path))
	}
	// Every Unix counts a file's names in Stat_t.Nlink; reflection reads it without a file per system.
	if info, err := os.Stat(path); err == nil {
		if sys := reflect.Indirect(reflect.ValueOf(info.Sys())); sys.Kind() == reflect.Struct {
			if n := sys.FieldByName("Nlink"); n.CanUint() && n.Uint() > 1 {
				return "", fmt.Errorf("database %q has %d hard links: give it one name, or copy it with backup",
					path, n.Uint())
			}
		}
	}
	return path, nil
}

// sqliteURI names the file at path with params for the driver, the path escaped: a '?' or '#' in it is part of the
// name, never the start of parameters.
func sqliteURI(path, params string) string {
	return "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path) + "?" + params
}

var errLocked = errors.New("locked by another process")

// lockFile takes an exclusive SQLite lock on the file at path, created if need be, and returns it with the file's
// identity; errLocked if another process holds it. The lock lasts until lock.Close, or until the process ends however
// it ends.
func lockFile(path string) (lock *sql.DB, file os.FileInfo, err error) {
	lock, _ = sql.Open("sqlite", sqliteURI(path, "_pragma=busy_timeout(0)&_pragma=journal_mode(OFF)"))
	lock.SetMaxOpenConns(1) // the transaction stays open on the one connection
	if _, err = lock.Exec("BEGIN EXCLUSIVE"); err == nil {
		file, err = os.Stat(path)
	}
	if err != nil {
		lock.Close()
		if sqliteCode(err) == sqlite3.SQLITE_BUSY {
			return nil, nil, errLocked
		}
		return nil, nil, describeOpenError(err)
	}
	return lock, file, nil
}

// sameFile reports whether path names file: it does not once the file was removed or replaced.
func sameFile(path string, file os.FileInfo) bool {
	info, err := os.Stat(path)
	return err == nil && os.SameFile(info, file)
}

// claimServer makes this process the one server of the database file at path (see dbFile) until release; while
// another server holds the file, it fails with a line that says so. keys, backup and check never claim: they work
// beside a server.
//
// The claim is an exclusive lock on the file path+"-lock", which the system drops when the process ends, however it
// ends. Its one weakness is that file's removal by hand (a "stale lock" reflex): the next server would lock a new
// one. So a server puts its lock file back within a second of its removal, and a server that finds no lock file
// while a WAL exists (a sign that some process is using the database) waits two seconds for one to come back.
func claimServer(path string) (release func(), err error) {
	lockPath := path + "-lock"
	if _, err := os.Stat(path + "-wal"); err == nil {
		for start := time.Now(); time.Since(start) < 2*time.Second && !exists(lockPath); {
			time.Sleep(100 * time.Millisecond)
		}
	}
	lock, file, err := lockFile(lockPath)
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("database %q is in use by another server", path)
	} else if err != nil {
		return nil, fmt.Errorf("database %q: lock file: %w", path, err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // puts the lock file back, locked, whenever it is gone
		defer close(stopped)
		for {
			select {
			case <-stop:
				lock.Close()
				return
			case <-time.After(time.Second):
			}
			if sameFile(lockPath, file) {
				continue
			}
			// Locked first, then named: a server waiting for the name never finds it unlocked.
			if fresh, freshFile, err := lockFile(lockPath + ".new"); err == nil && os.Rename(lockPath+".new", lockPath) == nil {
				lock.Close()
				lock, file = fresh, freshFile
			} else if err == nil {
				fresh.Close()
			}
		}
	}()
	return func() { close(stop); <-stopped }, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// backupOrCheck runs backup or check on the paybuttons database at path, which it opens without migrating it. A
// backup refuses to overwrite dest, and copies to a temporary name first: one killed halfway leaves nothing at dest.
func backupOrCheck(ctx context.Context, command, path, dest string, stdout io.Writer) error {
	db, _ := sql.Open("sqlite", sqliteURI(path, "_pragma=busy_timeout(5000)"))
	defer db.Close()
	if version, err := ownVersion(ctx, db); err != nil || version == 0 {
		return fmt.Errorf("database %q: %w", path, cmp.Or(err, errors.New("is not a paybuttons database")))
	}
	if command == "check" {
		var report string
		err := db.QueryRowContext(ctx, `SELECT group_concat(integrity_check, char(10))
			FROM pragma_integrity_check`).Scan(&report)
		if err != nil {
			return fmt.Errorf("database %q: %w", path, describeOpenError(err))
		}
		if fmt.Fprintln(stdout, report); report != "ok" {
			return fmt.Errorf("database %q is damaged: restore it from a backup", path)
		}
		return nil
	}
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	}
	partial := dest + ".partial"
	os.Remove(partial) // what a killed backup left
	os.Remove(partial + "-journal")
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", partial); err != nil {
		return fmt.Errorf("backup to %q: %w", dest, err)
	}
	if err := os.Rename(partial, dest); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s written to %s\n", path, dest)
	return nil
}
