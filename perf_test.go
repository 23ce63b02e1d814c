package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
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
