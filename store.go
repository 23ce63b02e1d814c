package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Expected outcomes, mapped to HTTP statuses in one place (handlers.go).
var (
	errNotFound           = errors.New("not found")
	errUnknownKey         = errors.New("unknown or revoked API key")
	errPreconditionFailed = errors.New("version does not match")
	errUnavailable        = errors.New("database unavailable")
	errClosed             = errors.New("store is closed")
)

// stateError says an operation does not apply to the button's current state
// (update or delete of a deleted button, restore of an active one).
type stateError struct{ reason string }

func (e *stateError) Error() string { return e.reason }

const (
	stateActive  = "active"
	stateDeleted = "deleted"

	// timeLayout is how every time is stored and rendered: RFC 3339, UTC, milliseconds.
	timeLayout = "2006-01-02T15:04:05.000Z07:00"

	// maxBatch bounds how many waiting writes share one transaction and one fsync.
	maxBatch = 256

	// idempotencyTTL is how long an answer stays replayable.
	idempotencyTTL = 24 * time.Hour
)

// button is one stored payment button configuration. Optional values use their
// zero value for "absent": Description "", BillingInterval "", FeeBasisPoints 0
// (a fee, when present, is at least 0.01% = 1 basis point).
type button struct {
	ID              string
	Account         string
	ProductName     string
	Description     string
	AmountMinor     int64 // in the currency's minor unit (cents for USD, yen for JPY)
	Currency        string
	BillingInterval string // "day", "week", "month", "year" or ""
	PaymentMethod   string
	PaymentType     string // "one_time" or "subscription"
	IsLive          bool
	FeeBasisPoints  int64 // ApplicationFeePercentage in hundredths of a percent: 2.50% = 250
	State           string
	Version         int64
	CreatedAt       time.Time
	UpdatedAt       time.Time
	DeletedAt       time.Time // zero while active
}

// apiKey is a key's public record; the secret itself is never stored.
type apiKey struct {
	ID         string
	Account    string
	CreatedAt  time.Time
	LastUsedAt time.Time // zero if never used
	RevokedAt  time.Time // zero while valid
}

// actor is who asks for a change: the account scopes every query, the key and
// request ids go into the audit trail.
type actor struct {
	Account   string
	KeyID     string
	RequestID string
	// Idempotency, when set, makes the write also keep its answer, in the same
	// transaction as the change.
	Idempotency *idempotencyKey
}

// idempotencyKey is a client's Idempotency-Key and what it needs stored.
type idempotencyKey struct {
	Key         string
	Fingerprint []byte // hash of the request the key was first used with
	// Answer renders the response to an outcome (the button id, or the error);
	// keep is false for an answer that must not be replayed.
	Answer func(id string, err error) (status int, body []byte, keep bool)
}

// storedResponse is an answer kept for an Idempotency-Key.
type storedResponse struct {
	Fingerprint []byte
	Status      int
	Body        []byte
}

// historyEntry is one change to a button: who made it, when, and the button
// as it was right after.
type historyEntry struct {
	Action    string // "create", "update", "delete" or "restore"
	KeyID     string
	RequestID string
	At        time.Time
	Button    button
}

// listFilter selects a page of an account's buttons, newest first.
type listFilter struct {
	Limit         int
	After         string // the last id of the previous page, or ""
	State         string // stateActive, stateDeleted or "" for both
	IsLive        *bool
	PaymentMethod string // "" for any
}

// store owns the SQLite file: one writer connection fed by a single goroutine
// that commits waiting writes together (group commit), and a pool of read-only
// connections that never wait behind it (WAL).
type store struct {
	writer  *sql.DB
	tx      *writeTx // the writer's one connection; only the writer goroutine uses it
	reader  *sql.DB
	writes  chan writeOp
	quit    chan struct{}
	stopped chan struct{} // closed when the writer has stopped
	purger  sync.WaitGroup
	ids     idGenerator

	closeOnce sync.Once
	closeErr  error

	// lastUsedMu guards lastUsedSaved: the last time each key's last_used_at was
	// written, so a busy key costs one write a minute, not one a request.
	lastUsedMu    sync.Mutex
	lastUsedSaved map[string]time.Time

	// readStmts holds the reader pool's prepared statements by SQL text; a
	// sync.Map, so that every read does not take one lock.
	readStmts sync.Map
}

// writeOp is one caller's change; the writer runs it inside a shared
// transaction and sends its result on done. fn must not use the caller's
// context: SQLite answers an interrupted write by rolling back the whole
// transaction, which would fail every other caller in the batch. fn may run
// more than once (see commitBatch), so it must have no effect outside tx.
type writeOp struct {
	fn   func(tx *writeTx) error
	done chan error
}

