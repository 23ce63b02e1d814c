package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// --- the model every file shares ---

// errorCode is a stable code that a client branches on, with the HTTP status it is sent with.
type errorCode struct {
	name   string
	status int
}

var (
	codeInvalid          = errorCode{"invalid_request", 400}
	codeUnauthorized     = errorCode{"unauthorized", 401}
	codeForbidden        = errorCode{"forbidden", 403}
	codeNotFound         = errorCode{"not_found", 404}
	codeMethodNotAllowed = errorCode{"method_not_allowed", 405}
	codeWrongState       = errorCode{"wrong_state", 409}
	codeInFlight         = errorCode{"idempotency_in_flight", 409}
	codePrecondition     = errorCode{"precondition_failed", 412}
	codeTooLarge         = errorCode{"payload_too_large", 413}
	codeMediaType        = errorCode{"unsupported_media_type", 415}
	codeMismatch         = errorCode{"idempotency_mismatch", 422}
	codeRateLimited      = errorCode{"rate_limited", 429}
	codeInternal         = errorCode{"internal", 500}
	codeUnavailable      = errorCode{"unavailable", 503}
)

// apiError is every failure a client is told of: a code, a message for people, and every failing
// field of an invalid_request. retry is when a 429 may be retried; cause is logged, never sent.
type apiError struct {
	code    errorCode
	message string
	fields  map[string]string
	retry   time.Duration
	cause   error
}

func (e *apiError) Error() string { return e.message }

var (
	errNotFound     = &apiError{code: codeNotFound, message: "no such button"}
	errUnknownKey   = &apiError{code: codeUnauthorized, message: "the API key is not valid"}
	errPrecondition = &apiError{code: codePrecondition,
		message: "the button has changed since the version in If-Match; get it again"}
)

