package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// benchClient sends requests with keep-alive connections enough for b.RunParallel.
var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// benchRequest sends one request and fails b unless it is answered 200.
func benchRequest(b *testing.B, method, url, key, body string) {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("X-API-KEY", key)
	resp, err := benchClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s %s: got status %d, want 200", method, url, resp.StatusCode)
	}
}

// BenchmarkCreate measures durable creates (synchronous=FULL, one fsync per
// group commit) from parallel clients over real HTTP.
func BenchmarkCreate(b *testing.B) {
	e := newTestServer(b)
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := createBody(map[string]any{"productName": fmt.Sprint("Widget ", n.Add(1))})
			benchRequest(b, "POST", e.url+"/product-payment/create", e.key, body)
		}
	})
}

// BenchmarkGet measures reads of one button from parallel clients over real HTTP.
func BenchmarkGet(b *testing.B) {
	e := newTestServer(b)
	id := e.create(e.key, createBody(nil))
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchRequest(b, "GET", e.url+"/product-payment/get/"+id, e.key, "")
		}
	})
}

// BenchmarkList100k pages through an account of 100,000 buttons (1,000 of
// them deleted, half of them live) over real HTTP, one page of 20 a request.
func BenchmarkList100k(b *testing.B) {
	e := newTestServer(b)
	var middle string
	for chunk := 0; chunk < 100; chunk++ {
		err := e.store.write(context.Background(), func(tx *writeTx) error {
			for i := 0; i < 1000; i++ {
				n := chunk*1000 + i
				state, deleted := stateActive, any(nil)
				if n%100 == 0 {
					state, deleted = stateDeleted, "2026-01-01T00:00:00.000Z"
				}
				id := e.store.ids.next()
				if n == 50_000 {
					middle = id
				}
				if _, err := tx.exec(`INSERT INTO buttons (id, account, `+selectButton+`)
					VALUES (?, 'acme', 'Widget', NULL, 1990, 'USD', NULL, 'Stripe', 'one_time', ?, NULL, ?, 1,
					'2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', ?)`, id, n%2 == 0, state, deleted); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, query := range []string{"state=active", "state=deleted", "state=all&after=" + middle, "isLive=true", "state=deleted&after=" + middle} {
		b.Run(query, func(b *testing.B) {
			for range b.N {
				benchRequest(b, "GET", e.url+"/product-payment/list?"+query, e.key, "")
			}
		})
	}
}
