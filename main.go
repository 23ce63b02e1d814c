// Command paybuttons stores the configurations of checkout payment buttons and serves them over a JSON/HTTP API
// backed by one SQLite file. This file runs the commands; the model every file shares closes it.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
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
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

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
		return keys(ctx, args[0], args[1:], getenv, stdout, stderr)
	case "backup", "check":
		return fileCommand(ctx, command, args, getenv, stdout)
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
// finish (up to 10 s), answers the change feed's waiting requests at once, and closes the database.
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
	switch {
	case err != nil:
		return err
	case fs.NArg() > 0:
		return &usageError{fmt.Sprintf("serve takes no arguments, got %q", fs.Arg(0))}
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
	}

	// The heap is small and mostly garbage per request: collect a quarter as often, but cap Go's memory at 24 MiB and
	// 32 KiB a connection it may hold (else held connections make the GC run back to back). GOGC or GOMEMLIMIT wins.
	if getenv("GOGC") == "" && getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(400)
		debug.SetMemoryLimit(24<<20 + int64(*maxConns)<<15)
	}
	logOut := &logBuffer{out: bufio.NewWriterSize(stderr, 64<<10)}
	defer logOut.Flush()
	logOptions := &slog.HandlerOptions{Level: logLevel}
	var handler slog.Handler = slog.NewTextHandler(logOut, logOptions)
	if *logFormat == "json" {
		handler = slog.NewJSONHandler(logOut, logOptions)
	}
	logger := slog.New(flushOnWarn{handler, logOut})

	// In this order: a second server is refused before it touches the file, and a start that cannot listen mints no
	// key.
	release, err := claimServer(dbPath)
	if err != nil {
		return err
	}
	defer release()
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	defer st.close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := mintFirstKey(ctx, st, stderr); err != nil {
		return err
	}

	api := newServer(st, logger, config{providerName: *providerName, rate: *rate, burst: *burst, metrics: *serveMetrics})
	var open atomic.Int64
	var refused sync.Map // connections closed at StateNew, already uncounted
	srv := &http.Server{
		Handler:                      api,
		ReadHeaderTimeout:            5 * time.Second,
		ReadTimeout:                  10 * time.Second,
		WriteTimeout:                 15 * time.Second,
		IdleTimeout:                  60 * time.Second,
		MaxHeaderBytes:               16 << 10,
		DisableGeneralOptionsHandler: true, // OPTIONS * gets the envelope too
		ErrorLog:                     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		// Past -max-conns a new connection is closed at once: idle connections cost memory, and a flood of them
		// must not grow it.
		ConnState: func(c net.Conn, state http.ConnState) {
			switch _, wasRefused := refused.LoadAndDelete(c); {
			case state == http.StateNew && open.Add(1) > int64(*maxConns):
				open.Add(-1) // at once: a burst of refusals must not hold places until their goroutines close them
				refused.Store(c, true)
				c.Close()
			case (state == http.StateClosed || state == http.StateHijacked) && !wasRefused:
				open.Add(-1)
			}
		},
	}
	srv.RegisterOnShutdown(api.stop)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served, scheme := make(chan error, 1), "http"
	if *tlsCert != "" {
		scheme = "https"
		go func() { served <- srv.ServeTLS(ln, *tlsCert, *tlsKey) }()
	} else {
		go func() { served <- srv.Serve(ln) }()
	}
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
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := st.close(); errors.Is(err, errCheckpointBusy) {
		logger.Warn(err.Error())
	} else if err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	logger.Info("stopped")
	return logOut.Flush()
}

// logBuffer holds log lines for up to 100 ms, so that an access line does not cost a write to stderr of its own.
// Warnings and errors go out at once (flushOnWarn).
type logBuffer struct {
	mu  sync.Mutex
	out *bufio.Writer
}

func (l *logBuffer) Write(line []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.out.Buffered() == 0 {
		time.AfterFunc(100*time.Millisecond, func() { l.Flush() })
	}
	return l.out.Write(line)
}

func (l *logBuffer) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Flush()
}

// flushOnWarn writes the log out at once after a record at warn level or above, so that trouble is never waiting in
// the buffer. (Nothing calls With on the logger, which would return the handler it wraps.)
type flushOnWarn struct {
	slog.Handler
	out *logBuffer
}

func (h flushOnWarn) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.out.Flush()
	}
	return err
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

