// Command paybuttons stores the configurations of checkout payment buttons and
// serves them over a JSON/HTTP API backed by one SQLite file.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
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
                     [-rate 50] [-burst 100] [-tls-cert FILE -tls-key FILE]
                     [-log-format text|json] [-log-level debug|info|warn|error]
  paybuttons keys create -account NAME [-db FILE]
  paybuttons keys list   [-db FILE]
  paybuttons keys revoke [-db FILE] KEY_ID
  paybuttons backup      [-db FILE] DEST_FILE
  paybuttons version
Every flag can also be set with PAYBUTTONS_<FLAG> (PAYBUTTONS_DB, PAYBUTTONS_RATE, ...); a flag beats its variable.`

// run is the whole program: it parses args (args[0] is the program name),
// reads the environment through getenv and returns instead of exiting. Usage
// mistakes are *usageError.
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
		return keys(ctx, args[0], args[1:], getenv, stdout)
	case "backup":
		return backupCommand(ctx, args, getenv, stdout)
	case "version":
		fmt.Fprintln(stdout, "paybuttons", version())
		return nil
	case "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return &usageError{fmt.Sprintf("unknown command %q (try: serve, keys, backup, version)", command)}
}

// newFlags returns a flag set whose errors come back as *usageError instead of
// being printed.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags fills fs from the environment (PAYBUTTONS_ and the flag's name in
// capitals, "-" as "_"), then from args, so a flag beats its variable.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := "PAYBUTTONS_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && err == nil {
			if setErr := fs.Set(f.Name, v); setErr != nil {
				err = &usageError{fmt.Sprintf("%s=%q: %v", name, v, setErr)}
			}
		}
	})
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &usageError{usage}
		}
		return &usageError{err.Error()}
	}
	return nil
}

// serve runs the HTTP API until ctx ends or SIGINT/SIGTERM arrives, then stops
// accepting, lets requests in flight finish (up to 10 s) and closes the database.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := newFlags("serve")
	addr := fs.String("addr", "localhost:8080", "address to listen on")
	dbPath := fs.String("db", "paybuttons.db", "SQLite database file")
	providerName := fs.String("provider-name", "the service", "paymentMethod value of the own processor")
	rate := fs.Float64("rate", 50, "requests per second per API key (0: no limit)")
	burst := fs.Int("burst", 100, "requests an API key may send at once")
	tlsCert := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	tlsKey := fs.String("tls-key", "", "TLS private key file (PEM)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	var logLevel slog.Level
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "least level logged: debug, info, warn or error")
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return &usageError{fmt.Sprintf("serve takes no arguments, got %q", fs.Arg(0))}
	case *rate < 0 || *burst < 0 || (*rate > 0 && *burst < 1):
		return &usageError{"-rate must be 0 or more, and -burst at least 1 when -rate is set"}
	case (*tlsCert == "") != (*tlsKey == ""):
		return &usageError{"-tls-cert and -tls-key go together"}
	case strings.TrimSpace(*providerName) == "" || *providerName == "Stripe" || *providerName == "StripeConnect":
		return &usageError{"-provider-name must be a name of its own, not empty, Stripe or StripeConnect"}
	case *logFormat != "text" && *logFormat != "json":
		return &usageError{"-log-format must be text or json"}
	}

	// A service's heap is small and mostly garbage per request: collect a
	// quarter as often, but keep Go's memory under 24 MiB (SQLite's page
	// caches come on top). An operator's GOGC or GOMEMLIMIT wins.
	if getenv("GOGC") == "" && getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(400)
		debug.SetMemoryLimit(24 << 20)
	}
	logOut := newLogWriter(stderr, 100*time.Millisecond)
	defer logOut.Close()
	logOptions := &slog.HandlerOptions{Level: logLevel}
	var handler slog.Handler = slog.NewTextHandler(logOut, logOptions)
	if *logFormat == "json" {
		handler = slog.NewJSONHandler(logOut, logOptions)
	}
	logger := slog.New(flushOnWarn{handler, logOut})
	st, err := openStore(*dbPath)
	if err != nil {
		return err
	}
	defer st.close()
	if err := mintFirstKey(ctx, st, stderr); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           newServer(st, logger, *providerName, newRateLimiter(*rate, *burst)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12},
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	scheme := "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	go func() {
		if *tlsCert != "" {
			served <- srv.ServeTLS(ln, *tlsCert, *tlsKey)
		} else {
			served <- srv.Serve(ln)
		}
	}()
	logger.Info("listening", "url", scheme+"://"+ln.Addr().String(), "db", *dbPath, "version", version())

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
	if err := st.close(); err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	logger.Info("stopped")
	return logOut.Close()
}

// logWriter gathers log lines and writes them out at most every interval, so
// that an access line does not cost a write to stderr of its own.
type logWriter struct {
	mu      sync.Mutex
	out     io.Writer
	buf     []byte
	stop    chan struct{}
	stopped chan struct{}
}

func newLogWriter(out io.Writer, interval time.Duration) *logWriter {
	w := &logWriter{out: out, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				w.flush()
			case <-w.stop:
				w.flush()
				return
			}
		}
	}()
	return w
}

// Write takes one log record; slog hands over a whole line at a time.
func (w *logWriter) Write(line []byte) (int, error) {
	w.mu.Lock()
	w.buf = append(w.buf, line...)
	full := len(w.buf) > 64<<10
	w.mu.Unlock()
	if full {
		w.flush()
	}
	return len(line), nil
}

func (w *logWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.out.Write(w.buf)
		w.buf = w.buf[:0]
	}
}

// Close writes what is left and stops the timer; later calls do nothing.
func (w *logWriter) Close() error {
	select {
	case <-w.stopped:
	default:
		close(w.stop)
		<-w.stopped
	}
	return nil
}

// flushOnWarn writes the log out at once after a record at warn level or
// above, so that trouble is never waiting in the buffer.
type flushOnWarn struct {
	slog.Handler
	out *logWriter
}

func (h flushOnWarn) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.out.flush()
	}
	return err
}

func (h flushOnWarn) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushOnWarn{h.Handler.WithAttrs(attrs), h.out}
}

func (h flushOnWarn) WithGroup(name string) slog.Handler {
	return flushOnWarn{h.Handler.WithGroup(name), h.out}
}

// mintFirstKey gives a database without any key one for account "default", and
// prints it once on stderr on a line of its own, so that `go run .` alone is
// enough to try the service.
func mintFirstKey(ctx context.Context, st *store, stderr io.Writer) error {
	n, err := st.countKeys(ctx)
	if err != nil || n > 0 {
		return err
	}
	secret, id, err := st.createKey(ctx, "default")
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "paybuttons: no API key existed; created %s for account \"default\". It is shown once, here:\n%s\n", id, secret)
	return nil
}

// keys runs `keys create|list|revoke`.
func keys(ctx context.Context, command string, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlags("keys " + command)
	dbPath := fs.String("db", "paybuttons.db", "SQLite database file")
	account := fs.String("account", "", "account the new key belongs to (keys create)")
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	switch command {
	case "create":
		if !validAccountName(*account) {
			return &usageError{"keys create needs -account NAME: 1 to 64 letters, digits, '.', '_' or '-'"}
		}
	case "list":
	case "revoke":
		if fs.NArg() != 1 {
			return &usageError{"keys revoke needs exactly one KEY_ID"}
		}
	default:
		return &usageError{fmt.Sprintf("unknown keys command %q (try: create, list, revoke)", command)}
	}
	if command != "revoke" && fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("keys %s takes no arguments, got %q", command, fs.Arg(0))}
	}
	if command != "create" {
		if _, err := os.Stat(*dbPath); err != nil {
			return fmt.Errorf("no database at %q", *dbPath)
		}
	}
	st, err := openStore(*dbPath)
	if err != nil {
		return err
	}
	defer st.close()

	switch command {
	case "create":
		secret, _, err := st.createKey(ctx, *account)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, secret)
	case "list":
		all, err := st.listKeys(ctx)
		if err != nil {
			return err
		}
		for _, k := range all {
			fmt.Fprintf(stdout, "%s\t%s\tcreated %s\tlast used %s\trevoked %s\n",
				k.ID, k.Account, formatTime(k.CreatedAt), orNever(k.LastUsedAt), orNever(k.RevokedAt))
		}
	case "revoke":
		if err := st.revokeKey(ctx, fs.Arg(0)); errors.Is(err, errNotFound) {
			return fmt.Errorf("no key with id %q", fs.Arg(0))
		} else if err != nil {
			return err
		}
	}
	return st.close()
}

// backupCommand runs `backup [-db FILE] DEST_FILE`: a consistent copy of the
// database, taken while servers keep using it.
func backupCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlags("backup")
	dbPath := fs.String("db", "paybuttons.db", "SQLite database file")
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &usageError{"backup needs exactly one DEST_FILE"}
	}
	if err := backup(ctx, *dbPath, fs.Arg(0)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s written to %s\n", *dbPath, fs.Arg(0))
	return nil
}

// version is the module version and VCS revision the binary was built from,
// as far as the build recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		v += " " + rev
		if settings["vcs.modified"] == "true" {
			v += "+modified"
		}
	}
	return v + " " + info.GoVersion
}

func orNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return formatTime(t)
}

// validAccountName keeps account names printable in key listings and logs.
func validAccountName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}