// writeTx is the writer's connection, inside the batch's transaction. It
// prepares each SQL text once and keeps it: SQLite would otherwise parse the
// statement again on every call, which costs about as much as running it.
type writeTx struct {
	conn  *sql.Conn
	stmts map[string]*sql.Stmt
	wrote bool // the current op has run a statement that may have changed rows
}

func (tx *writeTx) prepared(query string) (*sql.Stmt, error) {
	if st, ok := tx.stmts[query]; ok {
		return st, nil
	}
	st, err := tx.conn.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, err
	}
	tx.stmts[query] = st
	return st, nil
}

// Exec runs a statement in the transaction.
func (tx *writeTx) Exec(query string, args ...any) (sql.Result, error) {
	st, err := tx.prepared(query)
	if err != nil {
		return nil, err
	}
	tx.wrote = true
	return st.Exec(args...)
}

// QueryRow runs a query for one row in the transaction.
func (tx *writeTx) QueryRow(query string, args ...any) rowScanner {
	st, err := tx.prepared(query)
	if err != nil {
		return failedRow{err}
	}
	return st.QueryRow(args...)
}

// close releases the statements and the connection.
func (tx *writeTx) close() error {
	for _, st := range tx.stmts {
		st.Close()
	}
	return tx.conn.Close()
}

// rowScanner is a row to scan: *sql.Row, *sql.Rows, or a failedRow.
type rowScanner interface{ Scan(...any) error }

// failedRow is a row whose query could not even be prepared.
type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }

// queryRow runs a read for one row on the reader pool with a prepared statement.
func (s *store) queryRow(ctx context.Context, query string, args ...any) rowScanner {
	st, err := s.readStmt(query)
	if err != nil {
		return failedRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

// query runs a read on the reader pool with a prepared statement.
func (s *store) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.readStmt(query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// readStmt prepares query for the reader pool on first use. Two first uses
// at once may both prepare it; the one stored first is kept.
func (s *store) readStmt(query string) (*sql.Stmt, error) {
	if st, ok := s.readStmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := s.reader.Prepare(query)
	if err != nil {
		return nil, err
	}
	if kept, loaded := s.readStmts.LoadOrStore(query, st); loaded {
		st.Close()
		return kept.(*sql.Stmt), nil
	}
	return st, nil
}

// openStore opens (creating if needed) the database at path, applies pending
// migrations and starts the writer. It fails if the directory does not exist,
// the file is not a SQLite database, or its schema is newer than this binary.
func openStore(path string) (*store, error) {
	dir := filepath.Dir(path)
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return nil, fmt.Errorf("database directory %q does not exist", dir)
	}
	// Pragmas live in the DSN so that every pooled connection gets them.
	common := "?_pragma=busy_timeout(5000)"
	// The writer checkpoints as it commits, every 4000 WAL pages (16 MB): a
	// checkpoint copies each page once however often it changed, so fewer,
	// larger ones cost the writer less than SQLite's default 1000 (create p99
	// 1.6 times the ceiling's instead of 2.1). A checkpointer beside the writer
	// cannot keep the WAL small: the WAL only starts over when a write begins
	// right after a checkpoint caught up, a moment another connection never sees.
	// _txlock makes the migrations' transactions IMMEDIATE; the writer says
	// BEGIN IMMEDIATE itself.
	writer, err := sql.Open("sqlite", path+common+
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=wal_autocheckpoint(4000)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	writer.SetMaxOpenConns(1)
	if err := migrate(writer); err != nil {
		writer.Close()
		return nil, fmt.Errorf("database %q: %w", path, err)
	}
	conn, err := writer.Conn(context.Background())
	if err != nil {
		writer.Close()
		return nil, err
	}
	reader, err := sql.Open("sqlite", path+common+"&_pragma=query_only(1)")
	if err != nil {
		conn.Close()
		writer.Close()
		return nil, err
	}
	// Each connection keeps its own page cache (2 MB); a few are enough to
	// keep two cores busy.
	reader.SetMaxOpenConns(4)
	reader.SetMaxIdleConns(4)
	s := &store{
		writer:        writer,
		tx:            &writeTx{conn: conn, stmts: map[string]*sql.Stmt{}},
		reader:        reader,
		writes:        make(chan writeOp),
		quit:          make(chan struct{}),
		stopped:       make(chan struct{}),
		lastUsedSaved: map[string]time.Time{},
	}
	go s.runWriter()
	s.purger.Go(func() { s.runPurger(10 * time.Minute) })
	return s, nil
}

// close stops the writer, checkpoints the WAL into the main file and closes
// every connection; later calls return the first call's result. Writes asked
// for after close fail with errClosed.
func (s *store) close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.stopped
		s.purger.Wait()
		_, cerr := s.tx.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)")
		s.closeErr = errors.Join(cerr, s.tx.close(), s.reader.Close(), s.writer.Close())
	})
	return s.closeErr
}

