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
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// --- the model every file shares ---

// The error codes a client branches on, and the HTTP status each is sent with.
const (
	codeInvalid          = "invalid_request"
	codeUnauthorized     = "unauthorized"
	codeForbidden        = "forbidden"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeWrongState       = "wrong_state"
	codePrecondition     = "precondition_failed"
	codeTooLarge         = "payload_too_large"
	codeMediaType        = "unsupported_media_type"
	codeInternal         = "internal"
	codeUnavailable      = "unavailable"
)

var statusOf = map[string]int{
	codeInvalid: 400, codeUnauthorized: 401, codeForbidden: 403, codeNotFound: 404,
	codeMethodNotAllowed: 405, codeWrongState: 409, codePrecondition: 412, codeTooLarge: 413,
	codeMediaType: 415, codeInternal: 500, codeUnavailable: 503,
}

// apiError is a failure the client is told about: a code, a message for people and, for
// invalid_request, every failing field with the reason. cause is logged but never sent. Any other
// error is a fault, answered with a 500.
type apiError struct {
	code    string
	message string
	fields  map[string]string
	cause   error
}

func (e *apiError) Error() string { return e.message }

var (
	errNotFound     = &apiError{code: codeNotFound, message: "no such button"}
	errUnknownKey   = &apiError{code: codeUnauthorized, message: "the API key is not valid"}
	errPrecondition = &apiError{code: codePrecondition,
		message: "the button has changed since the version in If-Match; get it again"}
)

