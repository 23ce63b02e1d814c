package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// storage is every operation the handlers use. An expected outcome is an *apiError; any other error is a fault.
type storage interface {
	authenticate(ctx context.Context, secret string) (apiKey, error)                 // or errUnknownKey
	liveKeys(ctx context.Context) ([]apiKey, error)                                  // the keys not revoked
	getButtonWithKey(ctx context.Context, secret, id string) (apiKey, button, error) // one query for both
	listButtons(ctx context.Context, account string, f listFilter) (page []button, scanEnd string, err error)
	buttonHistory(ctx context.Context, account, id string, after, limit int64) ([]historyEntry, int64, error)
	changes(ctx context.Context, account string, since, limit int64) ([]button, error) // by changeSeq
	watch(account string) <-chan struct{}                                              // closed at its next change

	// The writes. ifMatch, when not 0, is the version the caller last saw; action is "update" (made by edit),
	// "delete" or "restore".
	createButton(ctx context.Context, who actor, b button) (outcome, error)
	changeButton(ctx context.Context, who actor, id string, ifMatch int64, action string,
		edit func(*button) error) (outcome, error)
	reject(ctx context.Context, who actor, refusal error) error                      // once the key is checked
	findResponse(ctx context.Context, who actor, key string) (storedResponse, error) // while the key is live

	ping(ctx context.Context) error                           // reads every table; fails while writes are refused
	stats() (commits, ops int64, batches []int64, size int64) // for /metrics
}

// The commands use openStore, close, createKey, listKeys and revokeKey; backup and check (main.go) use ownVersion.

const (
	maxBatch       = 256            // writes that share one transaction and one fsync
	maxScan        = 1000           // rows a filtered list page examines, however large the account
	idempotencyTTL = 24 * time.Hour // how long an answer stays replayable
	applicationID  = 0x70627574     // "pbut" in the header of every paybuttons database
)

// store owns the SQLite file: one writer connection fed by a single goroutine that commits waiting writes together
// (group commit), and read-only connections that never wait behind it (WAL).
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

	wal   os.FileInfo              // the WAL file SQLite opened
	fault atomic.Pointer[apiError] // set for good once that file is gone: writes are refused

	lastUsedSaved sync.Map // key id -> time last_used_at was written: at most once a minute

	watchMu  sync.Mutex
	watchers map[string]chan struct{} // account -> closed at its next committed change

	ops     atomic.Int64    // writes committed
	batches [9]atomic.Int64 // commits of up to 1, 2, 4, ... 256 writes
}