// migrations are applied in order, each in its own transaction; PRAGMA
// user_version counts how many a database has had. Never edit one that has
// shipped: add the next.
var migrations = []string{
	// 1: keys and buttons.
	`CREATE TABLE api_keys (
		id           TEXT PRIMARY KEY,
		account      TEXT NOT NULL,
		secret_hash  BLOB NOT NULL UNIQUE,
		created_at   TEXT NOT NULL,
		last_used_at TEXT,
		revoked_at   TEXT
	) STRICT;
	CREATE TABLE buttons (
		account          TEXT NOT NULL,
		id               TEXT NOT NULL,
		created_key_id   TEXT NOT NULL, -- the create's author: history has no row for it
		created_request_id TEXT NOT NULL,
		product_name     TEXT NOT NULL,
		description      TEXT,
		amount_minor     INTEGER NOT NULL,
		currency         TEXT NOT NULL,
		billing_interval TEXT,
		payment_method   TEXT NOT NULL,
		payment_type     TEXT NOT NULL,
		is_live          INTEGER NOT NULL,
		fee_basis_points INTEGER,
		state            TEXT NOT NULL CHECK (state IN ('active', 'deleted')),
		version          INTEGER NOT NULL,
		created_at       TEXT NOT NULL,
		updated_at       TEXT NOT NULL,
		deleted_at       TEXT,
		-- Every query is scoped to an account: clustering on (account, id)
		-- serves get and the newest-first list with one B-tree.
		PRIMARY KEY (account, id)
	) STRICT, WITHOUT ROWID;`,

	// 2: history, idempotency keys, and an index for listing by state.
	// A history row is one change after the create (whose author is on the
	// button row) and the button as it was before that change; the button
	// after it is the next row's, or the button itself. A create then costs
	// one row, not two.
	`CREATE TABLE button_history (
		button_id        TEXT NOT NULL,
		change_version   INTEGER NOT NULL, -- the version the change made
		action           TEXT NOT NULL CHECK (action IN ('update', 'delete', 'restore')),
		key_id           TEXT NOT NULL,
		request_id       TEXT NOT NULL,
		changed_at       TEXT NOT NULL,
		account          TEXT NOT NULL,
		product_name     TEXT NOT NULL,
		description      TEXT,
		amount_minor     INTEGER NOT NULL,
		currency         TEXT NOT NULL,
		billing_interval TEXT,
		payment_method   TEXT NOT NULL,
		payment_type     TEXT NOT NULL,
		is_live          INTEGER NOT NULL,
		fee_basis_points INTEGER,
		state            TEXT NOT NULL,
		version          INTEGER NOT NULL,
		created_at       TEXT NOT NULL,
		updated_at       TEXT NOT NULL,
		deleted_at       TEXT,
		PRIMARY KEY (button_id, change_version)
	) STRICT, WITHOUT ROWID;
	CREATE TABLE idempotency_keys (
		account     TEXT NOT NULL,
		key         TEXT NOT NULL,
		fingerprint BLOB NOT NULL,
		status      INTEGER NOT NULL,
		body        BLOB NOT NULL,
		created_at  TEXT NOT NULL,
		PRIMARY KEY (account, key)
	) STRICT, WITHOUT ROWID;
	CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
	CREATE INDEX buttons_by_state ON buttons (account, state, id);`,
}

// migrate brings db's schema up to date. It fails on a file that is not a
// database or whose schema is newer than this binary knows.
func migrate(db *sql.DB) error {
	var version int
	if err := db.QueryRow("PRAGMA user_version").Scan(&version); err != nil {
		return describeOpenError(err)
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this paybuttons knows (%d)", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		if err := applyMigration(db, i+1, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, describeOpenError(err))
		}
	}
	return nil
}

// applyMigration runs one migration and records its number in one transaction.
func applyMigration(db *sql.DB, number int, schema string) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.Exec(schema); err != nil {
		return err
	}
	if _, err := tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", number)); err != nil {
		return err
	}
	return tx.Commit()
}

// describeOpenError turns SQLite's first complaint about a file into a sentence.
func describeOpenError(err error) error {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return errors.New("not a SQLite database, or corrupt")
	case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY:
		return errors.New("cannot be opened for reading and writing")
	}
	return err
}

// sqliteCode is the primary SQLite result code behind err, or 0.
func sqliteCode(err error) int {
	var e *sqlite.Error
	if errors.As(err, &e) {
		return e.Code() & 0xff
	}
	return 0
}

