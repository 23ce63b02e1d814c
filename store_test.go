package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// longTests says whether to run the load and many-cycle tests: CI sets PAYBUTTONS_LONG_TESTS=1; a plain go test
// skips them.
func longTests(t testing.TB) {
	t.Helper()
	if os.Getenv("PAYBUTTONS_LONG_TESTS") == "" {
		t.Skip("a long test: set PAYBUTTONS_LONG_TESTS=1 to run it")
	}
}

// openTestStore opens the store at path (a new file if "") until the test ends, or fails the test.
func openTestStore(t *testing.T, path string) *store {
	t.Helper()
	st, err := openStore(cmp.Or(path, filepath.Join(t.TempDir(), "store.db")))
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	t.Cleanup(func() { st.close(false) })
	return st
}

// holdWriter keeps the writer busy until the returned release is called, so that the writes sent meanwhile wait, and
// are then committed in one batch.
func holdWriter(st *store) (release func()) {
	held, done := make(chan struct{}), make(chan struct{})
	go st.write(context.Background(), func(*writeTx) error {
		close(held)
		<-done
		return nil
	})
	<-held
	return func() { close(done) }
}

// goroutines counts the goroutines whose stack holds every one of parts.
func goroutines(parts ...string) (n int) {
	stacks := make([]byte, 1<<20)
	for _, g := range strings.Split(string(stacks[:runtime.Stack(stacks, true)]), "\n\n") {
		if !slices.ContainsFunc(parts, func(part string) bool { return !strings.Contains(g, part) }) {
			n++
		}
	}
	return n
}

// waitFor waits until done says so; after 5 s it fails t and returns.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !done(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("waited 5 s for %s", what)
			return
		}
	}
}

// A fault in one write of a batch rolls back the writes before it, and every caller gets the fault.
func TestBatchFailsAsAUnit(t *testing.T) {
	st := openTestStore(t, "")
	boom := errors.New("boom")
	release := holdWriter(st)
	results, ran := make([]error, 10), make([]bool, 10)
	var wg sync.WaitGroup
	for i := range results { // the last, queued after the others, inserts its row and fails
		wg.Go(func() {
			results[i] = st.write(context.Background(), func(tx *writeTx) error {
				_, err := tx.exec(`INSERT INTO api_keys (id, account, secret_hash, created_at) VALUES (?, 'a', ?, 'now')`,
					fmt.Sprint("key_", i), []byte(fmt.Sprint(i)))
				if ran[i] = err == nil; ran[i] && i == len(results)-1 {
					err = boom
				}
				return err
			})
		})
		// Queued in write's select on the writer's channel: the writer takes them in this order, all at once.
		waitFor(t, fmt.Sprint(i+1, " writes queued"), func() bool {
			return goroutines(" [select", ".(*store).write(", "."+t.Name()+".func") == i+1
		})
	}
	release()
	wg.Wait()
	for i, err := range results {
		if !ran[i] || !errors.Is(err, boom) {
			t.Errorf("write %d: got ran %v, error %v; want it run, then failed with the batch's fault", i, ran[i], err)
		}
	}
	var n int
	st.reader.QueryRow(`SELECT count(*) FROM api_keys`).Scan(&n)
	if n != 0 {
		t.Errorf("got %d rows after the failed batch, want none", n)
	}
}

