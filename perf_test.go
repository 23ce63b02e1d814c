package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The speed of get and create over HTTP on loopback, against the ceiling: the same requests
// answered with no database, by a handler that reads the body as JSON and sends an answer as long
// as the real one. 64 clients at once; the metric "ratio" is the server's rate over the ceiling's.
//
//	go test -run '^$' -bench .
func BenchmarkGet(b *testing.B) {
	e := newTestServer(b)
	id := e.create(e.key, createBody(m{"metadata": m{"orderRef": "A-17"}}))
	benchmarkAgainstCeiling(b, e, "GET", "/product-payment/get/"+id, "")
}

func BenchmarkCreate(b *testing.B) {
	benchmarkAgainstCeiling(b, newTestServer(b), "POST", "/product-payment/create",
		createBody(nil))
}

func benchmarkAgainstCeiling(b *testing.B, e *testEnv, method, path, body string) {
	answer := e.do(method, path, e.key, body)
	answer.want(b, 200, "")
	ceiling := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v any
		text, _ := io.ReadAll(r.Body)
		json.Unmarshal(text, &v)
		for name := range answer.header {
			w.Header().Set(name, answer.header.Get(name))
		}
		w.Write(answer.raw)
	}))
	defer ceiling.Close()
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	measure := func(url string) time.Duration {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := callAPI(client, method, url+path, e.key, body)
				if err != nil || r.status != 200 {
					b.Errorf("%s: got %d %s (%v)", r.request, r.status, r.raw, err)
					return
				}
			}
		})
		return time.Since(start)
	}
	ceilingTime, serverTime := measure(ceiling.URL), measure(e.url)
	b.ReportMetric(float64(serverTime.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(ceilingTime.Seconds()/serverTime.Seconds(), "ratio")
}

// Under the load an attacker used, the server stays under 60 MB: 30 buttons of 45 KB, 48 clients
// listing them with limit=100 for 15 s, and 16 more sending the same request without reading the
// answers. A long test (PAYBUTTONS_LONG_TESTS=1), on Linux, whose /proc gives the peak memory.
func TestMemoryUnderListLoad(t *testing.T) {
	if os.Getenv("PAYBUTTONS_LONG_TESTS") != "1" || runtime.GOOS != "linux" {
		t.Skip("a long test, on Linux: PAYBUTTONS_LONG_TESTS=1")
	}
	t.Parallel()
	db := t.TempDir() + "/memory.db"
	key, _, _ := runCLI(t, nil, 0, "keys", "create", "-account", "a", "-db", db)
	key = strings.TrimSpace(key)
	c := startChild(t, db)
	metadata := m{}
	for i := range 50 {
		metadata[fmt.Sprint("key", i)] = strings.Repeat("<é", 250)
	}
	body := createBody(m{"description": strings.Repeat("€", 2500), "metadata": metadata})
	for range 30 { // with "<" as it is, not as Go escapes it
		(&testEnv{t: t, url: c.url}).create(key, strings.ReplaceAll(body, `\u003c`, "<"))
	}
	list, stop := "/product-payment/list?limit=100", time.Now().Add(15*time.Second)
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r, err := callAPI(http.DefaultClient, "GET", c.url+list, key, "")
				expect(t, err == nil && r.status == 200, "%s: got %d (%v)", r.request, r.status, err)
			}
		})
	}
	for range 16 { // their requests pile up, and no answer is read
		wg.Go(func() {
			conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
			expect(t, err == nil, "%v", err)
			for err == nil && time.Now().Before(stop) {
				conn.SetWriteDeadline(stop)
				_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n\r\n",
					list, key)
			}
			if conn != nil {
				conn.Close()
			}
		})
	}
	wg.Wait()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	peak := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)
	require(t, err == nil && peak != nil, "read the server's memory: %v", err)
	kB, _ := strconv.Atoi(string(peak[1]))
	t.Logf("the server's peak memory (VmHWM): %d MB", kB>>10)
	expect(t, kB < 60<<10, "the server's peak memory: got %d MB, want under 60", kB>>10)
}