// classify maps the faults a client should retry (the write lock held past
// busy_timeout, a full disk) to errUnavailable and leaves the rest alone.
func classify(err error) error {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: %v", errUnavailable, err)
	}
	return err
}

// write runs fn in the writer's next transaction and returns fn's error, or
// the commit's. Once handed over, the write is waited for even if ctx ends, so
// the caller never reports failure for a change that was committed.
func (s *store) write(ctx context.Context, fn func(tx *writeTx) error) error {
	op := writeOp{fn: fn, done: make(chan error, 1)}
	select {
	case s.writes <- op:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.quit:
		return errClosed
	}
	return <-op.done
}

// runWriter takes every write that is waiting, up to maxBatch, and commits
// them in one transaction: one fsync for all of them.
func (s *store) runWriter() {
	defer close(s.stopped)
	for {
		var batch []writeOp
		select {
		case op := <-s.writes:
			batch = append(batch, op)
		case <-s.quit:
			return
		}
	waiting:
		for len(batch) < maxBatch {
			select {
			case op := <-s.writes:
				batch = append(batch, op)
			default:
				break waiting
			}
		}
		results := s.commitBatch(batch)
		for i, op := range batch {
			op.done <- results[i]
		}
	}
}

// commitBatch runs the batch's ops in one transaction and returns each op's
// result. An op that fails before it writes (not found, wrong state, a refused
// change) has changed nothing and simply answers its error. An op that fails
// after writing would need a savepoint to be undone alone, and a savepoint for
// every op costs as much as the writes themselves; so instead the transaction
// is rolled back and the batch runs again without that op. A database fault
// (busy, full disk) fails the whole batch: SQLite has usually rolled it back.
func (s *store) commitBatch(batch []writeOp) []error {
	results := make([]error, len(batch))
	skip := make([]bool, len(batch))
	for {
		failed, err := s.runBatch(batch, skip, results)
		switch {
		case err != nil:
			for i := range results {
				if !skip[i] {
					results[i] = classify(err)
				}
			}
			return results
		case failed < 0:
			return results
		}
		skip[failed] = true
	}
}

// runBatch runs the ops not skipped in one transaction, filling in results.
// It returns the index of an op that failed after writing (the transaction is
// then rolled back and nothing stored), or -1 with the commit's error.
func (s *store) runBatch(batch []writeOp, skip []bool, results []error) (int, error) {
	tx := s.tx
	// IMMEDIATE takes the write lock now, waiting up to busy_timeout for
	// another process's writer, instead of failing halfway through.
	if _, err := tx.Exec("BEGIN IMMEDIATE"); err != nil {
		return -1, err
	}
	for i, op := range batch {
		if skip[i] {
			continue
		}
		tx.wrote = false
		err := op.fn(tx)
		results[i] = classify(err)
		if err == nil || !tx.wrote {
			continue
		}
		tx.Exec("ROLLBACK") // fails harmlessly when SQLite has rolled back already
		if errors.Is(results[i], errUnavailable) {
			return -1, err
		}
		return i, nil
	}
	if _, err := tx.Exec("COMMIT"); err != nil {
		tx.Exec("ROLLBACK")
		return -1, err
	}
	return -1, nil
}

// now is the one clock every stored time comes from.
func now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// nullTime stores the zero time as NULL.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return formatTime(t)
}