// keys runs `keys create|list|revoke`.
func keys(ctx context.Context, command string, args []string, getenv func(string) string,
	stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keys "+command, flag.ContinueOnError)
	account := fs.String("account", "", "account the new key belongs to (keys create)")
	readOnly := fs.Bool("read-only", false, "the new key may read buttons, never change them (keys create)")
	dbPath, err := parseFlags(fs, args, getenv)
	switch {
	case err != nil:
		return err
	case command != "create" && command != "list" && command != "revoke":
		return &usageError{fmt.Sprintf("unknown keys command %q (try: create, list, revoke)", command)}
	case command == "create" && !asciiIn(*account, 1, 64, nameChars):
		return &usageError{"keys create needs -account NAME: 1 to 64 letters, digits, '.', '_' or '-'"}
	case command == "revoke" && fs.NArg() != 1:
		return &usageError{"keys revoke needs exactly one KEY_ID"}
	case command != "revoke" && fs.NArg() > 0:
		return &usageError{fmt.Sprintf("keys %s takes no arguments, got %q", command, fs.Arg(0))}
	}
	if _, err := os.Stat(dbPath); err != nil && command != "create" {
		return fmt.Errorf("no database at %q", dbPath)
	}
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	defer st.close()
	switch command {
	case "create":
		var secret, id string
		if secret, id, err = st.createKey(ctx, *account, *readOnly); err == nil {
			fmt.Fprintln(stdout, secret)
			fmt.Fprintf(stderr, "paybuttons: created %s for account %q\n", id, *account)
		}
	case "list":
		var all []apiKey
		all, err = st.listKeys(ctx)
		orNever := func(t timestamp) string { return map[bool]string{true: "never", false: t.String()}[t.IsZero()] }
		for _, k := range all {
			fmt.Fprintf(stdout, "%s\t%s\t%s\tcreated %s\tlast used %s\trevoked %s\n", k.ID, k.Account,
				map[bool]string{false: "read-write", true: "read-only"}[k.ReadOnly], k.CreatedAt,
				orNever(k.LastUsedAt), orNever(k.RevokedAt))
		}
	case "revoke":
		err = st.revokeKey(ctx, fs.Arg(0))
	}
	return cmp.Or(err, st.close())
}

// fileCommand runs `backup [-db FILE] DEST_FILE`, a consistent copy of the database taken while servers keep using
// it, or `check [-db FILE]`, which says "ok" or what is damaged (then exit status 1).
func fileCommand(ctx context.Context, command string, args []string, getenv func(string) string,
	stdout io.Writer) error {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	dbPath, err := parseFlags(fs, args, getenv)
	switch {
	case err != nil:
		return err
	case command == "backup" && fs.NArg() != 1:
		return &usageError{"backup needs exactly one DEST_FILE"}
	case command == "check" && fs.NArg() != 0:
		return &usageError{fmt.Sprintf("check takes no arguments, got %q", fs.Arg(0))}
	case command == "backup":
		if err := backup(ctx, dbPath, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "backup of %s written to %s\n", dbPath, fs.Arg(0))
		return nil
	}
	report, err := integrityCheck(ctx, dbPath)
	if err == nil {
		fmt.Fprintln(stdout, report)
	}
	if err == nil && report != "ok" {
		err = fmt.Errorf("database %q is damaged: restore it from a backup", dbPath)
	}
	return err
}

// --- the file beside the server: one server at a time, backup, check ---
// They work on the file without the store, beside the commands that run them; the server's queries are in store.go.

// checkDir fails unless the directory the database file is in exists.
func checkDir(path string) error {
	if info, err := os.Stat(filepath.Dir(path)); err != nil || !info.IsDir() {
		return fmt.Errorf("database directory %q does not exist", filepath.Dir(path))
	}
	return nil
}

// claimServer makes this process the one server of the database at path until release; another claim fails at once.
// It holds an exclusive SQLite lock on path+"-lock", which the system drops when the process ends however it ends.
// keys, backup and check never claim: they work beside a server.
func claimServer(path string) (release func() error, err error) {
	if err := checkDir(path); err != nil {
		return nil, err
	}
	db, _ := sql.Open("sqlite", path+"-lock?_pragma=busy_timeout(0)&_pragma=journal_mode(OFF)")
	conn, err := db.Conn(context.Background())
	if err == nil {
		_, err = conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE")
	}
	switch {
	case sqliteCode(err) == sqlite3.SQLITE_BUSY:
		err = fmt.Errorf("database %q is in use by another server", path)
	case err != nil:
		err = fmt.Errorf("database %q: lock file: %w", path, describeOpenError(err))
	default:
		return func() error { return errors.Join(conn.Close(), db.Close()) }, nil
	}
	db.Close()
	return nil, err
}

// openOwn opens the paybuttons database at path without migrating it.
func openOwn(ctx context.Context, path string) (*sql.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no database at %q", path)
	}
	db, _ := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)")
	version, err := ownVersion(ctx, db)
	if err == nil && version == 0 {
		err = errors.New("is not a paybuttons database")
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("database %q: %w", path, describeOpenError(err))
	}
	return db, nil
}

// backup writes a consistent copy of the database at src to dest while servers write to it. It refuses to overwrite
// dest, and copies to a temporary name first: a backup killed halfway leaves nothing at dest.
func backup(ctx context.Context, src, dest string) error {
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	}
	db, err := openOwn(ctx, src)
	if err != nil {
		return err
	}
	defer db.Close()
	partial := dest + ".partial"
	os.Remove(partial) // what a killed backup left
	os.Remove(partial + "-journal")
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", partial); err != nil {
		return fmt.Errorf("backup to %q: %w", dest, err)
	}
	return os.Rename(partial, dest)
}

