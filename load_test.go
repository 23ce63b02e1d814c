package main

// Load measurements; docs/load.md gives the commands and the figures. Each requirement is only logged, as
// "(<requirement>: true|false)": the machine is shared and noisy. Asserted: every answer, and a few wide bounds.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// insertButtons gives account n buttons by SQL (every 100th deleted, half live, all Stripe) and returns their ids.
func insertButtons(tb testing.TB, st *store, account string, n int) (ids []string) {
	for start := 0; start < n; start += 10_000 {
		if err := st.write(context.Background(), func(tx *writeTx) (err error) {
			for i := start; i < min(n, start+10_000) && err == nil; i++ {
				at := now()
				b := button{ID: st.ids.next(), Account: account, ProductName: "Widget", Description: "A widget",
					AmountMinor: 1990, Currency: "USD", PaymentMethod: "Stripe", PaymentType: "one_time", IsLive: i%2 == 0,
					State: stateActive, Version: 1, Metadata: metadata{"orderRef": fmt.Sprint("A-", i), "team": "web"},
					CreatedAt: at, UpdatedAt: at}
				if i%100 == 0 {
					b.State, b.DeletedAt = stateDeleted, at
				}
				ids = append(ids, b.ID)
				_, err = tx.exec(`INSERT INTO buttons (id, account, `+buttonFields+`, created_key_id, created_request_id, change_seq)
					VALUES (?, ?, `+fieldPlaceholders+`, 'key_load', 'req_load', ?)`,
					append(append([]any{b.ID, b.Account}, fieldValues(b)...), tx.nextChange())...)
			}
			return err
		}); err != nil {
			tb.Fatalf("insert buttons %d..: %v", start, err)
		}
	}
	return ids
}

// fetch sends GET url with key and reads the answer to its end.
func fetch(client *http.Client, url, key string) (status int, n int64, err error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-API-KEY", key)
	resp, err := client.Do(req)
	if err == nil {
		n, err = io.Copy(io.Discard, resp.Body)
		status = resp.StatusCode
		resp.Body.Close()
	}
	return status, n, err
}

// checkPage fails tb unless GET url answers 200 (as documented) and, for items >= 0, a page of items and hasMore.
func checkPage(tb testing.TB, url, key string, items int, hasMore bool) {
	tb.Helper()
	r, err := callAPI(http.DefaultClient, "GET", url, key, "")
	var data page[json.RawMessage, any]
	if json.Unmarshal(r.env.Data, &data); err != nil || r.status != 200 ||
		items >= 0 && (len(data.Items) != items || data.HasMore != hasMore) {
		tb.Fatalf("%s: got %d (%v), %d items, hasMore %v; want 200, %d, %v", r.request, r.status, err, len(data.Items), data.HasMore, items, hasMore)
	}
}

// latencies are request durations in no order; at is the q-quantile (0.99 for p99).
type latencies []time.Duration

func (l latencies) at(q float64) time.Duration {
	s := slices.Sorted(slices.Values(l))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (l latencies) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(l), r(l.at(.5)), r(l.at(.99)), r(l.at(1)))
}

// quietThenLoaded times GET url with key, one at a time for PAYBUTTONS_LOAD_SECONDS (5), alone, then while 32 workers
// loop GET load(worker); it logs the load's answers. It fails t on an answer to url but 200, or to the load not in want.
func quietThenLoaded(t *testing.T, url, key string, load func(worker int) (url, key string), want ...int) (quiet, loaded latencies) {
	secs, _ := strconv.Atoi(os.Getenv("PAYBUTTONS_LOAD_SECONDS"))
	phase := time.Duration(cmp.Or(max(secs, 0), 5)) * time.Second
	client, loadClient := &http.Client{Transport: &http.Transport{}}, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	mu, wg, answers, bytes := sync.Mutex{}, sync.WaitGroup{}, map[int]int{}, int64(0)
	gets := func(c *http.Client, end time.Time, url, key string, want ...int) (l latencies) {
		for start := time.Now(); start.Before(end) && !t.Failed(); start = time.Now() {
			status, n, err := fetch(c, url, key)
			if err != nil || !slices.Contains(want, status) {
				t.Errorf("GET %s: got %d (%v), want one of %v", url, status, err, want)
			}
			if l = append(l, time.Since(start)); c == loadClient {
				mu.Lock()
				answers[status], bytes = answers[status]+1, bytes+n
				mu.Unlock()
			}
		}
		return l
	}
	quiet = gets(client, time.Now().Add(phase), url, key, 200)
	end := time.Now().Add(phase)
	for w := range 32 {
		wg.Go(func() { url, key := load(w); gets(loadClient, end, url, key, want...) })
	}
	loaded = gets(client, end, url, key, 200)
	wg.Wait()
	t.Logf("the load's answers in %v by status: %v; %.1f MB/s", phase, answers, float64(bytes)/phase.Seconds()/1e6)
	return quiet, loaded
}