// nullString stores "" as NULL.
func nullString(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// nullInt stores 0 as NULL.
func nullInt(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

// parseTime reads a stored time; NULL is the zero time.
func parseTime(v sql.NullString) (time.Time, error) {
	if !v.Valid {
		return time.Time{}, nil
	}
	return time.Parse(timeLayout, v.String)
}

// ping reads a table, so that it fails when the file does, not only the connection.
func (s *store) ping(ctx context.Context) error {
	var n int
	return s.queryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM api_keys LIMIT 1)`).Scan(&n)
}

// --- keys ---

// createKey mints a key for account and returns the secret, shown once, and the
// key's id. Only the secret's SHA-256 is stored.
func (s *store) createKey(ctx context.Context, account string) (secret, id string, err error) {
	raw := make([]byte, 32)
	rand.Read(raw)
	secret = "pbk_" + base64.RawURLEncoding.EncodeToString(raw)
	id = "key_" + randomCrockford(16)
	hash := sha256.Sum256([]byte(secret))
	err = s.write(ctx, func(tx *writeTx) error {
		_, err := tx.Exec(
			`INSERT INTO api_keys (id, account, secret_hash, created_at) VALUES (?, ?, ?, ?)`,
			id, account, hash[:], formatTime(now()))
		return err
	})
	if err != nil {
		return "", "", err
	}
	return secret, id, nil
}

// countKeys returns how many keys exist, revoked ones included.
func (s *store) countKeys(ctx context.Context) (int, error) {
	var n int
	err := s.queryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
	return n, classify(err)
}

// listKeys returns every key, oldest first.
func (s *store) listKeys(ctx context.Context) ([]apiKey, error) {
	rows, err := s.query(ctx,
		`SELECT id, account, created_at, last_used_at, revoked_at FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	var keys []apiKey
	for rows.Next() {
		var k apiKey
		var created, lastUsed, revoked sql.NullString
		if err := rows.Scan(&k.ID, &k.Account, &created, &lastUsed, &revoked); err != nil {
			return nil, err
		}
		if k.CreatedAt, err = parseTime(created); err != nil {
			return nil, err
		}
		if k.LastUsedAt, err = parseTime(lastUsed); err != nil {
			return nil, err
		}
		if k.RevokedAt, err = parseTime(revoked); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// revokeKey revokes the key with id; it returns errNotFound for an unknown id.
// Revoking a revoked key changes nothing and is not an error.
func (s *store) revokeKey(ctx context.Context, id string) error {
	return s.write(ctx, func(tx *writeTx) error {
		res, err := tx.Exec(
			`UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`,
			formatTime(now()), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errNotFound
		}
		return nil
	})
}

// authenticate returns the live key whose secret this is. Unknown and revoked
// keys are both errUnknownKey. It reads the database every time, so a revoke
// from another process takes effect on the very next request.
func (s *store) authenticate(ctx context.Context, secret string) (apiKey, error) {
	hash := sha256.Sum256([]byte(secret))
	var k apiKey
	err := s.queryRow(ctx,
		`SELECT id, account FROM api_keys WHERE secret_hash = ? AND revoked_at IS NULL`,
		hash[:]).Scan(&k.ID, &k.Account)
	if errors.Is(err, sql.ErrNoRows) {
		return apiKey{}, errUnknownKey
	}
	if err != nil {
		return apiKey{}, classify(err)
	}
	s.noteKeyUsed(k.ID)
	return k, nil
}

// noteKeyUsed records a key's last use at most once a minute, in the
// background, so that reads do not each cost a write.
func (s *store) noteKeyUsed(id string) {
	t := now()
	s.lastUsedMu.Lock()
	fresh := t.Sub(s.lastUsedSaved[id]) < time.Minute
	if !fresh {
		s.lastUsedSaved[id] = t
	}
	s.lastUsedMu.Unlock()
	if fresh {
		return
	}
	go s.write(context.Background(), func(tx *writeTx) error {
		_, err := tx.Exec(`UPDATE api_keys SET last_used_at = ? WHERE id = ?`, formatTime(t), id)
		return err
	})
}

// --- buttons ---

// buttonFields are the columns a button and each of its history entries share.
const buttonFields = `product_name, description, amount_minor, currency, billing_interval,
	payment_method, payment_type, is_live, fee_basis_points,
	state, version, created_at, updated_at, deleted_at`

const buttonColumns = `id, account, ` + buttonFields

// scanButton reads one row selected with buttonColumns, then into extra any
// columns selected after them.
func scanButton(row rowScanner, extra ...any) (button, error) {
	var b button
	var description, interval, created, updated, deleted sql.NullString
	var fee sql.NullInt64
	err := row.Scan(append([]any{&b.ID, &b.Account, &b.ProductName, &description, &b.AmountMinor, &b.Currency,
		&interval, &b.PaymentMethod, &b.PaymentType, &b.IsLive, &fee,
		&b.State, &b.Version, &created, &updated, &deleted}, extra...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return button{}, errNotFound
	}
	if err != nil {
		return button{}, classify(err)
	}
	b.Description, b.BillingInterval, b.FeeBasisPoints = description.String, interval.String, fee.Int64
	if b.CreatedAt, err = parseTime(created); err != nil {
		return button{}, err
	}
	if b.UpdatedAt, err = parseTime(updated); err != nil {
		return button{}, err
	}
	if b.DeletedAt, err = parseTime(deleted); err != nil {
		return button{}, err
	}
	return b, nil
}

// listQuery is the SQL and arguments that select a page of account's buttons,
// newest first. Ids grow with time, so "id < after" is a cursor that neither
// skips nor repeats a button while others are being created.
func listQuery(account string, f listFilter) (string, []any) {
	where, args := []string{"account = ?"}, []any{account}
	if f.After != "" {
		where, args = append(where, "id < ?"), append(args, f.After)
	}
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, f.State)
	}
	if f.IsLive != nil {
		where, args = append(where, "is_live = ?"), append(args, *f.IsLive)
	}
	if f.PaymentMethod != "" {
		where, args = append(where, "payment_method = ?"), append(args, f.PaymentMethod)
	}
	// Without statistics SQLite would walk the primary key and test each row's
	// state; with the index, a page of a rare state costs one page of reads.
	table := "buttons"
	if f.State != "" {
		table = "buttons INDEXED BY buttons_by_state"
	}
	return `SELECT ` + buttonColumns + ` FROM ` + table + `
		WHERE ` + strings.Join(where, " AND ") + `
		ORDER BY id DESC LIMIT ?`, append(args, f.Limit)
}

// listButtons returns up to f.Limit of account's buttons that pass f, newest first.
func (s *store) listButtons(ctx context.Context, account string, f listFilter) ([]button, error) {
	query, args := listQuery(account, f)
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	buttons := []button{}
	for rows.Next() {
		b, err := scanButton(rows)
		if err != nil {
			return nil, err
		}
		buttons = append(buttons, b)
	}
	return buttons, classify(rows.Err())
}

// buttonHistory returns every change made to account's button id, oldest
// first, each with the button as the change left it, or errNotFound.
func (s *store) buttonHistory(ctx context.Context, account, id string) ([]historyEntry, error) {
	if !validButtonID(id) {
		return nil, errNotFound
	}
	// One read transaction: the button and its changes as of one moment.
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, classify(err)
	}
	defer tx.Rollback()
	created := historyEntry{Action: "create"}
	current, err := scanButton(tx.QueryRowContext(ctx, `SELECT `+buttonColumns+`, created_key_id, created_request_id
		FROM buttons WHERE account = ? AND id = ?`, account, id), &created.KeyID, &created.RequestID)
	if err != nil {
		return nil, err
	}
	created.At = current.CreatedAt
	rows, err := tx.QueryContext(ctx, `SELECT button_id, account, `+buttonFields+`, action, key_id, request_id, changed_at
		FROM button_history WHERE button_id = ? AND account = ? ORDER BY change_version`, id, account)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	entries := []historyEntry{created}
	for rows.Next() {
		var change historyEntry
		var at sql.NullString
		before, err := scanButton(rows, &change.Action, &change.KeyID, &change.RequestID, &at)
		if err != nil {
			return nil, err
		}
		if change.At, err = parseTime(at); err != nil {
			return nil, err
		}
		entries[len(entries)-1].Button = before // what the previous change left
		entries = append(entries, change)
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err)
	}
	entries[len(entries)-1].Button = current
	return entries, nil
}

