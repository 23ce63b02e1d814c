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
	"runtime"
	"slices"
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
  paybuttons [serve] [-addr localhost:8080] [-log-format text|json]
  paybuttons keys create -account NAME [-read-only]
  paybuttons keys list | keys revoke KEY_ID | backup DEST_FILE | check
Each takes -db (paybuttons.db). serve's flags and -db can also be set as PAYBUTTONS_ADDR,
PAYBUTTONS_LOG_FORMAT and PAYBUTTONS_DB; a flag beats its variable.`

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
	logFormat := fs.String("log-format", env("LOG_FORMAT", "text"), "text or json")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	_, port, addrErr := net.SplitHostPort(*addr)
	if addrErr == nil {
		_, addrErr = net.LookupPort("tcp", port)
	}
	if addrErr != nil {
		return &usageError{fmt.Sprintf("-addr %q must be host:port, a port from 0 to 65535", *addr)}
	} else if *logFormat != "text" && *logFormat != "json" {
		return &usageError{"-log-format must be text or json"}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if *logFormat == "json" {
		log = slog.New(slog.NewJSONHandler(stderr, nil))
	}

	// Listen on the port first, so that a start that fails there touches no file.
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
	keys, err := listKeys(ctx, st.reader)
	if err != nil {
		return err
	}
	// serve never makes a key: a secret printed by a server ends up in a log.
	if !slices.ContainsFunc(keys, func(k apiKey) bool { return k.RevokedAt == "" }) {
		log.Warn("no live API key: make one with `paybuttons keys create -account NAME`")
	}

	srv := &http.Server{
		Handler:                      newServer(st, log),
		ReadHeaderTimeout:            5 * time.Second,
		ReadTimeout:                  10 * time.Second,
		WriteTimeout:                 15 * time.Second,
		IdleTimeout:                  60 * time.Second,
		MaxHeaderBytes:               12 << 10, // net/http adds 4 KiB to this, for 16 KiB in all
		DisableGeneralOptionsHandler: true,     // so that OPTIONS * gets the envelope too
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "url", "http://"+ln.Addr().String(), "db", *db)
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

// readOnlyDatabase parses args, which must hold no argument, and opens the database read-only.
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

// backup copies the database to dest while servers may write to it. It refuses a dest that exists,
// or that names the database or a file SQLite keeps beside it. The copy goes to a temporary file
// beside dest, which is synced, renamed to dest, and then its directory is synced: when backup
// returns nil, dest is whole and on disk, even if the power fails next. A failed backup removes its
// temporary file.
func backup(fs *flag.FlagSet, db *string, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	dest, dir := fs.Arg(0), filepath.Dir(fs.Arg(0))
	if dest == "" {
		return &usageError{"backup needs a DEST_FILE"}
	}
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if resolved(dest) == resolved(*db)+suffix {
			return &usageError{fmt.Sprintf("%q is the database or a file SQLite keeps beside it",
				dest)}
		}
	}
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	} else if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("directory %q does not exist", dir)
	}
	file, err := openToRead(*db)
	if err != nil {
		return err
	}
	defer file.Close()
	tmp, err := os.CreateTemp(dir, filepath.Base(dest)+".*.partial")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // once renamed, there is no such file
	defer tmp.Close()
	if _, err := file.Exec("VACUUM INTO ?", tmp.Name()); err != nil { // an empty file will do
		return err
	} else if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
		return err
	} else if err := os.Rename(tmp.Name(), dest); err != nil {
		return err
	}
	if runtime.GOOS != "windows" { // a rename is on disk once its directory is synced
		d, err := os.Open(dir)
		if err == nil {
			err = errors.Join(d.Sync(), d.Close())
		}
		if err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "backup of %s written to %s\n", *db, dest)
	return nil
}

// resolved is the absolute path of the file path names, with every symlink followed, as SQLite
// follows them. The file need not exist.
func resolved(path string) string {
	path, _ = filepath.Abs(path)
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	} else if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(dir, filepath.Base(path))
	}
	return path
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