// integrityCheck returns what PRAGMA integrity_check says of the database at path: "ok", or a line for each problem
// found.
func integrityCheck(ctx context.Context, path string) (string, error) {
	db, err := openOwn(ctx, path)
	if err != nil {
		return "", err
	}
	defer db.Close()
	var report string
	err = db.QueryRowContext(ctx, `SELECT group_concat(integrity_check, char(10))
		FROM pragma_integrity_check`).Scan(&report)
	return report, describeOpenError(err)
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
	durations histogram
}

// durationBounds are the request duration histogram's buckets, in seconds.
var durationBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}

func (m *metrics) observe(route string, status int, d time.Duration) {
	route = cmp.Or(route, "unmatched")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.routes[route] == nil {
		m.routes[route] = &routeMetrics{statuses: map[int]int64{},
			durations: histogram{bounds: durationBounds, counts: make([]int64, len(durationBounds)+1)}}
	}
	m.routes[route].statuses[status]++
	m.routes[route].durations.observe(d.Seconds())
}

// histogram counts observations into buckets: counts[i] those up to bounds[i], the last those above every bound.
type histogram struct {
	bounds []float64
	counts []int64
	sum    float64
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(h.bounds, v)
	h.counts[i]++
	h.sum += v
}

// write writes h in the Prometheus text format, its buckets cumulative; label is `name="value"` or "".
func (h *histogram) write(w io.Writer, name, label string) {
	var total int64
	for i, n := range h.counts {
		total += n
		le := "+Inf"
		if i < len(h.bounds) {
			le = strconv.FormatFloat(h.bounds[i], 'g', -1, 64)
		}
		fmt.Fprintf(w, "%s_bucket{%s%sle=%q} %d\n", name, label, strings.Repeat(",", min(len(label), 1)), le, total)
	}
	if label != "" {
		label = "{" + label + "}"
	}
	fmt.Fprintf(w, "%s_sum%s %g\n%s_count%s %d\n", name, label, h.sum, name, label, total)
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
	series("paybuttons_http_request_duration_seconds", "histogram", "Time to answer a request, by route pattern.")
	for _, route := range routes {
		m.routes[route].durations.write(&out, "paybuttons_http_request_duration_seconds", fmt.Sprintf("route=%q", route))
	}
	m.mu.Unlock()
	commits, ops, batches, size := st.stats()
	series("paybuttons_db_commits_total", "counter", "Transactions the writer committed.")
	fmt.Fprintf(&out, "paybuttons_db_commits_total %d\n", commits)
	series("paybuttons_db_batch_size", "histogram", "Writes committed together in one transaction.")
	sizes := histogram{bounds: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}, counts: append(batches, 0), sum: float64(ops)}
	sizes.write(&out, "paybuttons_db_batch_size", "")
	series("paybuttons_db_size_bytes", "gauge", "Size of the database file.")
	fmt.Fprintf(&out, "paybuttons_db_size_bytes %d\n", size)
	w.Write(out.Bytes())
}

// --- the model: the types and values every file shares ---

const stateActive, stateDeleted = "active", "deleted" // a button's two states

// apiError is every failure a client is told about: code is stable and machine-readable (handlers.go maps it to a
// status), message is for people, fields holds every failing field for invalid_request. cause is logged, never
// sent.
type apiError struct {
	code    string
	message string
	fields  map[string]string
	cause   error
}

func (e *apiError) Error() string { return e.message }
func (e *apiError) Unwrap() error { return e.cause }

// LogValue is what a log line says of e: its message and its cause, which the client never sees.
func (e *apiError) LogValue() slog.Value {
	return slog.StringValue(fmt.Sprintf("%s (cause: %v)", e.message, e.cause))
}

var (
	errNotFound           = &apiError{code: "not_found", message: "no such button"}
	errUnknownKey         = &apiError{code: "unauthorized", message: "the API key is not valid"}
	errPreconditionFailed = &apiError{code: "precondition_failed",
		message: "the button has changed since the version in If-Match; get it again"}
	errClosed = &apiError{code: "unavailable", message: "the server is shutting down; retry shortly"}
)

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
	Hash        []byte // the secret's SHA-256, as liveKeys reads it
	ReadOnly    bool   // may read buttons, never change them
	CreatedAt   timestamp
	LastUsedAt  timestamp // zero if never used
	RevokedAt   timestamp // zero while valid
}

// actor is who asks for a change: the account scopes every query; the ids go into the history.
type actor struct {
	Account, KeyID, RequestID string
	Idempotency               *idempotencyKey // keeps the answer with the change, when set
}

// idempotencyKey is a client's Idempotency-Key on a write. The writer calls Render once, inside the write's
// transaction, and stores its bytes with the change; Answer then holds them, for the handler to send as they are.
type idempotencyKey struct {
	Key         string
	Fingerprint []byte // identifies the request the key was first used with
	Render      func(outcome, error) storedResponse
	Answer      storedResponse
}

// outcome is what a write did to a button.
type outcome struct {
	ID      string
	Changed bool // false for an update that gave every field the value it had
}

// storedResponse is an answer kept for an Idempotency-Key.
type storedResponse struct {
	Fingerprint []byte
	Status      int
	Body        []byte
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
	State         string // stateActive, stateDeleted or "" for both
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