// fieldValues are b's values in the order of buttonFields.
func fieldValues(b button) []any {
	return []any{b.ProductName, nullString(b.Description), b.AmountMinor, b.Currency,
		nullString(b.BillingInterval), b.PaymentMethod, b.PaymentType, b.IsLive, nullInt(b.FeeBasisPoints),
		b.State, b.Version, formatTime(b.CreatedAt), formatTime(b.UpdatedAt), nullTime(b.DeletedAt)}
}

// recordChange writes a change to the button, with the button as it was
// before it, into its history, inside the transaction that makes the change,
// so a change never lands without its entry.
func recordChange(tx *writeTx, who actor, action string, before button, at time.Time) error {
	_, err := tx.Exec(`INSERT INTO button_history
			(button_id, change_version, action, key_id, request_id, changed_at, account, `+buttonFields+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		append([]any{before.ID, before.Version + 1, action, who.KeyID, who.RequestID, formatTime(at), before.Account},
			fieldValues(before)...)...)
	return err
}

// getButtonWithKey authenticates secret as authenticate does and returns the
// key with its account's button id, in one query when the button is there:
// get is the hottest path, and a separate key query costs as much as the read.
// The button is zero when the account has none with that id; the error is
// errUnknownKey or a fault.
func (s *store) getButtonWithKey(ctx context.Context, secret, id string) (apiKey, button, error) {
	if validButtonID(id) {
		hash := sha256.Sum256([]byte(secret))
		var k apiKey
		b, err := scanButton(s.queryRow(ctx, `SELECT `+buttonColumns+`, key_id, key_account
			FROM (SELECT id AS key_id, account AS key_account FROM api_keys
				WHERE secret_hash = ? AND revoked_at IS NULL)
			JOIN buttons ON account = key_account AND id = ?`, hash[:], id), &k.ID, &k.Account)
		if err == nil {
			s.noteKeyUsed(k.ID)
		}
		if !errors.Is(err, errNotFound) {
			return k, b, err
		}
	}
	// No row: an unknown key, or no such button.
	k, err := s.authenticate(ctx, secret)
	return k, button{}, err
}

