package examples

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Under a list load that once took it past 2 GB, the server stays under 60 MB: 30 buttons of
// 45 KB, 48 clients listing them with limit=100 for 15 s, and 16 more sending the same request
// without reading the answers. A long test (PAYBUTTONS_LONG_TESTS=1), on Linux, whose /proc gives
// the peak memory.
func TestMemoryUnderListLoad(t *testing.T) {
	if os.Getenv("PAYBUTTONS_LONG_TESTS") != "1" || runtime.GOOS != "linux" {
		t.Skip("a long test, on Linux: PAYBUTTONS_LONG_TESTS=1")
	}
	srv := startServer(t)
	key := srv.newKey(t, "shop")
	var metadata []string
	for i := range 50 {
		metadata = append(metadata, fmt.Sprintf(`"key%d":"%s"`, i, strings.Repeat("<é", 250)))
	}
	body := `{"productName":"P","description":"` + strings.Repeat("€", 2500) + `","amount":"1",
		"currency":"USD","paymentMethod":"Stripe","paymentType":"one_time","isLive":false,
		"metadata":{` + strings.Join(metadata, ",") + `}}`
	for range 30 {
		if status := call(t, srv.url+"/product-payment/create", key, body); status != 200 {
			t.Fatalf("create: got %d", status)
		}
	}
	list, stop := "/product-payment/list?limit=100", time.Now().Add(15*time.Second)
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if status := call(t, srv.url+list, key, ""); status != 200 {
					t.Errorf("list: got %d", status)
					return
				}
			}
		})
	}
	for range 16 { // their requests pile up, and no answer is read
		wg.Go(func() {
			conn, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
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
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", srv.pid))
	peak := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)
	if err != nil || peak == nil {
		t.Fatalf("read the server's memory: %v", err)
	}
	kB, _ := strconv.Atoi(string(peak[1]))
	t.Logf("the server's peak memory (VmHWM): %d MB", kB>>10)
	if kB >= 60<<10 {
		t.Errorf("the server's peak memory: got %d MB, want under 60", kB>>10)
	}
}

// call sends a request with key and reads the whole answer; it returns the status, or 0.
func call(t *testing.T, url, key, body string) int {
	method := map[bool]string{true: "GET", false: "POST"}[body == ""]
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