// BenchmarkListFlat times list pages and get over HTTP in an account of 10k, 100k and (PAYBUTTONS_LOAD_1M=1) 1M buttons.
func BenchmarkListFlat(b *testing.B) {
	for i, name := range []string{"10k", "100k", "1M"} {
		n := []int{1e4, 1e5, 1e6}[i]
		b.Run(name, func(b *testing.B) {
			if n > 100_000 && os.Getenv("PAYBUTTONS_LOAD_1M") == "" {
				b.Skip("set PAYBUTTONS_LOAD_1M=1 to fill an account with 1M buttons")
			}
			e, start := newTestServer(b), time.Now()
			middle := insertButtons(b, e.store, "acme", n)[n/2+1] // active: every 100th is deleted
			b.Logf("%d buttons inserted in %v", n, time.Since(start).Round(time.Millisecond))
			for _, c := range []struct {
				name, path string
				items      int // on the page; -1 for get
			}{{"first-page", "list", 20}, {"deep-cursor", "list?state=all&after=" + middle, 20},
				{"state=deleted", "list?state=deleted", 20}, {"paymentMethod-no-match", "list?state=all&paymentMethod=StripeConnect", 0},
				{"metadata-no-match", "list?metadata%5Bteam%5D=nobody", 0}, {"get", "get/" + middle, -1}} {
				b.Run(c.name, func(b *testing.B) {
					url := e.url + "/product-payment/" + c.path
					checkPage(b, url, e.key, c.items, true)
					for b.Loop() {
						benchRequest(b, "GET", url, e.key, "")
					}
				})
			}
		})
	}
}

// TestLoadBadKeyFlood: 32 goroutines send get with unknown keys as fast as they are answered while a client with a
// valid key loops get from the same address. Requirement: its p99 within 2x of quiet. Asserted: the flood gets 401 or 429.
func TestLoadBadKeyFlood(t *testing.T) {
	longTests(t)
	e := newTestServer(t)
	get := e.url + "/product-payment/get/" + e.create(e.key, createBody(nil))
	quiet, during := quietThenLoaded(t, get, e.key, func(w int) (string, string) { return get, fmt.Sprintf("pbk_flood%d", w) }, 401, 429)
	ratio := float64(during.at(.99)) / float64(quiet.at(.99))
	t.Logf("valid key's get, quiet: %v; during the flood: %v (p99 %.1fx quiet; within 2x: %v)", quiet, during, ratio, ratio <= 2)
}

// loadChild serves a new database with flags in a child process that may open files files (or skips t).
func loadChild(t *testing.T, files uint64, flags ...string) (*childServer, *testEnv) {
	var lim syscall.Rlimit // Go raised this process's to the hard limit; setting it passes it on to the child
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) != nil || lim.Cur < files {
		t.Skipf("needs %d open files, the limit is %d: raise it with ulimit -n", files, lim.Cur)
	}
	dbPath := t.TempDir() + "/load.db"
	key := mintKeyCLI(t, dbPath, "acme")
	child := startChild(t, dbPath, flags...)
	return child, &testEnv{t: t, url: child.url, key: key}
}

// rssMB is the child's resident memory in MB, or skips t.
func rssMB(t *testing.T, c *childServer) (mb float64) {
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", c.cmd.Process.Pid))
	if _, scanErr := fmt.Sscan(string(statm), new(int), &mb); err != nil || scanErr != nil {
		t.Skipf("needs /proc/PID/statm: %v %v", err, scanErr)
	}
	return mb * float64(os.Getpagesize()) / (1 << 20)
}

type sent struct { // what one request on a connection of its own got, and when
	status int
	body   string
	at     time.Time
	err    error
}

// sendEach opens n connections to addr, one after the other, and sends GET path with key on each, keep-alive. It
// returns a channel that gets every answer, and closeAll, which t's end calls too.
func sendEach(t *testing.T, addr, path, key string, n int) (<-chan sent, func()) {
	conns, answers := []net.Conn{}, make(chan sent, n)
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(closeAll)
	for range n {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", len(conns)+1, n, err)
		}
		conns = append(conns, conn)
		_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nX-API-KEY: %s\r\n\r\n", path, addr, key)
		go func() {
			resp, readErr := http.ReadResponse(bufio.NewReader(conn), nil) // fails at once if the write did
			a := sent{err: cmp.Or(err, readErr)}
			if a.err == nil {
				body, err := io.ReadAll(resp.Body)
				a.status, a.body, a.at, a.err = resp.StatusCode, string(body), time.Now(), err
			}
			answers <- a
		}()
	}
	return answers, closeAll
}

// TestLoadIdleConnectionFlood holds 3,000 idle keep-alive connections to a server with the default -max-conns 1024.
// Asserted: at most 1024 served, under 60 MB more (3,000 would cost ~80), served again once they are closed.
func TestLoadIdleConnectionFlood(t *testing.T) {
	longTests(t)
	child, e := loadChild(t, 3500)
	list := e.url + "/product-payment/list"
	checkPage(t, list, e.key, 0, false)
	http.DefaultClient.CloseIdleConnections()
	before, statuses := rssMB(t, child), map[int]int{} // 0: closed unanswered
	answers, closeAll := sendEach(t, child.addr, "/healthz", "", 3000)
	for range 3000 {
		statuses[(<-answers).status]++
	}
	time.Sleep(time.Second)
	after, served := rssMB(t, child), 3000-statuses[0]
	t.Logf("3000 idle connections: %d served and held (by status, 0 closed unanswered: %v); server RSS %.1f MB before, %.1f MB with them (+%.1f MB)",
		served, statuses, before, after, after-before)
	if served > 1024 || after-before >= 60 {
		t.Errorf("got %d connections served and %.1f MB more, want at most 1024 and under 60 MB", served, after-before)
	}
	status, _, err := fetch(http.DefaultClient, list, e.key)
	t.Logf("a new client while they are held: status %d, error %v", status, err)
	closeAll()
	for deadline, ok := time.Now().Add(5*time.Second), false; !ok; time.Sleep(50 * time.Millisecond) {
		status, _, err = fetch(http.DefaultClient, list, e.key)
		if ok = err == nil && status == 200; !ok && time.Now().After(deadline) {
			t.Fatalf("5 s after the idle connections closed: got %d (%v), want 200", status, err)
		}
	}
}