// button is one payment button as the API shows it, and as it is stored: this JSON. An absent
// optional value is nil (null).
type button struct {
	ID              string            `json:"id"`
	ProductName     string            `json:"productName"`
	Description     *string           `json:"description"`
	Amount          string            `json:"amount"` // with the currency's decimal places: "19.90"
	Currency        string            `json:"currency"`
	BillingInterval *string           `json:"billingInterval"` // day, week, month or year
	PaymentMethod   string            `json:"paymentMethod"`
	PaymentType     string            `json:"paymentType"` // one_time or subscription
	IsLive          bool              `json:"isLive"`
	Fee             *string           `json:"ApplicationFeePercentage"` // two decimals: "2.50"
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`   // active or deleted
	Version         int64             `json:"version"` // 1 at create, one more with every change
	CreatedAt       string            `json:"createdAt"`
	UpdatedAt       string            `json:"updatedAt"`
	DeletedAt       *string           `json:"deletedAt"`
}

// apiKey is a key's record; only the SHA-256 of its secret is stored.
type apiKey struct {
	ID, Account                      string
	ReadOnly                         bool // may read buttons, never change them
	CreatedAt, LastUsedAt, RevokedAt string
}

// actor is who makes a change: the account scopes it, the ids go into the button's history.
type actor struct{ Account, KeyID, RequestID string }

// historyEntry is one change to a button, with the button before it (none at create) and after.
type historyEntry struct {
	Version                  int64 // the version the change made
	Action, KeyID, RequestID string
	Before, After            button
}

// listQuery selects a page of an account's buttons, newest first.
type listQuery struct {
	Limit         int
	After         string // the last id of the page before, or ""
	State         string // active, deleted or all
	IsLive        *bool  // nil for either
	PaymentMethod string // "" for any
}

// answer is a rendered response to a write, kept for its Idempotency-Key and sent again as it is.
type answer struct {
	Fingerprint []byte // of the request it answered
	Status      int
	Body        []byte
	Version     int64 // the ETag; 0 for none
}

// --- the storage API ---
//
// Reads (authenticate, get, list, history, findAnswer, listKeys, ping) run on read-only
// connections, which never wait for a write (WAL). Writes run one at a time: begin takes the write
// lock; create or change (each writing its history) and keepAnswer (for an Idempotency-Key) run in
// that transaction, and Commit makes them durable together. createKey and revokeKey write alone.
// A refusal is an *apiError; any other error is a fault.

const (
	applicationID  = 0x70627574     // "pbut", in the header of every paybuttons database
	idempotencyTTL = 24 * time.Hour // how long an answer is kept for its Idempotency-Key
)

// schema is the whole database, made at the first start. Every table is scoped to an account.
const schema = `
CREATE TABLE api_keys (
	id           TEXT PRIMARY KEY,
	account      TEXT NOT NULL,
	secret_hash  BLOB NOT NULL UNIQUE,
	read_only    INTEGER NOT NULL,
	created_at   TEXT NOT NULL,
	last_used_at TEXT NOT NULL DEFAULT '',
	revoked_at   TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE buttons (
	account        TEXT NOT NULL,
	id             TEXT NOT NULL,
	state          TEXT NOT NULL, -- the button's fields that list filters on
	is_live        INTEGER NOT NULL,
	payment_method TEXT NOT NULL,
	button         TEXT NOT NULL, -- the button, as JSON
	PRIMARY KEY (account, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX buttons_by_state ON buttons (account, state, id);
CREATE TABLE history (
	account    TEXT NOT NULL,
	button_id  TEXT NOT NULL,
	version    INTEGER NOT NULL,
	action     TEXT NOT NULL, -- create, update, delete or restore
	key_id     TEXT NOT NULL,
	request_id TEXT NOT NULL,
	button     TEXT NOT NULL, -- the button after the change, as JSON
	PRIMARY KEY (account, button_id, version)
) STRICT, WITHOUT ROWID;
CREATE TABLE idempotency_keys (
	account     TEXT NOT NULL,
	key         TEXT NOT NULL,
	fingerprint BLOB NOT NULL,
	status      INTEGER NOT NULL,
	body        BLOB NOT NULL,
	version     INTEGER NOT NULL,
	created_at  TEXT NOT NULL,
	PRIMARY KEY (account, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
PRAGMA application_id = 1885500788;`

// store is the SQLite file: one writer connection, so writes run one at a time, and readers.
type store struct {
	writer, reader *sql.DB
	// What every request and every get run, prepared once: SQLite parses anything else each time.
	keyBySecret, buttonByID *sql.Stmt
	mu                      sync.Mutex
	lastID                  [16]byte // of newButtonID
}

// openStore opens the database file at path, making it a paybuttons database if it is new. It
// fails for another program's file, one this process cannot write, or a schema version but 1.
func openStore(path string) (*store, error) {
	// synchronous=FULL: a write is on disk before it is answered. _txlock=immediate: a write takes
	// the lock at BEGIN, so a writer of another process waits busy_timeout, never fails halfway.
	writer, _ := sql.Open("sqlite", sqliteURI(path,
		"_pragma=busy_timeout(5000)&_pragma=synchronous(FULL)&_txlock=immediate"))
	writer.SetMaxOpenConns(1)
	reader, _ := sql.Open("sqlite", sqliteURI(path,
		"_pragma=busy_timeout(5000)&_pragma=query_only(1)"))
	reader.SetMaxOpenConns(4) // each has a page cache of its own; four keep two cores busy
	reader.SetMaxIdleConns(4)
	s := &store{writer: writer, reader: reader}
	err := s.createSchema()
	if err == nil {
		s.keyBySecret, err = reader.Prepare(`SELECT id, account, read_only, last_used_at
			FROM api_keys WHERE secret_hash = ? AND revoked_at = ''`)
	}
	if err == nil {
		s.buttonByID, err = reader.Prepare(`SELECT button FROM buttons
			WHERE account = ? AND id = ?`)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("database %q: %w", path, err)
	}
	return s, nil
}

// createSchema reads what the file holds under the write lock: two processes opening a new file at
// once both succeed. A file with no tables but the ones Litestream adds is new.
func (s *store) createSchema() error {
	tx, err := s.writer.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var app, version, tables int
	err = tx.QueryRow(`SELECT (SELECT application_id FROM pragma_application_id),
		(SELECT user_version FROM pragma_user_version),
		(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE '\_litestream%' ESCAPE '\')`).
		Scan(&app, &version, &tables)
	if err != nil {
		return err
	}
	if app == 0 && tables == 0 {
		if _, err := tx.Exec(schema); err != nil {
			return err
		}
	} else if app != applicationID {
		return errors.New("not a paybuttons database (another program's SQLite file)")
	} else if version != 1 {
		return fmt.Errorf("schema version %d; this paybuttons knows only 1", version)
	}
	// Written even when it is 1 already: a file this process cannot write fails here.
	if _, err := tx.Exec("PRAGMA user_version = 1"); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	// WAL, so reads never wait for the writer. The file keeps the mode, set once the checks above
	// have left another program's file as it was. Another process making the same switch at that
	// moment makes it fail with BUSY at once, without waiting busy_timeout: so it is tried again.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		_, err := s.writer.Exec("PRAGMA journal_mode = WAL")
		if sqliteCode(err) != sqlite3.SQLITE_BUSY || time.Since(start) > 5*time.Second {
			return err
		}
	}
}

// openToRead opens the paybuttons database at path read-only, for a command that only reads it.
func openToRead(path string) (*sql.DB, error) {
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro&_pragma=busy_timeout(5000)"))
	var app int
	err := db.QueryRow("SELECT application_id FROM pragma_application_id").Scan(&app)
	if err == nil && app != applicationID {
		err = errors.New("not a paybuttons database")
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("database %q: %w", path, err)
	}
	return db, nil
}

// close closes every connection, and the statements prepared on them. The last to close copies the
// WAL into the database file, unless another process, such as Litestream, has the file open.
func (s *store) close() error { return errors.Join(s.reader.Close(), s.writer.Close()) }

// sqliteURI names the file at path for the driver; a '?' or '#' in path is part of the name.
func sqliteURI(path, params string) string {
	escape := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")
	return "file:" + escape.Replace(path) + "?" + params
}

// sqliteCode is SQLite's primary result code behind err, or 0.
func sqliteCode(err error) int {
	if e := (*sqlite.Error)(nil); errors.As(err, &e) {
		return e.Code() & 0xff
	}
	return 0
}

// fault is what a client is told of an error that is not an *apiError: a lock held past
// busy_timeout, a full disk or a request out of time is worth a retry; anything else is a bug.
func fault(err error) *apiError {
	switch code := sqliteCode(err); {
	case code == sqlite3.SQLITE_FULL:
		return &apiError{code: codeUnavailable, message: "the disk is full; retry later",
			cause: err}
	case code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return &apiError{code: codeUnavailable, message: "the database is busy; retry shortly",
			cause: err}
	}
	return &apiError{code: codeInternal, message: "internal error", cause: err}
}

// now is the clock of every stored time; stamp writes a time as stored: text that sorts as time.
func now() string { return stamp(time.Now()) }

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// collect reads every row with scan.
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

// createKey mints a key for account and returns its secret, shown once, and its id.
func (s *store) createKey(ctx context.Context, account string, readOnly bool) (secret, id string,
	err error) {
	raw := make([]byte, 32)
	rand.Read(raw)
	secret, id = "pbk_"+base64.RawURLEncoding.EncodeToString(raw), "key_"+rand.Text()[:16]
	hash := sha256.Sum256([]byte(secret))
	_, err = s.writer.ExecContext(ctx, `INSERT INTO api_keys
		(id, account, secret_hash, read_only, created_at) VALUES (?, ?, ?, ?, ?)`,
		id, account, hash[:], readOnly, now())
	return secret, id, err
}

// listKeys returns every key, revoked ones too, oldest first.
func (s *store) listKeys(ctx context.Context) ([]apiKey, error) {
	rows, err := s.reader.QueryContext(ctx, `SELECT id, account, read_only, created_at,
		last_used_at, revoked_at FROM api_keys ORDER BY created_at, id`)
	return collect(rows, err, func(rows *sql.Rows) (k apiKey, err error) {
		err = rows.Scan(&k.ID, &k.Account, &k.ReadOnly, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
		return k, err
	})
}

// revokeKey revokes the key with id; revoking it again changes nothing. An unknown id is an error.
func (s *store) revokeKey(ctx context.Context, id string) error {
	res, err := s.writer.ExecContext(ctx, `UPDATE api_keys
		SET revoked_at = iif(revoked_at = '', ?, revoked_at) WHERE id = ?`, now(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("no key with id %q", id)
	}
	return nil
}

// authenticate returns the live key with this secret, or errUnknownKey. It is the one place that
// decides whether a key is live, and it asks the database every time: a key revoked by another
// process stops at its next request.
func (s *store) authenticate(ctx context.Context, secret string) (apiKey, error) {
	hash := sha256.Sum256([]byte(secret))
	var k apiKey
	err := s.keyBySecret.QueryRowContext(ctx, hash[:]).Scan(&k.ID, &k.Account, &k.ReadOnly,
		&k.LastUsedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return k, errUnknownKey
	}
	// The last use, a hint for keys list, is written at most once a minute, in the background: no
	// request waits for it, and its failure fails none.
	if minuteAgo := stamp(time.Now().Add(-time.Minute)); err == nil && k.LastUsedAt < minuteAgo {
		go s.writer.Exec(`UPDATE api_keys SET last_used_at = ? WHERE id = ? AND last_used_at < ?`,
			now(), k.ID, minuteAgo)
	}
	return k, err
}

// scanButton reads a button's JSON; no row is errNotFound.
func scanButton(row interface{ Scan(...any) error }) (b button, err error) {
	var text []byte
	err = row.Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return b, errNotFound
	}
	if err == nil {
		err = json.Unmarshal(text, &b)
	}
	return b, err
}

// get returns account's button id, deleted or not.
func (s *store) get(ctx context.Context, account, id string) (button, error) {
	if !validButtonID(id) {
		return button{}, errNotFound
	}
	return scanButton(s.buttonByID.QueryRowContext(ctx, account, id))
}

// list returns a page of account's buttons, newest first, and whether more follow. Ids grow with
// time, so "id < after" neither skips nor repeats a button while others are created.
func (s *store) list(ctx context.Context, account string, q listQuery) ([]button, bool, error) {
	query, args := `SELECT button FROM buttons WHERE account = ?`, []any{account}
	if q.After != "" {
		query, args = query+` AND id < ?`, append(args, q.After)
	}
	if q.State != "all" {
		query, args = query+` AND state = ?`, append(args, q.State)
	}
	if q.IsLive != nil {
		query, args = query+` AND is_live = ?`, append(args, *q.IsLive)
	}
	if q.PaymentMethod != "" {
		query, args = query+` AND payment_method = ?`, append(args, q.PaymentMethod)
	}
	query += ` ORDER BY id DESC LIMIT ?`
	rows, err := s.reader.QueryContext(ctx, query, append(args, q.Limit+1)...)
	page, err := collect(rows, err, func(r *sql.Rows) (button, error) { return scanButton(r) })
	if len(page) > q.Limit { // the one more asked for: the page is not the last
		return page[:q.Limit], true, err
	}
	return page, false, err
}

// history returns up to limit changes to account's button id after version after, oldest first, and
// whether more follow. Each row holds the button after its change; lag() adds the row before (the
// page's first takes the row of version after, which is left out).
func (s *store) history(ctx context.Context, account, id string, after, limit int64) (
	[]historyEntry, bool, error) {
	if _, err := s.get(ctx, account, id); err != nil {
		return nil, false, err
	}
	rows, err := s.reader.QueryContext(ctx, `SELECT version, action, key_id, request_id, before,
		button FROM (SELECT *, lag(button, 1, '{}') OVER (ORDER BY version) AS before FROM history
			WHERE account = ? AND button_id = ? AND version BETWEEN ? AND ?)
		WHERE version > ? ORDER BY version`, account, id, after, after+limit+1, after)
	page, err := collect(rows, err, func(rows *sql.Rows) (e historyEntry, err error) {
		var before, after []byte
		err = rows.Scan(&e.Version, &e.Action, &e.KeyID, &e.RequestID, &before, &after)
		if err == nil {
			err = errors.Join(json.Unmarshal(before, &e.Before), json.Unmarshal(after, &e.After))
		}
		return e, err
	})
	if int64(len(page)) > limit { // the one more asked for: the page is not the last
		return page[:limit], true, err
	}
	return page, false, err
}

// writeTx is the one write transaction running.
type writeTx struct {
	*sql.Tx
	store *store
}

// begin starts a write: it waits for the write lock until ctx ends, and up to busy_timeout for
// another process.
func (s *store) begin(ctx context.Context) (writeTx, error) {
	tx, err := s.writer.BeginTx(ctx, nil)
	return writeTx{tx, s}, err
}

// create stores b as a new active button of the actor's account, and returns it as stored.
func (tx writeTx) create(who actor, b button) (button, error) {
	b.ID, b.State, b.Version, b.CreatedAt = tx.store.newButtonID(), "active", 1, now()
	b.UpdatedAt = b.CreatedAt
	return b, tx.save(who, "create", b)
}

// change updates (with edit), deletes or restores (action) the actor's button id, refusing in this
// order: no such button, If-Match (when not 0) not its version, the wrong state, edit's refusal. It
// returns the button as it leaves it, and whether it changed: an update that gives every field the
// value it has writes nothing.
func (tx writeTx) change(who actor, id string, ifMatch int64, action string,
	edit func(*button) error) (button, bool, error) {
	b, err := scanButton(tx.QueryRow(`SELECT button FROM buttons WHERE account = ? AND id = ?`,
		who.Account, id))
	if err != nil {
		return b, false, err
	}
	if ifMatch != 0 && ifMatch != b.Version {
		return b, false, errPrecondition
	}
	before := b
	switch {
	case action == "update" && b.State == "deleted":
		err = &apiError{code: codeWrongState, message: "button is deleted; restore it first"}
	case action == "delete" && b.State == "deleted":
		err = &apiError{code: codeWrongState, message: "button is already deleted"}
	case action == "restore" && b.State == "active":
		err = &apiError{code: codeWrongState, message: "button is not deleted"}
	case action == "delete":
		b.State, b.DeletedAt = "deleted", orNil(now())
	case action == "restore":
		b.State, b.DeletedAt = "active", nil
	default:
		err = edit(&b)
	}
	if err != nil || reflect.DeepEqual(b, before) {
		return before, false, err
	}
	b.Version++
	b.UpdatedAt = now()
	return b, true, tx.save(who, action, b)
}

// save writes b as the actor's action leaves it, and the same into its history.
func (tx writeTx) save(who actor, action string, b button) error {
	text, _ := json.Marshal(b)
	_, err := tx.Exec(`INSERT OR REPLACE INTO buttons
		(account, id, state, is_live, payment_method, button) VALUES (?, ?, ?, ?, ?, ?)`,
		who.Account, b.ID, b.State, b.IsLive, b.PaymentMethod, string(text))
	if err == nil {
		_, err = tx.Exec(`INSERT INTO history
			(account, button_id, version, action, key_id, request_id, button)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			who.Account, b.ID, b.Version, action, who.KeyID, who.RequestID, string(text))
	}
	return err
}

// findAnswer returns the answer kept for account's Idempotency-Key, or errNotFound; an expired one
// is none.
func (s *store) findAnswer(ctx context.Context, account, key string) (answer, error) {
	var a answer
	err := s.reader.QueryRowContext(ctx, `SELECT fingerprint, status, body, version
		FROM idempotency_keys WHERE account = ? AND key = ? AND created_at > ?`,
		account, key, expiry()).Scan(&a.Fingerprint, &a.Status, &a.Body, &a.Version)
	if errors.Is(err, sql.ErrNoRows) {
		return a, errNotFound
	}
	return a, err
}

// keepAnswer keeps a for account's Idempotency-Key in the transaction of the change it answers: a
// crash keeps both or neither. Expired answers go at the same time.
func (tx writeTx) keepAnswer(account, key string, a answer) error {
	_, err := tx.Exec(`DELETE FROM idempotency_keys WHERE created_at <= ?`, expiry())
	if err == nil {
		_, err = tx.Exec(`INSERT OR REPLACE INTO idempotency_keys
			(account, key, fingerprint, status, body, version, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			account, key, a.Fingerprint, a.Status, a.Body, a.Version, now())
	}
	return err
}

func expiry() string { return stamp(time.Now().Add(-idempotencyTTL)) }

// ping reads the database, for /healthz.
func (s *store) ping(ctx context.Context) error {
	return s.reader.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(new(int))
}

var crockford = base32.NewEncoding("0123456789ABCDEFGHJKMNPQRSTVWXYZ").WithPadding(base32.NoPadding)

// newButtonID returns "btn_" and 26 Crockford base32 digits of 128 bits: 48 of Unix milliseconds,
// then 80 random ones, so ids are unguessable and sort by time. An id made in the same millisecond
// as the one before (or after the clock stepped back) is that one plus 1: ids only grow.
func (s *store) newButtonID() string {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(time.Now().UnixMilli())<<16)
	rand.Read(raw[6:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.Compare(raw[:6], s.lastID[:6]) <= 0 {
		raw = s.lastID
		for i := len(raw) - 1; i >= 0; i-- { // add 1, carrying into the byte before
			raw[i]++
			if raw[i] != 0 {
				break
			}
		}
	}
	s.lastID = raw
	return "btn_" + crockford.EncodeToString(raw[:])
}

// validButtonID reports whether id has newButtonID's form; any other is not found, unread.
func validButtonID(id string) bool {
	digits, ok := strings.CutPrefix(id, "btn_")
	raw, err := crockford.DecodeString(digits)
	return ok && err == nil && len(raw) == 16 && crockford.EncodeToString(raw) == digits
}
