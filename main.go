// Command paybuttons stores the configurations of checkout payment buttons in one SQLite file and
// serves them over a JSON/HTTP API.
//
// Read store.go first: it holds the model that every file shares, then the storage API. Then read
// validate.go (request decoding and every field rule), handlers.go (the HTTP API) and this file
// (the commands). Data flows in one direction: handler, decode and validate, store, envelope.
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
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paybuttons:", err)
		os.Exit(exitStatus(err))
	}
}

// usageError is a mistake in the command line. It gives exit status 2, and other errors give 1.
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
  paybuttons [serve] [-addr localhost:8080] [-provider-name NAME] [-log-format text|json]
                     [-tls-cert FILE -tls-key FILE]
  paybuttons keys create -account NAME [-read-only]
  paybuttons keys list | keys revoke KEY_ID | backup DEST_FILE | check
Each takes -db (paybuttons.db). serve's flags and -db can also be set as PAYBUTTONS_<FLAG>
(PAYBUTTONS_DB, PAYBUTTONS_PROVIDER_NAME, ...); a flag beats its variable.`

// run is the whole program. args[0] is the program's name, and getenv reads the environment. It
// returns the error that main exits with. A mistake in the command line is a *usageError.
func run(ctx context.Context, args []string, getenv func(string) string,
	stdout, stderr io.Writer) error {
	command, args := "serve", args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		command, args = args[0], args[1:]
	}
	if command == "keys" && len(args) > 0 {
		command, args = "keys "+args[0], args[1:]
	}
	// The environment sets the defaults of the deployment's flags, which are serve's flags and
	// the -db of every command.
	env := func(name, def string) string { return cmp.Or(getenv("PAYBUTTONS_"+name), def) }
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	db := fs.String("db", env("DB", "paybuttons.db"), "SQLite database file")
	switch command {
	case "serve":
		return serve(ctx, fs, db, args, env, stderr)
	case "keys create":
		return keysCreate(ctx, fs, db, args, stdout, stderr)
	case "keys list":
		return keysList(ctx, fs, db, args, stdout)
	case "keys revoke":
		return keysRevoke(ctx, fs, db, args)
	case "backup":
		return backup(fs, db, args, stdout)
	case "check":
		return check(fs, db, args, stdout)
	case "keys":
		return &usageError{"keys needs a command: keys create, keys list or keys revoke"}
	}
	return &usageError{fmt.Sprintf("unknown command %q: try serve, keys, backup or check", command)}
}

// parseFlags parses args into fs and checks that exactly want arguments remain after the flags.
func parseFlags(fs *flag.FlagSet, args []string, want int) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return &usageError{usage}
	} else if err != nil {
		return &usageError{err.Error()}
	} else if fs.NArg() != want {
		return &usageError{fmt.Sprintf("%s takes %d argument(s), got %d", fs.Name(), want,
			fs.NArg())}
	}
	return nil
}

// serve runs the API until ctx ends or SIGINT or SIGTERM arrives. Then it stops accepting
// connections and gives the requests in flight up to 10 s to finish, after which it cuts their
// connections. Finally it closes the database and returns nil.
func serve(ctx context.Context, fs *flag.FlagSet, db *string, args []string,
	env func(name, def string) string, stderr io.Writer) error {
	addr := fs.String("addr", env("ADDR", "localhost:8080"), "address to listen on")
	providerName := fs.String("provider-name", env("PROVIDER_NAME", "the service"),
		"paymentMethod of the own processor")
	certFile := fs.String("tls-cert", env("TLS_CERT", ""), "TLS certificate file (PEM)")
	keyFile := fs.String("tls-key", env("TLS_KEY", ""), "TLS private key file (PEM)")
	logFormat := fs.String("log-format", env("LOG_FORMAT", "text"), "text or json")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	_, port, addrErr := net.SplitHostPort(*addr)
	if addrErr == nil {
		_, addrErr = net.LookupPort("tcp", port)
	}
	switch {
	case addrErr != nil:
		return &usageError{fmt.Sprintf("-addr %q must be host:port, a port from 0 to 65535", *addr)}
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
		ReadHeaderTimeout:            5 * time.Second,
		ReadTimeout:                  10 * time.Second,
		WriteTimeout:                 15 * time.Second,
		IdleTimeout:                  60 * time.Second,
		MaxHeaderBytes:               12 << 10, // net/http adds 4 KiB to this, for 16 KiB in all
		DisableGeneralOptionsHandler: true,     // so that OPTIONS * gets the envelope too
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var certificates []tls.Certificate
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return fmt.Errorf("-tls-cert and -tls-key: %w", err)
		}
		certificates = append(certificates, cert)
	}

	// Listen on the port first, so that a start that fails there touches no file. Create the first
	// key last, so that a start that fails creates no key.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	st, err := openStore(*db, true)
	if err != nil {
		return err
	}
	defer st.close()
	if err := firstKey(ctx, st, stderr, log); err != nil {
		return err
	}
	scheme := "http"
	if certificates != nil {
		ln, scheme = tls.NewListener(ln, &tls.Config{Certificates: certificates}), "https"
	}

	srv.Handler = newServer(st, log, *providerName)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "url", scheme+"://"+ln.Addr().String(), "db", *db)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	// Shutdown needs a context of its own, because ctx is already done.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// A request's change is committed or refused before its answer is written. So cutting the
		// connection of a request that is still running loses nothing.
		log.Warn("cut the connections of requests still running after 10 s", "err", err)
		srv.Close()
	}
	log.Info("stopped") // then the deferred close checkpoints the WAL
	return nil
}

// firstKey creates a key for account "default" when the database has none, so that `go run .`
// alone is enough to try the service. It prints the secret only to a terminal, because a secret
// must never go to a log, and under systemd stderr is the journal. When stderr is not a terminal,
// it logs how to make a key instead.
func firstKey(ctx context.Context, st *store, stderr io.Writer, log *slog.Logger) error {
	keys, err := listKeys(ctx, st.reader)
	if err != nil || len(keys) > 0 {
		return err
	}
	if !isTerminal(stderr) {
		log.Warn("no API key exists: make one with `paybuttons keys create -account NAME`")
		return nil
	}
	secret, id, err := st.createKey(ctx, "default", false)
	if err == nil {
		fmt.Fprintf(stderr, "paybuttons: no API key existed; created %s for account \"default\". "+
			"It is shown once, here:\n%s\n", id, secret)
	}
	return err
}

// isTerminal reports whether w is a terminal, as far as the standard library can tell. That means
// a character device other than the null device, since a secret written to the null device is lost.
func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := file.Stat()
	null, nullErr := os.Stat(os.DevNull)
	return err == nil && info.Mode()&os.ModeCharDevice != 0 &&
		(nullErr != nil || !os.SameFile(info, null))
}

// keysCreate creates a key. It prints only the secret on stdout, so that $(...) captures it, and
// the key's id on stderr. The environment never sets -account or -read-only, so they are chosen
// for each key.
func keysCreate(ctx context.Context, fs *flag.FlagSet, db *string, args []string,
	stdout, stderr io.Writer) error {
	account := fs.String("account", "", "the account of the new key")
	readOnly := fs.Bool("read-only", false, "the new key reads, never changes")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if len(*account) < 1 || len(*account) > 64 || !onlyOf(*account, nameChars) {
		return &usageError{"keys create needs -account NAME: 1 to 64 of A-Z a-z 0-9 . _ -"}
	}
	_, err := os.Stat(*db)
	isNew := errors.Is(err, os.ErrNotExist)
	st, err := openStore(*db, true)
	if err != nil {
		return err
	}
	defer st.close()
	if isNew {
		fmt.Fprintf(stderr, "paybuttons: made a new database %s\n", *db)
	}
	secret, id, err := st.createKey(ctx, *account, *readOnly)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, secret)
	fmt.Fprintf(stderr, "paybuttons: created %s for account %q\n", id, *account)
	return nil
}

// readOnlyDatabase parses args into fs, which must leave no arguments, and opens the database at
// db read-only. It is for the commands that only read the database.
func readOnlyDatabase(fs *flag.FlagSet, args []string, db *string) (*sql.DB, error) {
	if err := parseFlags(fs, args, 0); err != nil {
		return nil, err
	}
	return openToRead(*db)
}

// keysList prints every key, one line each. It never prints a secret.
func keysList(ctx context.Context, fs *flag.FlagSet, db *string, args []string,
	stdout io.Writer) error {
	file, err := readOnlyDatabase(fs, args, db)
	if err != nil {
		return err
	}
	defer file.Close()
	keys, err := listKeys(ctx, file)
	for _, k := range keys {
		scope, revoked := "read-write", k.RevokedAt
		if k.ReadOnly {
			scope = "read-only"
		}
		if revoked == "" {
			revoked = "never"
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\tcreated %s\trevoked %s\n", k.ID, k.Account, scope,
			k.CreatedAt, revoked)
	}
	return err
}

func keysRevoke(ctx context.Context, fs *flag.FlagSet, db *string, args []string) error {
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	st, err := openStore(*db, false)
	if err != nil {
		return err
	}
	return errors.Join(st.revokeKey(ctx, fs.Arg(0)), st.close())
}

// backup copies the database to DEST, and refuses a DEST that exists when it starts. It writes a
// temporary file first, so that a backup killed halfway leaves nothing at DEST.
func backup(fs *flag.FlagSet, db *string, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	dest := fs.Arg(0)
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	} else if _, err := os.Stat(filepath.Dir(dest)); err != nil {
		return fmt.Errorf("directory %q does not exist", filepath.Dir(dest))
	}
	file, err := openToRead(*db)
	if err != nil {
		return err
	}
	defer file.Close()
	os.Remove(dest + ".partial") // left behind by a backup that was killed
	if _, err := file.Exec("VACUUM INTO ?", dest+".partial"); err != nil {
		return err
	}
	if err := os.Rename(dest+".partial", dest); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s written to %s\n", *db, dest)
	return nil
}

// check prints what SQLite's integrity check finds. That is "ok", or the damage, which makes
// check return an error.
func check(fs *flag.FlagSet, db *string, args []string, stdout io.Writer) error {
	file, err := readOnlyDatabase(fs, args, db)
	if err != nil {
		return err
	}
	defer file.Close()
	var report string
	err = file.QueryRow(`SELECT group_concat(integrity_check, char(10))
		FROM pragma_integrity_check`).Scan(&report)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, report)
	if report != "ok" {
		return fmt.Errorf("database %q is damaged: restore it from a backup", *db)
	}
	return nil
}
