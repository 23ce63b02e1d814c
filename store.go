package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// storage is every operation the handlers use. An expected outcome is an *apiError; any other error is a fault.
type storage interface {
	authenticate(ctx context.Context, hash [sha256.Size]byte, id string) (apiKey, button, error)
	listKeys(ctx context.Context) ([]apiKey, error) // every key, revoked ones too
	listButtons(ctx context.Context, account string, f listFilter) (page []button, next *string, err error)
	buttonHistory(ctx context.Context, account, id string, after, limit int64) ([]historyEntry, *int64, error)
	changes(ctx context.Context, account string, since, limit int64) (page []button, more bool, err error)

	// The writes, each with its answer when who has an Idempotency-Key. ifMatch, when not 0, is the version the
	// caller last saw; action is "update" (made by edit), "delete" or "restore".
	createButton(ctx context.Context, who actor, b button) (outcome, error)
	changeButton(ctx context.Context, who actor, id string, ifMatch int64, action string,
		edit func(*button) error) (outcome, error)
	keepRefusal(ctx context.Context, who actor, refusal error) error // the answer to a write refused before it ran
	findAnswer(ctx context.Context, account, key string) (answer, error)

	ping(ctx context.Context) error // fails while writes are refused or the database does not answer
	stats() (commits, writes, size int64)
}

const (
	maxBatch       = 256            // writes that share one transaction and one fsync
	maxScan        = 1000           // rows a filtered list page examines, however large the account
	idempotencyTTL = 24 * time.Hour // how long an answer stays replayable
	applicationID  = 0x70627574     // "pbut" in the header of every paybuttons database
)

// store owns the SQLite file: one writer connection, whose goroutine commits the writes waiting together (group
// commit), and read-only connections that never wait behind it (WAL).
type store struct {
	path    string
	writer  *sql.DB
	tx      *writeTx // the writer's one connection; only the writer goroutine uses it
	reader  *sql.DB
	reads   statements
	health  *sql.DB // a connection of its own: /healthz never queues behind reads
	writes  chan writeOp
	quit    chan struct{}
	stopped chan struct{} // closed once the writer has stopped
	ids     idGenerator

	closeOnce sync.Once
	closeErr  error

	wal     os.FileInfo              // the WAL file SQLite opened
	fault   atomic.Pointer[apiError] // set for good once that file is gone or SQLite finds the database damaged
	failing atomic.Bool              // the last commit failed: ping tries a write until one succeeds

	lastUsedSaved sync.Map // key id -> time last_used_at was written: at most once a minute

	commits, committed atomic.Int64 // transactions, and the writes in them
}

// statements prepares each SQL text once and keeps it (parsing costs SQLite as much as running it): constant texts
// only, since one built from a request (list's filters) would grow it without bound.
type statements struct {
	db interface {
		PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
	cache sync.Map // SQL text -> *sql.Stmt
}

func (c *statements) prepare(query string) (*sql.Stmt, error) {
	if st, ok := c.cache.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := c.db.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, err
	}
	if kept, loaded := c.cache.LoadOrStore(query, st); loaded { // another caller was first
		st.Close()
		return kept.(*sql.Stmt), nil
	}
	return st, nil
}