// statements prepares each SQL text once and keeps it: parsing costs SQLite as much as running it.
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
	if err != nil { // the query cannot run: let the unprepared call report why, in the Row
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

// close comes before the database's Close: a connection with a statement open outlives DB.Close, and a process that
// keeps one open makes the next server trust a crashed one's WAL index.
func (c *statements) close() {
	c.cache.Range(func(_, st any) bool {
		st.(*sql.Stmt).Close()
		return true
	})
}

// writeTx is the writer's connection, inside the batch's transaction.
type writeTx struct {
	statements
	conn      *sql.Conn
	committed int64           // the last changeSeq committed
	seq       int64           // the last changeSeq this batch gave out
	changed   []string        // the accounts this batch changes
	liveKeys  map[string]bool // key id -> whether it is live, for the keys this batch has looked up
}

// nextChange gives a change to one of account's buttons the next changeSeq.
func (tx *writeTx) nextChange(account string) int64 {
	tx.seq++
	tx.changed = append(tx.changed, account)
	return tx.seq
}

// openStore opens (creating if needed) the database at path, migrates it and starts the writer. It fails if the
// directory does not exist, or the file is not a paybuttons database this binary knows.
func openStore(path string) (*store, error) {
	if err := checkDir(path); err != nil {
		return nil, err
	}
	// Pragmas live in the DSN, so that every pooled connection gets them. The writer checkpoints every 4000 WAL
	// pages, not 1000: fewer, larger checkpoints cost it less (README, Performance).
	const common = "?_pragma=busy_timeout(5000)"
	writer, _ := sql.Open("sqlite", path+common+ // sql.Open fails only for an unknown driver
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=wal_autocheckpoint(4000)&_txlock=immediate")
	writer.SetMaxOpenConns(1)
	s := &store{path: path, writer: writer, writes: make(chan writeOp), quit: make(chan struct{}),
		stopped: make(chan struct{}), watchers: map[string]chan struct{}{}}
	conn, err := writer.Conn(context.Background())
	if err == nil {
		s.tx = &writeTx{conn: conn, statements: statements{db: conn}}
		if err = migrate(conn); err == nil {
			err = conn.QueryRowContext(context.Background(), "SELECT last FROM change_counter").Scan(&s.tx.committed)
		}
	}
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("database %q: %w", path, describeOpenError(err))
	}
	s.wal, _ = os.Stat(path + "-wal") // the migration's read opened it
	s.reader, _ = sql.Open("sqlite", path+common+"&_pragma=query_only(1)")
	s.health, _ = sql.Open("sqlite", path+common+"&_pragma=query_only(1)")
	s.reads = statements{db: s.reader}
	s.reader.SetMaxOpenConns(4) // each keeps its own page cache (2 MB); four keep two cores busy
	s.reader.SetMaxIdleConns(4)
	s.health.SetMaxOpenConns(1)
	go s.runWriter()
	return s, nil
}

// close stops the writer, checkpoints the WAL into the main file and closes every connection. A checkpoint another
// process's reader (Litestream) keeps from finishing gets a second, then errCheckpointBusy.
func (s *store) close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.stopped
		ctx := context.Background()
		var busy, walPages, moved int
		_, err := s.tx.conn.ExecContext(ctx, "PRAGMA busy_timeout = 1000")
		if err == nil {
			err = s.tx.conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &walPages, &moved)
		}
		if err == nil && busy != 0 {
			err = errCheckpointBusy
		}
		s.tx.statements.close()
		s.reads.close()
		s.closeErr = errors.Join(err, s.tx.conn.Close(), s.reader.Close(), s.health.Close(), s.writer.Close())
	})
	return s.closeErr
}

var errCheckpointBusy = errors.New("the WAL was not checkpointed: another process is reading it " +
	"(nothing is lost: the next start applies it)")

// migrations are applied in order, each in its own transaction; PRAGMA user_version counts them. Never edit one
// that has shipped: add the next.
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

	// 2: history, idempotency keys, and an index for listing by state. A history row is one change after the create
	// (whose author is on the button row) and the button as it was before that change; the button after it is the
	// next row's, or the button itself. A create then costs one row, not two.
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

	// 3: metadata, read-only keys, the change feed, and the file's mark. Buttons already stored take changeSeq 1..n
	// in the order they last changed; change_counter keeps the last one given out.
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

// migrate brings the schema of a paybuttons database up to date; a newer schema is an error.
func migrate(conn *sql.Conn) error {
	ctx := context.Background()
	version, err := ownVersion(ctx, conn)
	switch {
	case err != nil:
		return err
	case version > len(migrations):
		return fmt.Errorf("schema version %d is newer than this paybuttons knows (%d)", version, len(migrations))
	}
	for ; version < len(migrations); version++ {
		_, err := conn.ExecContext(ctx, fmt.Sprintf("BEGIN IMMEDIATE;\n%s;\nPRAGMA user_version = %d;\nCOMMIT",
			migrations[version], version+1))
		if err != nil {
			conn.ExecContext(ctx, "ROLLBACK") // fails harmlessly when SQLite has rolled back already
			return fmt.Errorf("migration %d: %w", version+1, describeOpenError(err))
		}
	}
	return nil
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

// classify turns the faults a client should retry (busy past busy_timeout, a full disk, no connection in time) into
// unavailable, and a client that went away into canceled; the rest it leaves alone.
func classify(err error) error {
	switch code := sqliteCode(err); {
	case code == sqlite3.SQLITE_FULL:
		return &apiError{code: "unavailable", message: "the server's disk is full; retry later", cause: err}
	case code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED || errors.Is(err, context.DeadlineExceeded):
		return &apiError{code: "unavailable", message: "the database is busy; retry shortly", cause: err}
	case errors.Is(err, context.Canceled):
		return &apiError{code: "canceled", message: "the client went away", cause: err}
	}
	return err
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
		return classify(ctx.Err())
	case <-s.quit:
		return errClosed
	}
}

