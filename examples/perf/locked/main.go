// Command locked measures paybuttons while another process holds its database's write lock: 64
// connections of gets and 8 of creates for -d (20 s), the server's memory sampled every second, then
// how long the first create takes once the lock goes. It exits 1 when the server grew past -max-rss
// (60 MB), a get failed, a create was stored or answered other than 503, or the first create after
// the lock took a second or more.
//
//	cd examples/perf/locked && go run . -repo ../../..
package main

import (
	"bytes"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite"
)

const body = `{"productName":"Pro plan","amount":"19.90","currency":"USD","paymentMethod":"Stripe",` +
	`"paymentType":"one_time","isLive":false}`

func main() {
	repo := flag.String("repo", "../../..", "the paybuttons repository")
	duration := flag.Duration("d", 20*time.Second, "how long the lock is held under load")
	maxRSS := flag.Int("max-rss", 60, "the most the server may hold, in MB")
	flag.Parse()
	if err := measure(*repo, *duration, *maxRSS); err != nil {
		fmt.Println("locked: FAIL:", err)
		os.Exit(1)
	}
}

func measure(repo string, duration time.Duration, maxRSS int) error {
	dir, err := os.MkdirTemp("", "locked")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, db := filepath.Join(dir, "paybuttons"), filepath.Join(dir, "locked.db")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v\n%s", err, out)
	}
	key, err := exec.Command(bin, "keys", "create", "-account", "perf", "-db", db).Output()
	if err != nil {
		return fmt.Errorf("keys create: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	server := exec.Command(bin, "serve", "-db", db, "-addr", addr)
	if err := server.Start(); err != nil {
		return err
	}
	defer server.Process.Kill()
	url := "http://" + addr + "/product-payment/"
	call := func(method, path string, payload string) (int, string) {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(payload))
		req.Header.Set("X-API-KEY", strings.TrimSpace(string(key)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		text, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(text)
	}
	status, answer := 0, ""
	for start := time.Now(); status != 200 && time.Since(start) < 20*time.Second; {
		time.Sleep(50 * time.Millisecond)
		status, answer = call("POST", "create", body)
	}
	if status != 200 {
		return fmt.Errorf("the first create: %d %s", status, answer)
	}
	id := strings.Split(answer, `"`)[5]
	fmt.Printf("server pid %d, button %s; RSS before the lock: %d MB\n", server.Process.Pid, id,
		rss(server.Process.Pid))

	lock, _ := sql.Open("sqlite", "file:"+db+"?_txlock=immediate")
	tx, err := lock.Begin() // the write lock, as another process holds it
	if err != nil {
		return fmt.Errorf("take the write lock: %v", err)
	}
	var gets, failed, creates atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(duration)
	for i := range 72 {
		wg.Go(func() {
			for time.Now().Before(end) {
				if i < 64 {
					if status, _ := call("GET", "get/"+id, ""); status != 200 {
						failed.Add(1)
					}
					gets.Add(1)
				} else if status, _ := call("POST", "create", body); status != 503 {
					failed.Add(1)
				} else {
					creates.Add(1)
				}
			}
		})
	}
	most := 0
	for time.Now().Before(end) {
		time.Sleep(time.Second)
		most = max(most, rss(server.Process.Pid))
	}
	wg.Wait()
	tx.Rollback()
	released := time.Now()
	status, answer = call("POST", "create", body)
	firstWrite := time.Since(released)
	lock.Close()
	fmt.Printf("while locked for %v: %d gets, %d creates answered 503, %d other answers; "+
		"most RSS %d MB\nthe first create after the lock went: %d in %v\n", duration, gets.Load(),
		creates.Load(), failed.Load(), most, status, firstWrite.Round(time.Millisecond))
	switch {
	case most >= maxRSS:
		return fmt.Errorf("the server grew to %d MB, over %d", most, maxRSS)
	case failed.Load() > 0:
		return fmt.Errorf("%d answers were not 200 (gets) or 503 (creates)", failed.Load())
	case status != 200 || firstWrite >= time.Second:
		return fmt.Errorf("the first create after the lock: %d in %v: %s", status, firstWrite, answer)
	}
	fmt.Println("locked: ok")
	return nil
}

// rss is the resident memory of process pid in MB, from /proc (Linux); 0 elsewhere.
func rss(pid int) int {
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for line := range bytes.Lines(status) {
		if fields := strings.Fields(string(line)); len(fields) > 1 && fields[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(fields[1])
			return kb / 1024
		}
	}
	return 0
}
