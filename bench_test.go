package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}} // enough for b.RunParallel

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
