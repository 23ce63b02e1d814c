// Command paybuttons stores the configurations of checkout payment buttons and serves them over a
// JSON/HTTP API, from one SQLite file.
//
// Read store.go first (the model every file shares, then the storage API), then validate.go
// (request decoding and every field rule), handlers.go (the HTTP API) and this file (the commands).
// Data walks one way: handler, decode and validate, store, envelope.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
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

// usageError is a mistake in the command line: exit status 2, where other errors are 1.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func exitStatus(err error) int {
	if err == nil {
		return 0
	} else if errors.As(err, new(*usageError)) {
		return 2
	}
	return 1
}

const usage = `usage:
  paybuttons [serve] [-addr localhost:8080] [-provider-name NAME] [-rate 50] [-burst 100]
                     [-tls-cert FILE -tls-key FILE] [-log-format text|json]
  paybuttons keys create -account NAME [-read-only]
  paybuttons keys list | keys revoke KEY_ID | backup DEST_FILE | check
Each takes -db (paybuttons.db). Every flag can also be set as PAYBUTTONS_<FLAG>
(PAYBUTTONS_DB, ...); a flag beats its variable.`

// run is the whole program: args[0] is its name, getenv reads the environment. It returns what main
// would exit with; a mistake in the command line is a *usageError.
func run(ctx context.Context, args []string, getenv func(string) string,
	stdout, stderr io.Writer) error {
	command, args := "serve", args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		command, args = args[0], args[1:]
	}
	if command == "keys" && len(args) > 0 {
		command, args = "keys "+args[0], args[1:]
	}
	switch command {
	case "serve":
		return serve(ctx, args, getenv, stderr)
	case "keys create", "keys list", "keys revoke", "backup", "check":
		return fileCommand(ctx, command, args, getenv, stdout, stderr)
	}
	return &usageError{fmt.Sprintf("unknown command %q: try serve, keys, backup or check", command)}
}

// parseFlags sets fs's flags from the environment (PAYBUTTONS_ and the name in capitals, "-" as
// "_"), then from args. It returns the -db flag, which every command has.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) (dbPath string,
	err error) {
	db := fs.String("db", "paybuttons.db", "SQLite database file")
	fs.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		name := "PAYBUTTONS_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && err == nil && fs.Set(f.Name, v) != nil {
			err = &usageError{fmt.Sprintf("%s=%q is not a valid -%s", name, v, f.Name)}
		}
	})
	if err == nil {
		err = fs.Parse(args)
	}
	if errors.Is(err, flag.ErrHelp) {
		return "", &usageError{usage}
	} else if err != nil && !errors.As(err, new(*usageError)) {
		return "", &usageError{err.Error()}
	}
	return *db, err
}