// createButton stores b as a new active button of the actor's account and
// returns it with its id, version and times filled in.
func (s *store) createButton(ctx context.Context, who actor, b button) (button, error) {
	b.ID = s.ids.next()
	b.Account = who.Account
	b.State = stateActive
	b.Version = 1
	_, err := s.writeRecorded(ctx, who, func(tx *writeTx) (string, error) {
		b.CreatedAt = now()
		b.UpdatedAt = b.CreatedAt
		_, err := tx.Exec(`INSERT INTO buttons (`+buttonColumns+`, created_key_id, created_request_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			append(append([]any{b.ID, b.Account}, fieldValues(b)...), who.KeyID, who.RequestID)...)
		return b.ID, err
	})
	if err != nil {
		return button{}, err
	}
	return b, nil
}

// updateButton reads the actor's button, lets change edit it, and stores the
// result as the next version. ifMatch, when not 0, is the version the caller
// last saw. It returns errNotFound, errPreconditionFailed, a *stateError for a
// deleted button, or change's own error; on any error nothing is changed.
func (s *store) updateButton(ctx context.Context, who actor, id string, ifMatch int64, change func(*button) error) (button, error) {
	return s.modifyButton(ctx, who, id, ifMatch, "update", func(b *button) error {
		if b.State != stateActive {
			return &stateError{"button is deleted; restore it first"}
		}
		return change(b)
	})
}

// deleteButton soft-deletes the actor's button: the row stays, marked deleted.
// It returns errNotFound, errPreconditionFailed, or a *stateError if the
// button is already deleted.
func (s *store) deleteButton(ctx context.Context, who actor, id string, ifMatch int64) (button, error) {
	return s.modifyButton(ctx, who, id, ifMatch, "delete", func(b *button) error {
		if b.State != stateActive {
			return &stateError{"button is already deleted"}
		}
		b.State = stateDeleted
		b.DeletedAt = now()
		return nil
	})
}

// restoreButton makes a deleted button of the actor's active again. It returns
// errNotFound, errPreconditionFailed, or a *stateError if it is not deleted.
func (s *store) restoreButton(ctx context.Context, who actor, id string, ifMatch int64) (button, error) {
	return s.modifyButton(ctx, who, id, ifMatch, "restore", func(b *button) error {
		if b.State != stateDeleted {
			return &stateError{"button is not deleted"}
		}
		b.State = stateActive
		b.DeletedAt = time.Time{}
		return nil
	})
}

// modifyButton is the one read-check-write path behind update, delete and
// restore: inside the writer's transaction it reads the row, checks ifMatch,
// applies change, writes every column back with the version bumped and
// records the history entry.
func (s *store) modifyButton(ctx context.Context, who actor, id string, ifMatch int64, action string, change func(*button) error) (button, error) {
	if !validButtonID(id) {
		return button{}, s.reject(ctx, who, errNotFound) // no write unless an Idempotency-Key keeps the 404
	}
	var b button
	_, err := s.writeRecorded(ctx, who, func(tx *writeTx) (string, error) {
		var err error
		b, err = scanButton(tx.QueryRow(
			`SELECT `+buttonColumns+` FROM buttons WHERE account = ? AND id = ?`, who.Account, id))
		if err != nil {
			return id, err
		}
		if ifMatch != 0 && ifMatch != b.Version {
			return id, errPreconditionFailed
		}
		before := b
		if err := change(&b); err != nil {
			return id, err
		}
		b.Version++
		b.UpdatedAt = now()
		_, err = tx.Exec(`UPDATE buttons SET
				product_name = ?,
				description = ?,
				amount_minor = ?,
				currency = ?,
				fee_basis_points = ?,
				state = ?,
				version = ?,
				updated_at = ?,
				deleted_at = ?
			WHERE account = ? AND id = ?`,
			b.ProductName, nullString(b.Description), b.AmountMinor, b.Currency, nullInt(b.FeeBasisPoints),
			b.State, b.Version, formatTime(b.UpdatedAt), nullTime(b.DeletedAt),
			who.Account, id)
		if err != nil {
			return id, err
		}
		return id, recordChange(tx, who, action, before, b.UpdatedAt)
	})
	if err != nil {
		return button{}, err
	}
	return b, nil
}

// --- idempotency keys ---

// writeRecorded runs change in the writer's next transaction. When who carries
// an Idempotency-Key, the answer to change's outcome is stored under it in the
// same transaction, so a crash can keep neither the change without its answer
// nor the answer without its change. It returns change's id and error.
func (s *store) writeRecorded(ctx context.Context, who actor, change func(tx *writeTx) (string, error)) (string, error) {
	var id string
	var outcome error
	err := s.write(ctx, func(tx *writeTx) error {
		id, outcome = change(tx)
		// A change that failed after writing is undone with the whole op, and
		// a database fault is never replayed: a retry runs afresh.
		if who.Idempotency == nil || (outcome != nil && tx.wrote) || sqliteCode(outcome) != 0 {
			return outcome
		}
		status, body, keep := who.Idempotency.Answer(id, outcome)
		if !keep {
			return outcome
		}
		_, err := tx.Exec(`INSERT OR REPLACE INTO idempotency_keys
			(account, key, fingerprint, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			who.Account, who.Idempotency.Key, who.Idempotency.Fingerprint, status, body, formatTime(now()))
		return err
	})
	if err != nil {
		return id, err
	}
	return id, outcome
}

// reject keeps the answer to a request refused before it reached any button (a
// body that breaks a rule) when the request carries an Idempotency-Key. It
// returns refusal, or the error that kept the answer from being stored.
func (s *store) reject(ctx context.Context, who actor, refusal error) error {
	if who.Idempotency == nil {
		return refusal
	}
	_, err := s.writeRecorded(ctx, who, func(*writeTx) (string, error) { return "", refusal })
	return err
}

// findResponse returns the answer kept for account's Idempotency-Key, or
// errNotFound if there is none younger than idempotencyTTL.
func (s *store) findResponse(ctx context.Context, account, key string) (storedResponse, error) {
	var r storedResponse
	err := s.queryRow(ctx, `SELECT fingerprint, status, body FROM idempotency_keys
		WHERE account = ? AND key = ? AND created_at > ?`,
		account, key, formatTime(now().Add(-idempotencyTTL))).Scan(&r.Fingerprint, &r.Status, &r.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return storedResponse{}, errNotFound
	}
	return r, classify(err)
}

// purgeExpired deletes answers older than idempotencyTTL, 500 to a
// transaction, so the writer is never held up for long. It returns how many
// it deleted.
func (s *store) purgeExpired(ctx context.Context) (int64, error) {
	cutoff := formatTime(now().Add(-idempotencyTTL))
	var total int64
	for {
		var n int64
		err := s.write(ctx, func(tx *writeTx) error {
			res, err := tx.Exec(`DELETE FROM idempotency_keys WHERE (account, key) IN
				(SELECT account, key FROM idempotency_keys WHERE created_at <= ? LIMIT 500)`, cutoff)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		total += n
		if err != nil || n < 500 {
			return total, err
		}
	}
}

// runPurger purges expired answers every interval until the store closes. A
// failed purge is simply tried again at the next tick.
func (s *store) runPurger(interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-tick.C:
			s.purgeExpired(context.Background())
		}
	}
}

// --- backup ---

// backup writes a consistent copy of the database at src to dest while
// servers keep writing to it. It refuses to overwrite dest, and fails if src
// is not a paybuttons database.
func backup(ctx context.Context, src, dest string) error {
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("no database at %q", src)
	}
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%q already exists; not overwriting it", dest)
	}
	// A plain connection: backup must not migrate a database a server is using.
	db, err := sql.Open("sqlite", src+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("database %q: %w", src, describeOpenError(err))
	}
	if version == 0 {
		return fmt.Errorf("database %q is not a paybuttons database", src)
	}
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dest); err != nil {
		return fmt.Errorf("backup to %q: %w", dest, err)
	}
	return nil
}