func (c *statements) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := c.prepare(query)
	if err != nil { // let the unprepared call report why, in the Row
		return c.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (c *statements) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := c.prepare(query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// exec runs query without a caller's context: the writer's statements must not be interrupted, since SQLite answers
// an interrupted statement by rolling back every write in the transaction.
func (c *statements) exec(query string, args ...any) (sql.Result, error) {
	st, err := c.prepare(query)
	if err != nil {
		return nil, err
	}
	return st.Exec(args...)
}

// close comes before the database's Close: a connection with a statement open outlives DB.Close, and one kept open
// makes the next server trust a crashed one's WAL index.
func (c *statements) close() {
	c.cache.Range(func(_, st any) bool {
		st.(*sql.Stmt).Close()
		return true
	})
}

type writeTx struct { // the writer's connection, inside the batch's transaction
	statements
	conn      *sql.Conn
	committed int64 // the last changeSeq committed
	seq       int64 // the last changeSeq this batch gave out
}

// nextChange gives a change the next changeSeq: above the last and never below the clock in microseconds, so that
// after a restored backup every change sorts after any number a client was given.
func (tx *writeTx) nextChange() int64 {
	tx.seq = max(tx.seq+1, time.Now().UnixMicro())
	return tx.seq
}

// openStore opens (creating if needed) the database file at path (see dbFile), migrates it and starts the writer; it
// fails for a file it cannot write, or not a paybuttons database this binary knows.
func openStore(path string) (*store, error) {
	// Pragmas live in the DSN, so that every pooled connection gets them. The writer checkpoints every 4000 WAL
	// pages, not 1000: fewer, larger checkpoints cost it less (README, Performance).
	const common = "_pragma=busy_timeout(5000)"
	if exists(path) { // another program's file is refused before the writer's pragmas change it (journal_mode)
		probe, _ := sql.Open("sqlite", sqliteURI(path, common+"&mode=ro"))
		_, err := ownVersion(context.Background(), probe)
		if probe.Close(); err != nil {
			return nil, fmt.Errorf("database %q: %w", path, err)
		}
	}
	writer, _ := sql.Open("sqlite", sqliteURI(path, common+ // sql.Open fails only for an unknown driver
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=wal_autocheckpoint(4000)&_txlock=immediate"))
	writer.SetMaxOpenConns(1)
	s := &store{path: path, writer: writer, writes: make(chan writeOp), quit: make(chan struct{}),
		stopped: make(chan struct{})}
	conn, err := writer.Conn(context.Background())
	for start := time.Now(); sqliteCode(err) == sqlite3.SQLITE_BUSY && time.Since(start) < 5*time.Second; {
		// A new file's switch to WAL, which another process may be making too, does not wait out busy_timeout.
		time.Sleep(10 * time.Millisecond)
		conn, err = writer.Conn(context.Background())
	}
	if err == nil {
		s.tx = &writeTx{conn: conn, statements: statements{db: conn}}
		if err = migrate(conn); err == nil {
			err = conn.QueryRowContext(context.Background(), "SELECT last FROM change_counter").Scan(&s.tx.committed)
		}
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		writer.Close()
		return nil, fmt.Errorf("database %q: %w", path, describeOpenError(err))
	}
	s.wal, _ = os.Stat(path + "-wal") // the migration opened it
	s.reader, _ = sql.Open("sqlite", sqliteURI(path, common+"&_pragma=query_only(1)"))
	s.health, _ = sql.Open("sqlite", sqliteURI(path, common+"&_pragma=query_only(1)"))
	s.reads = statements{db: s.reader}
	s.reader.SetMaxOpenConns(4) // each keeps its own page cache (2 MB); four keep two cores busy
	s.reader.SetMaxIdleConns(4)
	s.health.SetMaxOpenConns(1)
	go s.runWriter()
	return s, nil
}

// close stops the writer and closes every connection; with checkpoint (a server that stops, never a command) it first
// copies the WAL into the main file, waiting a second at most for other readers (Litestream): errCheckpointBusy.
func (s *store) close(checkpoint bool) error {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.stopped
		ctx := context.Background()
		var err error
		if checkpoint {
			var busy, walPages, moved int
			_, err = s.tx.conn.ExecContext(ctx, "PRAGMA busy_timeout = 1000")
			if err == nil {
				err = s.tx.conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &walPages, &moved)
			}
			if err == nil && busy != 0 {
				err = errCheckpointBusy
			}
		}
		s.tx.statements.close()
		s.reads.close()
		s.closeErr = errors.Join(err, s.tx.conn.Close(), s.reader.Close(), s.health.Close(), s.writer.Close())
	})
	return s.closeErr
}

var errCheckpointBusy = errors.New("the WAL was not checkpointed: another process is reading it " +
	"(nothing is lost: the next start applies it)")

// migrations are applied in order at every start; PRAGMA user_version counts them. Never edit one that has shipped:
// add the next. The schema they leave, every query scoped to an account:
//   - api_keys: id, account, secret_hash, read_only, created_at, last_used_at, revoked_at.
//   - buttons: the button's fields, created_key_id and created_request_id (the create's author) and change_seq;
//     clustered on (account, id), indexed by (account, state, id) and (account, change_seq).
//   - button_history: a row per change after the create (change_version, action, key_id, request_id, changed_at)
//     holding the button as it was before that change.
//   - idempotency_keys: account, key, fingerprint, status, body, version (the ETag), created_at.
//   - change_counter: last, the last changeSeq given out.
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

	// 2: history (a create costs one row, not two), idempotency keys, and an index for listing by state.
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

	// 3: metadata, read-only keys, the change feed (buttons already stored take 1..n), and the file's mark.
	`ALTER TABLE buttons ADD COLUMN metadata TEXT; -- a JSON object, NULL when empty
	ALTER TABLE button_history ADD COLUMN metadata TEXT;
	ALTER TABLE buttons ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE api_keys ADD COLUMN read_only INTEGER NOT NULL DEFAULT 0;
	UPDATE buttons SET change_seq = n
		FROM (SELECT account AS a, id AS i, row_number() OVER (ORDER BY updated_at, id) AS n FROM buttons)
		WHERE account = a AND id = i;
	CREATE TABLE change_counter (last INTEGER NOT NULL) STRICT;
	INSERT INTO change_counter SELECT count(*) FROM buttons;
	CREATE INDEX buttons_by_change ON buttons (account, change_seq);
	PRAGMA application_id = 1885500788;`,

	// 4: the version an answer kept for an Idempotency-Key sends as its ETag (0: none).
	`ALTER TABLE idempotency_keys ADD COLUMN version INTEGER NOT NULL DEFAULT 0;`,
}