// runWriter commits every write that is waiting, up to maxBatch, in one transaction: one fsync for all. Once a
// minute it purges answers older than idempotencyTTL.
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

// commit runs batch in one IMMEDIATE transaction (the write lock taken at once, waiting up to busy_timeout for
// another process). It succeeds or fails as a unit, then wakes whoever watches the accounts it changed.
func (s *store) commit(batch []writeOp) error {
	tx := s.tx
	tx.seq, tx.changed, tx.liveKeys = tx.committed, tx.changed[:0], map[string]bool{}
	err := s.checkWAL()
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
	if err != nil {
		tx.exec("ROLLBACK") // fails harmlessly when SQLite has rolled back already
		return classify(err)
	}
	tx.committed = tx.seq
	s.ops.Add(int64(len(batch)))
	s.batches[bits.Len(uint(len(batch)-1))].Add(1)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for _, account := range tx.changed {
		if ch := s.watchers[account]; ch != nil {
			close(ch)
			delete(s.watchers, account)
		}
	}
	return nil
}

// checkWAL fails, from then on, once the WAL file is gone or not the one SQLite has open: an acknowledged write
// would then be lost at the next start.
func (s *store) checkWAL() error {
	if info, err := os.Stat(s.path + "-wal"); s.wal != nil && (err != nil || !os.SameFile(info, s.wal)) {
		s.fault.CompareAndSwap(nil, &apiError{code: "unavailable",
			message: "the database refuses writes; see the server's log",
			cause: fmt.Errorf("the WAL file %s-wal was removed or replaced while the server ran: writes are refused, "+
				"since the next start would lose them. Stop the server with SIGTERM: its checkpoint saves what "+
				"the old WAL holds into the database", s.path)})
	}
	if err := s.fault.Load(); err != nil {
		return err
	}
	return nil
}

func (s *store) watch(account string) <-chan struct{} {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchers[account] == nil {
		s.watchers[account] = make(chan struct{})
	}
	return s.watchers[account]
}

func (s *store) ping(ctx context.Context) error {
	if err := s.checkWAL(); err != nil {
		return err
	}
	var n int
	return classify(s.health.QueryRowContext(ctx, `SELECT (SELECT last FROM change_counter) +
		EXISTS (SELECT 1 FROM api_keys) + EXISTS (SELECT 1 FROM buttons) + EXISTS (SELECT 1 FROM button_history) +
		EXISTS (SELECT 1 FROM idempotency_keys)`).Scan(&n))
}