// --- ids ---

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idGenerator makes button ids: "btn_" and 26 Crockford base32 characters
// holding 48 bits of Unix milliseconds then 80 random bits. Within one
// millisecond the random part counts up, so the ids one process makes are
// strictly increasing and a list cursor never misses a button made after it.
type idGenerator struct {
	mu     sync.Mutex
	lastMs uint64
	last   [10]byte
}

func (g *idGenerator) next() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ms := uint64(time.Now().UnixMilli())
	if ms > g.lastMs {
		g.lastMs = ms
		rand.Read(g.last[:])
	} else {
		// Same millisecond, or the clock stepped back: count up from the last id.
		for i := len(g.last) - 1; i >= 0; i-- {
			g.last[i]++
			if g.last[i] != 0 {
				break
			}
			if i == 0 { // 80 bits ran over: borrow the next millisecond
				g.lastMs++
			}
		}
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], g.lastMs<<16)
	copy(b[6:], g.last[:])
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return "btn_" + string(out[:])
}

// validButtonID reports whether id has the form next makes, so that anything
// else is answered "not found" without a query.
func validButtonID(id string) bool {
	rest, ok := strings.CutPrefix(id, "btn_")
	if !ok || len(rest) != 26 || rest[0] > '7' {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if strings.IndexByte(crockford, rest[i]) < 0 {
			return false
		}
	}
	return true
}

// randomCrockford returns n random Crockford base32 characters (5 bits each).
func randomCrockford(n int) string {
	raw := make([]byte, n)
	rand.Read(raw)
	for i, v := range raw {
		raw[i] = crockford[v&31]
	}
	return string(raw)
}