// ownVersion returns the schema version of a paybuttons database: with our application_id, an earlier paybuttons'
// (our tables, without it), or an empty one (Litestream's tables aside). Another's is an error.
func ownVersion(ctx context.Context, db interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) (int, error) {
	var owner, version, tables, ours int
	err := db.QueryRowContext(ctx, `SELECT (SELECT application_id FROM pragma_application_id),
		(SELECT user_version FROM pragma_user_version),
		(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE '\_litestream%' ESCAPE '\'),
		(SELECT count(*) FROM sqlite_master WHERE name = 'api_keys')`).Scan(&owner, &version, &tables, &ours)
	if err == nil && owner != applicationID && !(owner == 0 && (tables == 0 || version > 0 && ours == 1)) {
		err = errors.New("is not a paybuttons database (another program's SQLite file)")
	}
	return version, describeOpenError(err)
}

// migrate brings the schema up to date in one transaction that reads the version under the write lock (two processes
// opening a new file at once both succeed). A newer schema, or a file this process cannot write, is an error.
func migrate(conn *sql.Conn) error {
	ctx := context.Background()
	tx, err := conn.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock): a read-only file fails here
	if err != nil {
		return err
	}
	defer tx.Rollback()
	version, err := ownVersion(ctx, tx)
	if err == nil && version > len(migrations) {
		err = fmt.Errorf("schema version %d is newer than this paybuttons knows (%d)", version, len(migrations))
	}
	for ; err == nil && version < len(migrations); version++ {
		if _, err = tx.ExecContext(ctx, migrations[version]); err != nil {
			err = fmt.Errorf("migration %d: %w", version+1, describeOpenError(err))
		}
	}
	if err == nil { // written even when up to date: in WAL mode a file opened read-only begins a write without fault
		_, err = tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations)))
	}
	if err != nil {
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
func sqliteCode(err error) (code int) {
	if e := (*sqlite.Error)(nil); errors.As(err, &e) {
		code = e.Code() & 0xff
	}
	return code
}

// check turns the faults a client should retry (busy past busy_timeout, a full disk, no connection in time) into
// unavailable, and a client that went away into canceled; the rest it leaves alone. A damaged file refuses writes
// from then on.
func (s *store) check(err error) error {
	switch code := sqliteCode(err); {
	case code == sqlite3.SQLITE_CORRUPT || code == sqlite3.SQLITE_NOTADB:
		return s.refuseWrites(fmt.Errorf("SQLite found the database damaged (%w): stop the server, run "+
			"`paybuttons check`, and restore it from a backup if check finds it damaged", err))
	case code == sqlite3.SQLITE_FULL:
		return &apiError{code: codeUnavailable, message: "the server's disk is full; retry later", cause: err}
	case code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED || errors.Is(err, context.DeadlineExceeded):
		return &apiError{code: codeUnavailable, message: "the database is busy; retry shortly", cause: err}
	case errors.Is(err, context.Canceled):
		return &apiError{code: codeCanceled, message: "the client went away", cause: err}
	}
	return err
}

// refuseWrites refuses every write from now on, for cause, the first one given, which the log shows.
func (s *store) refuseWrites(cause error) error {
	s.fault.CompareAndSwap(nil, &apiError{code: codeUnavailable,
		message: "the database refuses writes; see the server's log", cause: cause})
	return s.fault.Load()
}

// refusing returns the fault for which every write is refused, nil while there is none. The WAL file gone, or not
// the one SQLite has open, is one: an acknowledged write would be lost at the next start.
func (s *store) refusing() error {
	if info, err := os.Stat(s.path + "-wal"); s.wal != nil && (err != nil || !os.SameFile(info, s.wal)) {
		return s.refuseWrites(fmt.Errorf("the WAL file %s-wal was removed or replaced while the server ran: writes "+
			"are refused, since the next start would lose them. Stop the server with SIGTERM: its checkpoint saves "+
			"what the old WAL holds into the database", s.path))
	}
	if err := s.fault.Load(); err != nil {
		return err
	}
	return nil
}

// --- the writer ---

// writeOp is one caller's change. fn runs once, in the writer's transaction; it keeps its outcome (not found, a
// refused change) in its closure and returns only a fault, which fails the whole batch.
type writeOp struct {
	fn   func(tx *writeTx) error
	done chan error
}

// write runs fn in the writer's next transaction and returns the batch's fault, or nil once committed. Once handed
// over it is waited for even if ctx ends: a committed change is never reported as failed.
func (s *store) write(ctx context.Context, fn func(tx *writeTx) error) error {
	op := writeOp{fn: fn, done: make(chan error, 1)}
	select {
	case s.writes <- op:
		return <-op.done
	case <-ctx.Done():
		return s.check(ctx.Err())
	case <-s.quit:
		return errClosed
	}
}

// runWriter commits the writes waiting, up to maxBatch, in one transaction (one fsync for all), and once a minute
// purges answers older than idempotencyTTL.
func (s *store) runWriter() {
	defer close(s.stopped)
	purge := time.NewTicker(time.Minute)
	defer purge.Stop()
	for {
		var batch []writeOp
		select {
		case op := <-s.writes:
			batch = append(batch, op)
		case <-purge.C:
			// 10,000 a minute keeps up with 160 idempotent writes a second; the rest waits a minute.
			s.commit([]writeOp{{fn: func(tx *writeTx) error { _, err := purgeExpired(tx, 10_000); return err }}})
			continue
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
		err := s.commit(batch)
		for _, op := range batch {
			op.done <- err
		}
	}
}

// commit runs batch in one IMMEDIATE transaction (waiting up to busy_timeout for another process's write lock): it
// succeeds or fails as a unit.
func (s *store) commit(batch []writeOp) error {
	tx := s.tx
	tx.seq = tx.committed
	err := s.refusing()
	if err == nil {
		_, err = tx.exec("BEGIN IMMEDIATE")
	}
	for _, op := range batch {
		if err == nil {
			err = op.fn(tx)
		}
	}
	if err == nil && tx.seq != tx.committed {
		_, err = tx.exec("UPDATE change_counter SET last = ?", tx.seq)
	}
	if err == nil {
		_, err = tx.exec("COMMIT")
	}
	s.failing.Store(err != nil && sqliteCode(err) != sqlite3.SQLITE_BUSY) // busy: another process writes, as it may
	if err != nil {
		tx.exec("ROLLBACK") // fails harmlessly when SQLite has rolled back already
		return s.check(err)
	}
	tx.committed = tx.seq
	s.commits.Add(1)
	s.committed.Add(int64(len(batch)))
	return nil
}

// ping fails while writes are refused (see refusing; after a failed commit, until a write it tries succeeds) or a
// read of every table does.
func (s *store) ping(ctx context.Context) error {
	if err := s.refusing(); err != nil {
		return err
	}
	if s.failing.Load() { // a real write: a number of the sequence skipped, which commit stores
		if err := s.write(ctx, func(tx *writeTx) error { tx.nextChange(); return nil }); err != nil {
			return err
		}
	}
	return s.check(s.health.QueryRowContext(ctx, `SELECT (SELECT last FROM change_counter) +
		EXISTS (SELECT 1 FROM api_keys) + EXISTS (SELECT 1 FROM buttons) + EXISTS (SELECT 1 FROM button_history) +
		EXISTS (SELECT 1 FROM idempotency_keys)`).Scan(new(int)))
}

func (s *store) stats() (commits, writes, size int64) {
	if info, err := os.Stat(s.path); err == nil {
		size = info.Size()
	}
	return s.commits.Load(), s.committed.Load(), size
}

// --- keys ---

// createKey mints a key for account and returns the secret, shown once, and the key's id.
func (s *store) createKey(ctx context.Context, account string, readOnly bool) (secret, id string, err error) {
	raw := make([]byte, 32)
	rand.Read(raw)
	secret, id = "pbk_"+base64.RawURLEncoding.EncodeToString(raw), "key_"+rand.Text()[:16] // 80 bits: unique, not secret
	hash := sha256.Sum256([]byte(secret))
	return secret, id, s.write(ctx, func(tx *writeTx) error {
		_, err := tx.exec(`INSERT INTO api_keys (id, account, secret_hash, created_at, read_only) VALUES (?, ?, ?, ?, ?)`,
			id, account, hash[:], now(), readOnly)
		return err
	})
}

// listKeys returns every key, revoked ones too, oldest first.
func (s *store) listKeys(ctx context.Context) ([]apiKey, error) {
	rows, err := s.reads.query(ctx,
		`SELECT id, account, secret_hash, read_only, created_at, last_used_at, revoked_at FROM api_keys
		ORDER BY created_at, id`)
	keys, err := collect(rows, err, func(rows *sql.Rows) (k apiKey, err error) {
		return k, rows.Scan(&k.ID, &k.Account, &k.Hash, &k.ReadOnly, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
	})
	return keys, s.check(err)
}

// revokeKey revokes the key with id; revoking it again changes nothing.
func (s *store) revokeKey(ctx context.Context, id string) error {
	var found int64
	err := s.write(ctx, func(tx *writeTx) error {
		res, err := tx.exec(`UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, now(), id)
		if err == nil {
			found, err = res.RowsAffected()
		}
		return err
	})
	if err == nil && found == 0 {
		return fmt.Errorf("no key with id %q", id)
	}
	return err
}

// authenticate returns the live key whose secret has this SHA-256, or errUnknownKey; with a button id (get), also
// that button of the key's account, read in the same query (a zero button when there is none). It is the one place
// that decides whether a key is live, and reads the database every time: a key revoked by another process stops at
// its next request.
func (s *store) authenticate(ctx context.Context, hash [sha256.Size]byte, id string) (apiKey, button, error) {
	const liveKey = `SELECT id AS key_id, account AS key_account, read_only AS key_read_only FROM api_keys
		WHERE secret_hash = ? AND revoked_at IS NULL`
	ctx = context.WithoutCancel(ctx) // point lookups: no interrupt watcher (a goroutine a query) for the driver to start
	var k apiKey
	var b button
	var err error = errNotFound
	if validButtonID(id) {
		b, err = scanButton(s.reads.queryRow(ctx, `SELECT `+selectButton+`, key_id, key_read_only FROM (`+liveKey+`)
			JOIN buttons ON account = key_account AND id = ?`, hash[:], id), &k.ID, &k.ReadOnly)
		k.Account = b.Account
	}
	if err == errNotFound { // no id, no such button, or no such key: the key alone says which
		err = s.reads.queryRow(ctx, liveKey, hash[:]).Scan(&k.ID, &k.Account, &k.ReadOnly)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return apiKey{}, button{}, errUnknownKey
	}
	if err == nil {
		s.noteKeyUsed(k.ID)
	}
	return k, b, s.check(err)
}

// noteKeyUsed records a key's last use at most once a minute, in the background: reads cost no write.
func (s *store) noteKeyUsed(id string) {
	t := now()
	if saved, ok := s.lastUsedSaved.Load(id); ok && t.Sub(saved.(time.Time)) < time.Minute {
		return
	}
	s.lastUsedSaved.Store(id, t.Time)
	go s.write(context.Background(), func(tx *writeTx) error {
		_, err := tx.exec(`UPDATE api_keys SET last_used_at = ? WHERE id = ?`, t, id)
		return err
	})
}

// --- buttons ---

// buttonFields are the columns button and history rows share, in fieldValues' order; fieldPlaceholders write "" and
// 0 as NULL.
const (
	buttonFields = `product_name, description, amount_minor, currency, billing_interval, payment_method,
	payment_type, is_live, fee_basis_points, metadata, state, version, created_at, updated_at, deleted_at`
	fieldPlaceholders = `?, nullif(?, ''), ?, ?, nullif(?, ''), ?, ?, ?, nullif(?, 0), ?, ?, ?, ?, ?, ?`
)

// selectFields reads buttonFields back, NULL as the zero value; selectButton reads a row for scanButton.
const (
	selectFields = `product_name, coalesce(description, ''), amount_minor, currency, coalesce(billing_interval, ''),
	payment_method, payment_type, is_live, coalesce(fee_basis_points, 0), metadata, state, version,
	created_at, updated_at, deleted_at`
	selectButton = `id, account, ` + selectFields + `, change_seq`
)

func fieldValues(b button) []any {
	return []any{b.ProductName, b.Description, b.AmountMinor, b.Currency, b.BillingInterval, b.PaymentMethod,
		b.PaymentType, b.IsLive, b.FeeBasisPoints, b.Metadata, b.State, b.Version, b.CreatedAt, b.UpdatedAt, b.DeletedAt}
}

// scanButton reads a row of selectButton, then into extra the columns after it. No row is errNotFound.
func scanButton(row interface{ Scan(...any) error }, extra ...any) (button, error) {
	var b button
	err := row.Scan(append([]any{&b.ID, &b.Account, &b.ProductName, &b.Description, &b.AmountMinor, &b.Currency,
		&b.BillingInterval, &b.PaymentMethod, &b.PaymentType, &b.IsLive, &b.FeeBasisPoints, &b.Metadata,
		&b.State, &b.Version, &b.CreatedAt, &b.UpdatedAt, &b.DeletedAt, &b.ChangeSeq}, extra...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return button{}, errNotFound
	}
	return b, err
}

// collect reads every row with scan; it is the one loop over query results.
func collect[T any](rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	items := []T{}
	for rows.Next() {
		item, err := scan(rows)
		if err != nil {
			return nil, err
		}
		items = append(items, item)
	}
	return items, rows.Err()
}

// scanButtons reads every row of selectButton.
func scanButtons(rows *sql.Rows, err error) ([]button, error) {
	return collect(rows, err, func(rows *sql.Rows) (button, error) { return scanButton(rows) })
}

// listButtons returns a page of account's buttons by id, newest first, and the id the next page goes on after (nil at
// the end): ids grow with time, so "id < after" neither skips nor repeats a button while others are created. A
// filter no index serves (isLive, paymentMethod, metadata) examines at most maxScan rows; a page that ends there
// goes on after the last row examined.
func (s *store) listButtons(ctx context.Context, account string, f listFilter) ([]button, *string, error) {
	where, args := "account = ?", []any{account}
	if f.After != "" {
		where, args = where+" AND id < ?", append(args, f.After)
	}
	// Without statistics SQLite would walk the primary key: a page of a rare state would cost the account.
	table := "buttons"
	if f.State != "all" {
		table, where, args = "buttons INDEXED BY buttons_by_state", where+" AND state = ?", append(args, f.State)
	}
	var scanEnd string
	if f.IsLive != nil || f.PaymentMethod != "" || len(f.Metadata) > 0 {
		err := s.reader.QueryRowContext(ctx, `SELECT id FROM `+table+` WHERE `+where+` ORDER BY id DESC
			LIMIT 1 OFFSET ?`, append(args, maxScan-1)...).Scan(&scanEnd)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, nil, s.check(err)
		}
		if scanEnd != "" {
			where, args = where+" AND id >= ?", append(args, scanEnd)
		}
	}
	if f.IsLive != nil {
		where, args = where+" AND is_live = ?", append(args, *f.IsLive)
	}
	if f.PaymentMethod != "" {
		where, args = where+" AND payment_method = ?", append(args, f.PaymentMethod)
	}
	for key, value := range f.Metadata {
		where, args = where+" AND metadata ->> ? = ?", append(args, `$."`+key+`"`, value)
	}
	// The text depends on the filters: it is prepared and dropped, never cached (see statements).
	buttons, err := scanButtons(s.reader.QueryContext(ctx, `SELECT `+selectButton+` FROM `+table+` WHERE `+where+
		` ORDER BY id DESC LIMIT ?`, append(args, f.Limit+1)...)) // one more says whether the page is the last
	if len(buttons) > f.Limit {
		return buttons[:f.Limit], &buttons[f.Limit-1].ID, nil
	}
	if scanEnd == "" {
		return buttons, nil, s.check(err)
	}
	return buttons, &scanEnd, s.check(err)
}

// buttonHistory returns the changes to account's button id with versions after+1 to after+limit, oldest first, and
// the last of those versions when more follow (else nil).
func (s *store) buttonHistory(ctx context.Context, account, id string, after, limit int64) (
	[]historyEntry, *int64, error) {
	if !validButtonID(id) {
		return nil, nil, errNotFound
	}
	// One read transaction: the button and its changes as of one moment.
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, nil, s.check(err)
	}
	defer tx.Rollback()
	created := historyEntry{Version: 1, Action: "create"}
	current, err := scanButton(tx.QueryRowContext(ctx, `SELECT `+selectButton+`, created_key_id, created_request_id
		FROM buttons WHERE account = ? AND id = ?`, account, id), &created.KeyID, &created.RequestID)
	if err != nil {
		return nil, nil, s.check(err)
	}
	created.At = current.CreatedAt
	// A history row holds change v and the button before it (migration 2): the button after change v is row v+1's
	// "before", or, after the last change, the button itself. So the page reads rows after+1 to after+limit+1.
	rows, err := tx.QueryContext(ctx, `SELECT button_id, account, `+selectFields+`, 0,
			change_version, action, key_id, request_id, changed_at
		FROM button_history WHERE button_id = ? AND account = ? AND change_version BETWEEN ? AND ?`,
		id, account, after+1, after+limit+1)
	changes, err := collect(rows, err, func(rows *sql.Rows) (e historyEntry, err error) {
		e.Before, err = scanButton(rows, &e.Version, &e.Action, &e.KeyID, &e.RequestID, &e.At)
		return e, err
	})
	if err != nil {
		return nil, nil, s.check(err)
	}
	byVersion := map[int64]historyEntry{1: created}
	for _, e := range changes {
		byVersion[e.Version] = e
	}
	var page []historyEntry
	for v := after + 1; v <= min(after+limit, current.Version); v++ {
		e := byVersion[v]
		if e.After = current; v < current.Version {
			e.After = byVersion[v+1].Before
		}
		page = append(page, e)
	}
	if last := after + limit; last < current.Version {
		return page, &last, nil
	}
	return page, nil, nil
}

// changes returns up to limit of account's buttons whose changeSeq is above since, lowest first, and whether more
// follow.
func (s *store) changes(ctx context.Context, account string, since, limit int64) ([]button, bool, error) {
	buttons, err := scanButtons(s.reads.query(ctx, `SELECT `+selectButton+` FROM buttons INDEXED BY buttons_by_change
		WHERE account = ? AND change_seq > ? ORDER BY change_seq LIMIT ?`, account, since, limit+1))
	if int64(len(buttons)) > limit {
		return buttons[:limit], true, nil
	}
	return buttons, false, s.check(err)
}

// createButton stores b as a new active button of the actor's account.
func (s *store) createButton(ctx context.Context, who actor, b button) (outcome, error) {
	b.ID, b.Account, b.State, b.Version = s.ids.next(), who.Account, stateActive, 1
	return s.apply(ctx, who, func(tx *writeTx) (outcome, error) {
		b.CreatedAt = now()
		b.UpdatedAt = b.CreatedAt
		_, err := tx.exec(`INSERT INTO buttons (id, account, `+buttonFields+`, created_key_id, created_request_id, change_seq)
			VALUES (?, ?, `+fieldPlaceholders+`, ?, ?, ?)`,
			append(append([]any{b.ID, b.Account}, fieldValues(b)...), who.KeyID, who.RequestID, tx.nextChange())...)
		return outcome{ID: b.ID, Version: 1, Changed: true}, err
	})
}

// changeButton updates (with edit), deletes or restores (action) the actor's button: in the writer's transaction it
// reads the row, checks ifMatch and the state (refusals in that order: 404, 412, 409, then edit's) and, unless
// nothing changed, writes the next version with the next changeSeq, and the one before into its history.
func (s *store) changeButton(ctx context.Context, who actor, id string, ifMatch int64, action string,
	edit func(*button) error) (outcome, error) {
	return s.apply(ctx, who, func(tx *writeTx) (outcome, error) {
		b, err := scanButton(tx.queryRow(context.Background(), `SELECT `+selectButton+
			` FROM buttons WHERE account = ? AND id = ?`, who.Account, id))
		if err != nil {
			return outcome{}, err
		}
		if ifMatch != 0 && ifMatch != b.Version {
			return outcome{}, errPreconditionFailed
		}
		before := b
		switch {
		case action == "update" && b.State == stateDeleted:
			return outcome{}, &apiError{code: codeWrongState, message: "button is deleted; restore it first"}
		case action == "delete" && b.State == stateDeleted:
			return outcome{}, &apiError{code: codeWrongState, message: "button is already deleted"}
		case action == "restore" && b.State == stateActive:
			return outcome{}, &apiError{code: codeWrongState, message: "button is not deleted"}
		case action == "delete":
			b.State, b.DeletedAt = stateDeleted, now()
		case action == "restore":
			b.State, b.DeletedAt = stateActive, timestamp{}
		default:
			err = edit(&b)
		}
		if err != nil || b.sameAs(before) {
			return outcome{ID: id, Version: before.Version}, err
		}
		b.Version++
		b.UpdatedAt = now()
		_, err = tx.exec(`UPDATE buttons SET product_name = ?, description = nullif(?, ''), amount_minor = ?,
				currency = ?, fee_basis_points = nullif(?, 0), metadata = ?, state = ?, version = ?,
				updated_at = ?, deleted_at = ?, change_seq = ?
			WHERE account = ? AND id = ?`,
			b.ProductName, b.Description, b.AmountMinor, b.Currency, b.FeeBasisPoints, b.Metadata, b.State,
			b.Version, b.UpdatedAt, b.DeletedAt, tx.nextChange(), who.Account, id)
		if err == nil {
			_, err = tx.exec(`INSERT INTO button_history
					(button_id, change_version, action, key_id, request_id, changed_at, account, `+buttonFields+`)
				VALUES (?, ?, ?, ?, ?, ?, ?, `+fieldPlaceholders+`)`,
				append([]any{id, b.Version, action, who.KeyID, who.RequestID, b.UpdatedAt, who.Account},
					fieldValues(before)...)...)
		}
		return outcome{ID: id, Version: b.Version, Changed: true}, err
	})
}

// --- idempotency keys ---

// apply runs change in the writer's next transaction and returns its outcome, the *apiError that refused it (nothing
// written), or a fault. With who.Idempotency, the answer to that outcome (answerOf, handlers.go) is stored in the same
// transaction: a crash keeps neither the change without its answer nor the answer without its change.
func (s *store) apply(ctx context.Context, who actor, change func(tx *writeTx) (outcome, error)) (outcome, error) {
	var out outcome
	var refusal error
	err := s.write(ctx, func(tx *writeTx) error {
		if out, refusal = change(tx); refusal != nil && !errors.As(refusal, new(*apiError)) {
			return refusal // a fault fails the batch
		}
		key := who.Idempotency
		if key == nil {
			return nil
		}
		a := answerOf(key.Message, out, refusal)
		_, err := tx.exec(`INSERT OR REPLACE INTO idempotency_keys
				(account, key, fingerprint, status, body, version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			who.Account, key.Key, key.Fingerprint, a.Status, a.Body, a.Version, now())
		return err
	})
	if err != nil {
		return outcome{}, err
	}
	return out, refusal
}

func (s *store) keepRefusal(ctx context.Context, who actor, refusal error) error {
	_, err := s.apply(ctx, who, func(*writeTx) (outcome, error) { return outcome{}, refusal })
	return err
}

// findAnswer returns the answer stored for account's Idempotency-Key, or errNotFound; answers older than
// idempotencyTTL count as none.
func (s *store) findAnswer(ctx context.Context, account, key string) (answer, error) {
	var a answer
	err := s.reads.queryRow(ctx, `SELECT fingerprint, status, body, version FROM idempotency_keys
		WHERE account = ? AND key = ? AND created_at > ?`, account, key, timestamp{now().Add(-idempotencyTTL)}).
		Scan(&a.Fingerprint, &a.Status, &a.Body, &a.Version)
	if errors.Is(err, sql.ErrNoRows) {
		return answer{}, errNotFound
	}
	return a, s.check(err)
}

// purgeExpired deletes up to limit expired answers, so as never to hold the writer long, and says how many.
func purgeExpired(tx *writeTx, limit int) (int64, error) {
	res, err := tx.exec(`DELETE FROM idempotency_keys WHERE (account, key) IN
		(SELECT account, key FROM idempotency_keys WHERE created_at <= ? LIMIT ?)`,
		timestamp{now().Add(-idempotencyTTL)}, limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