// Every change number is above the last one given and not below the time in microseconds, also after the file is
// put back to an older copy (a restored backup): a feed client holding a number from before sees every later change.
func TestChangeSeqNeverRunsBehindTheClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seq.db")
	var last int64
	changes := func(n int) { // n numbers in one batch of a store opened on path, each checked
		st, seqs, clock := openTestStore(t, path), []int64{}, time.Now().UnixMicro()
		defer st.close(false)
		err := st.write(context.Background(), func(tx *writeTx) error {
			for range n {
				seqs = append(seqs, tx.nextChange())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, seq := range seqs {
			if seq <= last || seq < clock {
				t.Fatalf("nextChange: got %d after %d at %d µs, want above the last and the clock", seq, last, clock)
			}
			last = seq
		}
	}
	changes(1000) // more than one a microsecond
	older, err := os.ReadFile(path)
	changes(5)
	if err == nil {
		err = os.WriteFile(path, older, 0o600) // restored
	}
	if err != nil {
		t.Fatal(err)
	}
	changes(2)
}

// Button ids are well-formed and grow with time; validButtonID refuses any other shape.
func TestButtonIDsAreValidAndIncreasing(t *testing.T) {
	var g idGenerator
	prev := ""
	for range 10000 {
		id := g.next()
		if !validButtonID(id) || id <= prev {
			t.Fatalf("got %q after %q, want a valid id greater than the last", id, prev)
		}
		prev = id
	}
	for _, bad := range []string{"", "btn_", "btn_01JD00000000000000000000", "btn_01JD000000000000000000000U",
		"btn_81JD0000000000000000000000", "BTN_01JD0000000000000000000000", "btn_01jd0000000000000000000000"} {
		if validButtonID(bad) {
			t.Errorf("validButtonID(%q) = true, want false", bad)
		}
	}
}

// Under steady writes with reads beside them the WAL keeps starting over, not growing with every write.
func TestWALStaysSmallUnderReadsAndWrites(t *testing.T) {
	longTests(t) // a checkpointer on another connection once let it reach 250 MB in 12 s
	st := openTestStore(t, "")
	var readers, writers sync.WaitGroup
	var stop atomic.Bool
	for range 4 {
		readers.Go(func() {
			for !stop.Load() {
				st.listButtons(context.Background(), "acme", listFilter{Limit: 5, State: "all"})
			}
		})
	}
	for w := range 16 {
		writers.Go(func() {
			for i := range 1250 {
				b := baseButton
				b.ProductName = fmt.Sprint("w", w, "-", i)
				if _, err := st.createButton(context.Background(), actor{Account: "acme", KeyID: "key_x"}, b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	stop.Store(true)
	readers.Wait()
	info, err := os.Stat(st.path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// The writer checkpoints at 4000 pages (16 MB); a checkpoint that readers keep from finishing lets it pass that
	// for a while (25 MB seen); a WAL that never starts over passes 80 MB here.
	if t.Logf("WAL after 20,000 creates: %.1f MB", float64(info.Size())/(1<<20)); info.Size() > 48<<20 {
		t.Errorf("got a WAL of %d MB after 20,000 creates, want it to stay near 16 MB", info.Size()>>20)
	}
}

// A key's last use is written in the background, at most once a minute, so that reads do not each cost a write.
func TestLastUsedIsWrittenOnceAMinute(t *testing.T) {
	st := openTestStore(t, "")
	secret, id, err := st.createKey(context.Background(), "acme", false)
	if err != nil {
		t.Fatal(err)
	}
	var first, again sql.NullString
	lastUsed := func(v *sql.NullString) bool {
		st.reader.QueryRow(`SELECT last_used_at FROM api_keys WHERE id = ?`, id).Scan(v)
		return v.Valid
	}
	for range 2 {
		if _, _, err = st.authenticate(context.Background(), sha256.Sum256([]byte(secret)), ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a use's last_used_at", func() bool { return lastUsed(&first) })
	}
	waitFor(t, "no write of last_used_at under way", func() bool { return goroutines("noteKeyUsed") == 0 })
	if writes := st.committed.Load(); lastUsed(&again) && again != first || writes != 2 {
		t.Errorf("two uses: got last_used_at %v then %v, %d writes with the key's; want it written once", first.String,
			again.String, writes)
	}
}

// Closing a store closes every connection it opened, prepared statements' too: SQLite then removes the WAL.
func TestCloseLeavesNoConnectionOpen(t *testing.T) {
	// One left open made a server started after a crash trust the dead one's WAL index and lose its last committed
	// transaction (the crash test found it).
	st := openTestStore(t, "")
	if _, _, err := st.createKey(context.Background(), "acme", false); err != nil {
		t.Fatal(err)
	}
	if keys, err := st.listKeys(context.Background()); err != nil || len(keys) != 1 {
		t.Fatalf("listKeys: got %v, %v", keys, err)
	}
	if err := st.close(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(st.path + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %s-wal after close (%v), want it removed with the last connection", st.path, err)
	}
}