func (s *store) stats() (commits, ops int64, batches []int64, size int64) {
	for i := range s.batches {
		batches, commits = append(batches, s.batches[i].Load()), commits+s.batches[i].Load()
	}
	if info, err := os.Stat(s.path); err == nil {
		size = info.Size()
	}
	return commits, s.ops.Load(), batches, size
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
		`SELECT id, account, read_only, created_at, last_used_at, revoked_at FROM api_keys ORDER BY created_at, id`)
	return collect(rows, err, func(rows *sql.Rows) (k apiKey, err error) {
		return k, rows.Scan(&k.ID, &k.Account, &k.ReadOnly, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
	})
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

// authenticate reads the database every time: a revoke from another process stops the next request.
func (s *store) authenticate(ctx context.Context, secret string) (apiKey, error) {
	hash := sha256.Sum256([]byte(secret))
	var k apiKey
	err := s.reads.queryRow(ctx, `SELECT id, account, read_only FROM api_keys
		WHERE secret_hash = ? AND revoked_at IS NULL`, hash[:]).Scan(&k.ID, &k.Account, &k.ReadOnly)
	if errors.Is(err, sql.ErrNoRows) {
		return apiKey{}, errUnknownKey
	}
	if err == nil {
		s.noteKeyUsed(k.ID)
	}
	return k, classify(err)
}

func (s *store) liveKeys(ctx context.Context) ([]apiKey, error) {
	rows, err := s.reads.query(ctx, `SELECT secret_hash, id, account, read_only FROM api_keys WHERE revoked_at IS NULL`)
	return collect(rows, err, func(rows *sql.Rows) (k apiKey, err error) {
		return k, rows.Scan(&k.Hash, &k.ID, &k.Account, &k.ReadOnly)
	})
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

// scanButtons reads every row of selectButton.
func scanButtons(rows *sql.Rows, err error) ([]button, error) {
	return collect(rows, err, func(rows *sql.Rows) (button, error) { return scanButton(rows) })
}

// collect reads every row with scan; it is the one loop over query results.
func collect[T any](rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	items := []T{}
	for rows.Next() {
		item, err := scan(rows)
		if err != nil {
			return nil, classify(err)
		}
		items = append(items, item)
	}
	return items, classify(rows.Err())
}

// getButtonWithKey checks the key in the query that reads the button: get is the hottest path.
func (s *store) getButtonWithKey(ctx context.Context, secret, id string) (apiKey, button, error) {
	if validButtonID(id) {
		hash := sha256.Sum256([]byte(secret))
		var k apiKey
		b, err := scanButton(s.reads.queryRow(ctx, `SELECT `+selectButton+`, key_id, key_account, key_read_only
			FROM (SELECT id AS key_id, account AS key_account, read_only AS key_read_only FROM api_keys
				WHERE secret_hash = ? AND revoked_at IS NULL)
			JOIN buttons ON account = key_account AND id = ?`, hash[:], id), &k.ID, &k.Account, &k.ReadOnly)
		if err == nil {
			s.noteKeyUsed(k.ID)
		}
		if err != errNotFound {
			return k, b, classify(err)
		}
	}
	k, err := s.authenticate(ctx, secret) // no row: an unknown key, or no such button
	return k, button{}, err
}

// listButtons pages through account's buttons by id, newest first: ids grow with time, so "id < after" neither
// skips nor repeats a button while others are created. A filter no index serves (isLive, paymentMethod, metadata)
// examines at most maxScan rows; scanEnd then says where the next page starts.
func (s *store) listButtons(ctx context.Context, account string, f listFilter) ([]button, string, error) {
	where, args := "account = ?", []any{account}
	if f.After != "" {
		where, args = where+" AND id < ?", append(args, f.After)
	}
	// Without statistics SQLite would walk the primary key: a page of a rare state would cost the account.
	table := "buttons"
	if f.State != "" {
		table, where, args = "buttons INDEXED BY buttons_by_state", where+" AND state = ?", append(args, f.State)
	}
	var scanEnd string
	if f.IsLive != nil || f.PaymentMethod != "" || len(f.Metadata) > 0 {
		err := s.reads.queryRow(ctx, `SELECT id FROM `+table+` WHERE `+where+` ORDER BY id DESC LIMIT 1 OFFSET ?`,
			append(args, maxScan-1)...).Scan(&scanEnd)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, "", classify(err)
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
	buttons, err := scanButtons(s.reads.query(ctx, `SELECT `+selectButton+` FROM `+table+
		` WHERE `+where+` ORDER BY id DESC LIMIT ?`, append(args, f.Limit)...))
	if len(buttons) == f.Limit {
		scanEnd = "" // the page is full before the scan's end
	}
	return buttons, scanEnd, err
}

func (s *store) buttonHistory(ctx context.Context, account, id string, after, limit int64) (
	[]historyEntry, int64, error) {
	if !validButtonID(id) {
		return nil, 0, errNotFound
	}
	// One read transaction: the button and its changes as of one moment.
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, classify(err)
	}
	defer tx.Rollback()
	created := historyEntry{Version: 1, Action: "create"}
	current, err := scanButton(tx.QueryRowContext(ctx, `SELECT `+selectButton+`, created_key_id, created_request_id
		FROM buttons WHERE account = ? AND id = ?`, account, id), &created.KeyID, &created.RequestID)
	if err != nil {
		return nil, 0, classify(err)
	}
	created.At = current.CreatedAt
	// Row v holds the button before change v: the page and the state after it take rows after+1..after+limit+1.
	rows, err := tx.QueryContext(ctx, `SELECT button_id, account, `+selectFields+`, 0,
			change_version, action, key_id, request_id, changed_at
		FROM button_history WHERE button_id = ? AND account = ? AND change_version BETWEEN ? AND ?`,
		id, account, after+1, after+limit+1)
	entries, err := collect(rows, err, func(rows *sql.Rows) (e historyEntry, err error) {
		e.Before, err = scanButton(rows, &e.Version, &e.Action, &e.KeyID, &e.RequestID, &e.At)
		return e, err
	})
	if err != nil {
		return nil, 0, err
	}
	byVersion := map[int64]historyEntry{1: created}
	for _, e := range entries {
		byVersion[e.Version] = e
	}
	var page []historyEntry
	for v := after + 1; v <= min(after+limit, current.Version); v++ {
		e := byVersion[v]
		if e.After = byVersion[v+1].Before; v == current.Version {
			e.After = current
		}
		page = append(page, e)
	}
	return page, current.Version, nil
}

func (s *store) changes(ctx context.Context, account string, since, limit int64) ([]button, error) {
	return scanButtons(s.reads.query(ctx, `SELECT `+selectButton+` FROM buttons INDEXED BY buttons_by_change
		WHERE account = ? AND change_seq > ? ORDER BY change_seq LIMIT ?`, account, since, limit))
}

// createButton stores b as a new active button of the actor's account.
func (s *store) createButton(ctx context.Context, who actor, b button) (outcome, error) {
	b.ID, b.Account, b.State, b.Version = s.ids.next(), who.Account, stateActive, 1
	return s.writeAnswered(ctx, who, func(tx *writeTx) (outcome, error) {
		b.CreatedAt = now()
		b.UpdatedAt = b.CreatedAt
		_, err := tx.exec(`INSERT INTO buttons (id, account, `+buttonFields+`, created_key_id, created_request_id, change_seq)
			VALUES (?, ?, `+fieldPlaceholders+`, ?, ?, ?)`,
			append(append([]any{b.ID, b.Account}, fieldValues(b)...), who.KeyID, who.RequestID, tx.nextChange(b.Account))...)
		return outcome{ID: b.ID, Changed: true}, err
	})
}

// changeButton updates (with edit), deletes or restores (action) the actor's button: in the writer's transaction it
// reads the row, checks ifMatch and the state (refusals in that order: 404, 412, 409, then edit's) and, unless
// nothing changed, writes the next version with the next changeSeq, and the one before into its history.
func (s *store) changeButton(ctx context.Context, who actor, id string, ifMatch int64, action string,
	edit func(*button) error) (outcome, error) {
	return s.writeAnswered(ctx, who, func(tx *writeTx) (outcome, error) {
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
			return outcome{}, &apiError{code: "wrong_state", message: "button is deleted; restore it first"}
		case action == "delete" && b.State == stateDeleted:
			return outcome{}, &apiError{code: "wrong_state", message: "button is already deleted"}
		case action == "restore" && b.State == stateActive:
			return outcome{}, &apiError{code: "wrong_state", message: "button is not deleted"}
		case action == "delete":
			b.State, b.DeletedAt = stateDeleted, now()
		case action == "restore":
			b.State, b.DeletedAt = stateActive, timestamp{}
		default:
			err = edit(&b)
		}
		if err != nil || b.sameAs(before) {
			return outcome{ID: id}, err
		}
		b.Version++
		b.UpdatedAt = now()
		_, err = tx.exec(`UPDATE buttons SET product_name = ?, description = nullif(?, ''), amount_minor = ?,
				currency = ?, fee_basis_points = nullif(?, 0), metadata = ?, state = ?, version = ?,
				updated_at = ?, deleted_at = ?, change_seq = ?
			WHERE account = ? AND id = ?`,
			b.ProductName, b.Description, b.AmountMinor, b.Currency, b.FeeBasisPoints, b.Metadata, b.State,
			b.Version, b.UpdatedAt, b.DeletedAt, tx.nextChange(who.Account), who.Account, id)
		if err == nil {
			_, err = tx.exec(`INSERT INTO button_history
					(button_id, change_version, action, key_id, request_id, changed_at, account, `+buttonFields+`)
				VALUES (?, ?, ?, ?, ?, ?, ?, `+fieldPlaceholders+`)`,
				append([]any{id, b.Version, action, who.KeyID, who.RequestID, b.UpdatedAt, who.Account},
					fieldValues(before)...)...)
		}
		return outcome{ID: id, Changed: true}, err
	})
}

// --- idempotency keys ---

// writeAnswered runs change in the writer's next transaction, once the actor's key is found live there (the handler
// may know it from memory): its outcome, an *apiError (nothing written) or a fault. An Idempotency-Key's answer is
// stored in the same transaction, so that a crash keeps neither the change without its answer nor the answer
// without its change.
func (s *store) writeAnswered(ctx context.Context, who actor,
	change func(tx *writeTx) (outcome, error)) (outcome, error) {
	var out outcome
	var refusal error
	key := who.Idempotency
	err := s.write(ctx, func(tx *writeTx) error {
		var err error
		live, checked := tx.liveKeys[who.KeyID]
		if !checked { // once a batch: while it holds the write lock, no other process can revoke a key
			err = tx.queryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM api_keys
				WHERE id = ? AND revoked_at IS NULL)`, who.KeyID).Scan(&live)
			tx.liveKeys[who.KeyID] = live
		}
		if err != nil || !live {
			refusal = errUnknownKey
			return err
		}
		s.noteKeyUsed(who.KeyID)
		var expected *apiError
		if out, err = change(tx); err != nil && !errors.As(err, &expected) {
			return err
		}
		if refusal = err; key == nil {
			return nil
		}
		key.Answer = key.Render(out, refusal)
		_, err = tx.exec(`INSERT OR REPLACE INTO idempotency_keys (account, key, fingerprint, status, body, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`, who.Account, key.Key, key.Fingerprint, key.Answer.Status, key.Answer.Body, now())
		return err
	})
	if err != nil {
		if key != nil {
			key.Answer = storedResponse{} // rendered, but rolled back with the batch
		}
		return outcome{}, err
	}
	return out, refusal
}

func (s *store) reject(ctx context.Context, who actor, refusal error) error {
	_, err := s.writeAnswered(ctx, who, func(*writeTx) (outcome, error) { return outcome{}, refusal })
	return err
}

// findResponse ignores answers older than idempotencyTTL.
func (s *store) findResponse(ctx context.Context, who actor, key string) (storedResponse, error) {
	var r storedResponse
	err := s.reads.queryRow(ctx, `SELECT fingerprint, status, body FROM idempotency_keys
		WHERE account = ? AND key = ? AND created_at > ?
			AND EXISTS (SELECT 1 FROM api_keys WHERE id = ? AND revoked_at IS NULL)`, who.Account, key,
		timestamp{now().Add(-idempotencyTTL)}, who.KeyID).Scan(&r.Fingerprint, &r.Status, &r.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return storedResponse{}, errNotFound
	}
	return r, classify(err)
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