// serve runs the API until ctx ends or SIGINT or SIGTERM arrives. Then it stops accepting, lets the
// requests in flight finish (up to 10 s, then cuts their connections), closes the database and
// returns nil.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "localhost:8080", "address to listen on")
	providerName := fs.String("provider-name", "the service", "paymentMethod of the own processor")
	rate := fs.Float64("rate", 50, "requests a second per API key (0: no limit)")
	burst := fs.Int("burst", 100, "requests an API key may send at once")
	certFile := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	keyFile := fs.String("tls-key", "", "TLS private key file (PEM)")
	logFormat := fs.String("log-format", "text", "text or json")
	dbPath, err := parseFlags(fs, args, getenv)
	_, port, addrErr := net.SplitHostPort(*addr)
	if addrErr == nil {
		_, addrErr = net.LookupPort("tcp", port)
	}
	switch {
	case err != nil:
		return err
	case fs.NArg() > 0:
		return &usageError{fmt.Sprintf("serve takes no arguments, got %q", fs.Arg(0))}
	case addrErr != nil:
		return &usageError{fmt.Sprintf("-addr %q must be host:port, a port from 0 to 65535", *addr)}
	case !(*rate == 0 || *rate >= 0.001 && *rate <= 1e6): // NaN too
		return &usageError{"-rate must be 0 (no limit) or from 0.001 to 1000000 requests a second"}
	case *burst < 1 || *burst > 1e6:
		return &usageError{"-burst must be from 1 to 1000000"}
	case (*certFile == "") != (*keyFile == ""):
		return &usageError{"-tls-cert and -tls-key go together"}
	case strings.TrimSpace(*providerName) == "" || *providerName == "Stripe" ||
		*providerName == "StripeConnect":
		return &usageError{"-provider-name must be a name of its own: not Stripe or StripeConnect"}
	case *logFormat != "text" && *logFormat != "json":
		return &usageError{"-log-format must be text or json"}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if *logFormat == "json" {
		log = slog.New(slog.NewJSONHandler(stderr, nil))
	}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		// net/http reads up to 4 KiB past MaxHeaderBytes before it refuses: the most it takes is 16
		// KiB.
		MaxHeaderBytes:               12 << 10,
		DisableGeneralOptionsHandler: true, // OPTIONS * gets the envelope too
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var certificate []tls.Certificate
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return fmt.Errorf("-tls-cert and -tls-key: %w", err)
		}
		certificate = append(certificate, cert)
	}

	// In this order: a second server is refused before it touches the file, and a start that fails
	// mints no key.
	dbPath, err = dbFile(dbPath)
	if err != nil {
		return err
	}
	lock, err := lockServer(dbPath)
	if err != nil {
		return err
	}
	defer lock.Close()
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	defer st.close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	scheme := "http"
	if certificate != nil {
		ln, scheme = tls.NewListener(ln, &tls.Config{Certificates: certificate}), "https"
	}
	if keys, err := st.listKeys(ctx); err != nil {
		return err
	} else if len(keys) == 0 { // a first key, so that `go run .` alone is enough to try the service
		secret, id, err := st.createKey(ctx, "default", false)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "paybuttons: no API key existed; created %s for account \"default\". "+
			"It is shown once, here:\n%s\n", id, secret)
	}

	srv.Handler = newServer(st, log, config{*providerName, *rate, *burst})
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "url", scheme+"://"+ln.Addr().String(), "db", dbPath)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	// A context of its own: ctx is done already.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Every change a request still running asked for is committed or refused before its answer
		// is written: cutting its connection loses nothing.
		log.Warn("cut the connections of requests still running after 10 s", "err", err)
		srv.Close()
	}
	log.Info("stopped") // then the deferred close checkpoints the WAL, and the lock goes last
	return nil
}

// fileCommand runs a command that works on the database file beside a running server: keys
// create, list and revoke, backup (a consistent copy) and check (PRAGMA integrity_check).
func fileCommand(ctx context.Context, command string, args []string, getenv func(string) string,
	stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	account := fs.String("account", "", "keys create: the account of the new key")
	readOnly := fs.Bool("read-only", false, "keys create: the new key reads, never changes")
	dbPath, err := parseFlags(fs, args, getenv)
	wantArgs := 0
	if command == "keys revoke" || command == "backup" {
		wantArgs = 1 // KEY_ID, DEST_FILE
	}
	_, statErr := os.Stat(dbPath)
	switch {
	case err != nil:
		return err
	case command != "keys create" && (*account != "" || *readOnly):
		return &usageError{"only keys create takes -account and -read-only"}
	case command == "keys create" && !(len(*account) >= 1 && len(*account) <= 64 &&
		onlyOf(*account, nameChars)):
		return &usageError{"keys create needs -account NAME: 1 to 64 of A-Z a-z 0-9 . _ -"}
	case fs.NArg() != wantArgs:
		return &usageError{fmt.Sprintf("%s takes %d argument(s), got %d", command, wantArgs,
			fs.NArg())}
	case command != "keys create" && statErr != nil:
		return fmt.Errorf("no database at %q", dbPath)
	}
	dbPath, err = dbFile(dbPath)
	if err != nil {
		return err
	}
	if command == "backup" || command == "check" { // they read the file, and write nothing to it
		db, err := openToRead(dbPath)
		if err != nil {
			return err
		}
		defer db.Close()
		if command == "backup" {
			return backup(db, dbPath, fs.Arg(0), stdout)
		}
		return check(db, dbPath, stdout)
	}
	st, err := openStore(dbPath)
	if err != nil {
		return err
	}
	switch command {
	case "keys create":
		err = createKey(ctx, st, *account, *readOnly, stdout, stderr)
	case "keys list":
		err = listKeys(ctx, st, stdout)
	case "keys revoke":
		err = st.revokeKey(ctx, fs.Arg(0))
	}
	return errors.Join(err, st.close())
}