// button is one payment button. The API shows it as this JSON, and the database stores the same
// JSON. An optional value that is absent is nil, shown as null.
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
	Fee             *string           `json:"ApplicationFeePercentage"` // the contract's: "2.50"
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`   // active or deleted
	Version         int64             `json:"version"` // 1 at create, one more with every change
	CreatedAt       string            `json:"createdAt"`
	UpdatedAt       string            `json:"updatedAt"`
	DeletedAt       *string           `json:"deletedAt"`
}

// apiKey is a key's record; only the SHA-256 of its secret is stored.
type apiKey struct {
	ID, Account          string
	ReadOnly             bool // may read buttons, never change them
	CreatedAt, RevokedAt string
}

// listQuery selects a page of an account's buttons, newest first.
type listQuery struct {
	Limit         int
	After         string // the last id of the page before, or ""
	State         string // active, deleted or all
	IsLive        *bool  // nil for either
	PaymentMethod string // "" for any
}

// --- the storage API ---
//
// Reads (authenticate, get, list, listKeys, ping) use the reader connections; in WAL mode a read
// never waits for a write. Writes (create, change, createKey, revokeKey) run one at a time, each in
// its own transaction, which is on disk before the call returns. A refusal is an *apiError.

const applicationID = 0x70627574 // "pbut": PRAGMA application_id of every paybuttons database

// schema is the whole database, made at the first start.
const schema = `
CREATE TABLE api_keys (
	id          TEXT PRIMARY KEY,
	account     TEXT NOT NULL,
	secret_hash BLOB NOT NULL UNIQUE,
	read_only   INTEGER NOT NULL,
	created_at  TEXT NOT NULL,
	revoked_at  TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE buttons (
	account        TEXT NOT NULL,
	id             TEXT NOT NULL,
	state          TEXT NOT NULL, -- the fields of the button that list filters on
	is_live        INTEGER NOT NULL,
	payment_method TEXT NOT NULL,
	version        INTEGER NOT NULL, -- and the one get sends as the ETag
	button         TEXT NOT NULL, -- the button, as JSON: get sends it as it is
	PRIMARY KEY (account, id)
) STRICT;
-- A list reads the rows of one state, newest first, from this index; state=all reads the primary
-- key. A filter on is_live or payment_method is checked on those rows.
CREATE INDEX buttons_by_state ON buttons (account, state, id);`

// store is the SQLite file. It has one writer connection, so writes queue for it, and a pool of
// reader connections.
type store struct {
	writer, reader *sql.DB
	// The statements every request and every get run, prepared once so SQLite parses them once.
	keyBySecret, buttonByID *sql.Stmt
	writeWait               time.Duration // how long a write may wait for its turn: 5 s
}

// openStore opens the database file at path, and makes it a paybuttons database if it is new. When
// there is no file, it fails unless create is set. It also fails for another program's file, for a
// file this process cannot write, and for any schema version other than 1.
func openStore(path string, create bool) (*store, error) {
	if err := checkFile(path, create); err != nil {
		return nil, err
	}
	// synchronous=FULL puts a write on disk before it is answered. _txlock=immediate makes a write
	// take the write lock at BEGIN, and wait there (busy_timeout) while another process writes.
	// Readers have a pool of their own, so a read never waits for the writer connection.
	writer, _ := sql.Open("sqlite", sqliteURI(path,
		"_pragma=busy_timeout(5000)&_pragma=synchronous(FULL)&_txlock=immediate"))
	writer.SetMaxOpenConns(1)
	reader, _ := sql.Open("sqlite", sqliteURI(path, "_pragma=busy_timeout(5000)"))
	reader.SetMaxOpenConns(4) // each has its own page cache; four keep two cores busy
	reader.SetMaxIdleConns(4)
	s := &store{writer: writer, reader: reader, writeWait: 5 * time.Second}
	err := s.createSchema()
	if err == nil {
		s.keyBySecret, err = reader.Prepare(`SELECT id, account, read_only
			FROM api_keys WHERE secret_hash = ? AND revoked_at = ''`)
	}
	if err == nil {
		s.buttonByID, err = reader.Prepare(`SELECT version, button FROM buttons
			WHERE account = ? AND id = ?`)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("database %q: %w", path, err)
	}
	return s, nil
}

// createSchema makes the schema in a new file, and refuses a file that is not a paybuttons
// database of this version. It refuses another program's file before it changes anything in it.
func (s *store) createSchema() error {
	if _, err := identify(s.writer); err != nil {
		return err
	}
	// WAL mode lets reads go on during a write, and the file keeps it. While another process writes
	// a file that is not in WAL mode yet, the switch fails with BUSY at once (busy_timeout does not
	// apply), so it is retried for up to 5 s.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := s.writer.Exec("PRAGMA journal_mode = WAL")
		if err == nil {
			break
		} else if sqliteCode(err) != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
	}
	// Read the file again under the write lock: when two processes open a new file at once, one
	// makes the schema and the other finds it.
	tx, err := s.writer.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	isNew, err := identify(tx)
	if err == nil && isNew {
		_, err = tx.Exec(schema)
	}
	if err == nil { // written even when already set, so a file this process cannot write fails here
		_, err = tx.Exec(fmt.Sprintf("PRAGMA application_id = %d; PRAGMA user_version = 1",
			applicationID))
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

// identify reports whether the file is new: it has no application_id, no user_version and no
// table but Litestream's (Litestream may start on a file first). It refuses a file that is neither
// new nor a paybuttons database of schema version 1.
func identify(db interface{ QueryRow(string, ...any) *sql.Row }) (isNew bool, err error) {
	var app, version, tables int
	err = db.QueryRow(`SELECT (SELECT application_id FROM pragma_application_id),
		(SELECT user_version FROM pragma_user_version),
		(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE '\_litestream%' ESCAPE '\')`).
		Scan(&app, &version, &tables)
	switch {
	case err != nil:
		return false, err
	case app == 0 && version == 0 && tables == 0:
		return true, nil
	case app != applicationID:
		return false, errors.New("not a paybuttons database (another program's SQLite file)")
	case version != 1:
		return false, fmt.Errorf("schema version %d; this paybuttons knows only 1", version)
	}
	return false, nil
}

// openToRead opens the paybuttons database at path read-only, for a command that only reads it.
// It works while a server runs, and on a file this process may not write.
func openToRead(path string) (*sql.DB, error) {
	if err := checkFile(path, false); err != nil {
		return nil, err
	}
	db, _ := sql.Open("sqlite", sqliteURI(path, "mode=ro&_pragma=busy_timeout(5000)"))
	isNew, err := identify(db)
	if isNew {
		err = errors.New("not a paybuttons database (it has no schema)")
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("database %q: %w", path, err)
	}
	return db, nil
}

// checkFile refuses a path whose directory does not exist, and a missing file unless create is set.
func checkFile(path string, create bool) error {
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return fmt.Errorf("database directory %q does not exist", filepath.Dir(path))
	} else if _, err := os.Stat(path); err != nil && !create {
		return fmt.Errorf("no database at %q", path)
	}
	return nil
}