// createKey prints only the new key on stdout, for $(...), and its id on stderr.
func createKey(ctx context.Context, st *store, account string, readOnly bool,
	stdout, stderr io.Writer) error {
	secret, id, err := st.createKey(ctx, account, readOnly)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, secret)
	fmt.Fprintf(stderr, "paybuttons: created %s for account %q\n", id, account)
	return nil
}

// listKeys prints every key, a line each: never a secret.
func listKeys(ctx context.Context, st *store, stdout io.Writer) error {
	keys, err := st.listKeys(ctx)
	for _, k := range keys {
		scope := "read-write"
		if k.ReadOnly {
			scope = "read-only"
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\tcreated %s\tlast used %s\trevoked %s\n", k.ID, k.Account,
			scope, k.CreatedAt, cmp.Or(k.LastUsedAt, "never"), cmp.Or(k.RevokedAt, "never"))
	}
	return err
}

// backup copies the database to dest, never over a file there. It writes a temporary file first: a
// backup killed halfway leaves nothing at dest.
func backup(db *sql.DB, dbPath, dest string, stdout io.Writer) error {
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	}
	os.Remove(dest + ".partial") // what a killed backup left
	if _, err := db.Exec("VACUUM INTO ?", dest+".partial"); err != nil {
		return err
	}
	if err := os.Rename(dest+".partial", dest); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s written to %s\n", dbPath, dest)
	return nil
}

// check prints what SQLite's integrity check finds: "ok", or the damage, which is an error.
func check(db *sql.DB, dbPath string, stdout io.Writer) error {
	var report string
	err := db.QueryRow(`SELECT group_concat(integrity_check, char(10))
		FROM pragma_integrity_check`).Scan(&report)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, report)
	if report != "ok" {
		return fmt.Errorf("database %q is damaged: restore it from a backup", dbPath)
	}
	return nil
}

// --- one database file, one server ---

// dbFile returns the one path of the database file at path, its symlinks resolved: every name of
// the file then leads to one lock file and one WAL. It fails when the directory does not exist, or
// when the file has more than one hard link: SQLite keeps a WAL per name, and two WALs of one file
// corrupt it.
func dbFile(path string) (string, error) {
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return "", fmt.Errorf("database directory %q does not exist", filepath.Dir(path))
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	// Every Unix counts a file's names in Stat_t.Nlink; reflection reads it with no file per
	// system.
	if info, err := os.Stat(path); err == nil {
		if sys := reflect.Indirect(reflect.ValueOf(info.Sys())); sys.Kind() == reflect.Struct {
			if n := sys.FieldByName("Nlink"); n.CanUint() && n.Uint() > 1 {
				return "", fmt.Errorf("database %q has %d hard links: give it one", path, n.Uint())
			}
		}
	}
	return path, nil
}

// lockServer makes this process the one server of the database file at path until the lock it
// returns is closed or the process ends, however it ends: it holds an exclusive SQLite lock on the
// file path+"-lock". The commands never take it, so they work beside a server. Removing that file
// by hand while a server runs would let a second one start.
func lockServer(path string) (*sql.DB, error) {
	lock, _ := sql.Open("sqlite", sqliteURI(path+"-lock",
		"_pragma=busy_timeout(0)&_pragma=journal_mode(OFF)"))
	lock.SetMaxOpenConns(1) // the transaction stays open on the one connection
	_, err := lock.Exec("BEGIN EXCLUSIVE")
	if sqliteCode(err) == sqlite3.SQLITE_BUSY {
		err = errors.New("is in use by another server")
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("database %q %w", path, err)
	}
	return lock, nil
}