// close closes every connection and the statements prepared on them. The last connection to close
// copies the WAL into the database file, unless another process (Litestream, say) has it open.
func (s *store) close() error { return errors.Join(s.reader.Close(), s.writer.Close()) }

// sqliteURI names the file at path for the driver, escaped so that '?', '#' and '%' stay part of
// the name.
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

// marshal is v as JSON, as encoding/json writes it but with no HTML escaping, so that "<" stays
// one byte, not six. The JSON stored and sent holds text as the client gave it; a page that puts
// it into HTML escapes it there. Every value marshalled here can be, so there is no error.
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// now is the time every stored timestamp uses: RFC 3339 in UTC, with milliseconds, so the text
// sorts in time order.
func now() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

// --- keys ---

// createKey makes a key for account and returns its secret (shown only this once) and its id.
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

// listKeys returns every key of db, revoked ones too, oldest first.
func listKeys(ctx context.Context, db *sql.DB) ([]apiKey, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, account, read_only, created_at, revoked_at
		FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []apiKey
	for rows.Next() {
		var k apiKey
		err := rows.Scan(&k.ID, &k.Account, &k.ReadOnly, &k.CreatedAt, &k.RevokedAt)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
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
// decides whether a key is live. It asks the database every time, so a key that another process
// revokes stops working at its next request.
func (s *store) authenticate(ctx context.Context, secret string) (apiKey, error) {
	hash := sha256.Sum256([]byte(secret))
	var k apiKey
	err := s.keyBySecret.QueryRowContext(ctx, hash[:]).Scan(&k.ID, &k.Account, &k.ReadOnly)
	if errors.Is(err, sql.ErrNoRows) {
		return k, errUnknownKey
	}
	return k, err
}

// --- buttons ---

// get returns account's button id, deleted or not, as its JSON, and its version.
func (s *store) get(ctx context.Context, account, id string) (json.RawMessage, int64, error) {
	var text []byte
	var version int64
	err := s.buttonByID.QueryRowContext(ctx, account, id).Scan(&version, &text)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, errNotFound
	}
	return text, version, err
}

// list returns a page of account's buttons, newest first, as their JSON, and the id of its last
// button when more follow ("" on the last page). A page holds at most q.Limit buttons and at most
// maxPage bytes of them, but always one, so that no answer grows without bound.
func (s *store) list(ctx context.Context, account string, q listQuery) (page []json.RawMessage,
	next string, err error) {
	query, args := q.sql(account)
	rows, err := s.reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	page, size := []json.RawMessage{}, 0
	for rows.Next() { // the query asks for one row more than the page: when it comes, more follow
		var id string
		var text []byte
		if err := rows.Scan(&id, &text); err != nil {
			return nil, "", err
		}
		size += len(text)
		if len(page) == q.Limit || (len(page) > 0 && size > maxPage) {
			return page, next, nil
		}
		page, next = append(page, text), id
	}
	return page, "", rows.Err()
}

const maxPage = 256 << 10 // bytes of buttons in a list page

// sql returns the query for a page of account's buttons, and its arguments. Ids never change, so
// paging by "id < after" never skips or repeats a button.
func (q listQuery) sql(account string) (string, []any) {
	query, args := `SELECT id, button FROM buttons WHERE account = ?`, []any{account}
	where := func(condition string, arg any) {
		query += " AND " + condition
		args = append(args, arg)
	}
	if q.After != "" {
		where("id < ?", q.After)
	}
	if q.State != "all" {
		where("state = ?", q.State)
	}
	if q.IsLive != nil {
		where("is_live = ?", *q.IsLive)
	}
	if q.PaymentMethod != "" {
		where("payment_method = ?", q.PaymentMethod)
	}
	return query + " ORDER BY id DESC LIMIT ?", append(args, q.Limit+1)
}

// create stores b as a new active button of account, and returns it as stored.
func (s *store) create(ctx context.Context, account string, b button) (button, error) {
	b.ID, b.State, b.Version, b.CreatedAt = newButtonID(), "active", 1, now()
	b.UpdatedAt = b.CreatedAt
	return b, s.write(ctx, func(tx *sql.Tx) error { return save(tx, account, b) })
}

// change runs edit on account's button id, in one write. It refuses, in this order: a button that
// does not exist; an ifMatch other than the button's version (0 matches any); whatever edit
// refuses. It returns the button as it leaves it, and whether it changed. When edit changes
// nothing, nothing is written.
func (s *store) change(ctx context.Context, account, id string, ifMatch int64,
	edit func(*button) error) (b button, changed bool, err error) {
	err = s.write(ctx, func(tx *sql.Tx) error {
		var text []byte
		err := tx.QueryRow(`SELECT button FROM buttons WHERE account = ? AND id = ?`, account, id).
			Scan(&text)
		if errors.Is(err, sql.ErrNoRows) {
			return errNotFound
		} else if err != nil {
			return err
		}
		if err := json.Unmarshal(text, &b); err != nil {
			return err
		}
		if ifMatch != 0 && ifMatch != b.Version {
			return errPrecondition
		}
		before := marshal(b)
		if err := edit(&b); err != nil {
			return err
		}
		if changed = !bytes.Equal(before, marshal(b)); !changed {
			return nil
		}
		b.Version++
		b.UpdatedAt = now()
		return save(tx, account, b)
	})
	return b, changed, err
}

// save writes b, new or changed, into account's buttons.
func save(tx *sql.Tx, account string, b button) error {
	text := marshal(b)
	_, err := tx.Exec(`INSERT OR REPLACE INTO buttons
		(account, id, state, is_live, payment_method, version, button)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		account, b.ID, b.State, b.IsLive, b.PaymentMethod, b.Version, string(text))
	return err
}

// write runs fn in its own transaction and commits it, all within writeWait. In that time the
// write waits for its turn twice: first for the one writer connection, which this server's other
// writes may hold; then, at BEGIN, for another process's write (busy_timeout, a wait the driver
// ends when ctx does). If the time runs out or the disk is full, write returns a 503 *apiError and
// nothing fn wrote is stored. So no write commits after its client has stopped waiting.
func (s *store) write(ctx context.Context, fn func(*sql.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeWait)
	defer cancel()
	tx, err := s.writer.BeginTx(ctx, nil)
	if err == nil {
		defer tx.Rollback()
		err = fn(tx)
	}
	if err == nil {
		err = tx.Commit()
	}
	switch code := sqliteCode(err); {
	case err == nil || errors.As(err, new(*apiError)):
		return err
	case code == sqlite3.SQLITE_FULL:
		return &apiError{code: codeUnavailable, message: "the disk is full; retry later",
			cause: err}
	case code == sqlite3.SQLITE_BUSY || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &apiError{code: codeUnavailable, message: "the database is busy; retry shortly",
			cause: err}
	}
	return err
}

// ping reads the database, for /healthz.
func (s *store) ping(ctx context.Context) error {
	return s.reader.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(new(int))
}

var crockford = base32.NewEncoding("0123456789ABCDEFGHJKMNPQRSTVWXYZ").WithPadding(base32.NoPadding)

// newButtonID returns "btn_" and 26 Crockford base32 digits of 128 bits: 48 bits of Unix
// milliseconds, then 80 from crypto/rand. Ids sort by the millisecond they were made in, and none
// can be worked out from another.
func newButtonID() string {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(time.Now().UnixMilli())<<16) // bytes 0 to 5
	rand.Read(raw[6:])
	return "btn_" + crockford.EncodeToString(raw[:])
}

// validButtonID reports whether id has newButtonID's form.
func validButtonID(id string) bool {
	digits, ok := strings.CutPrefix(id, "btn_")
	raw, err := crockford.DecodeString(digits)
	return ok && err == nil && len(raw) == 16 && crockford.EncodeToString(raw) == digits
}
