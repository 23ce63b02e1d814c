package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A handler's panic is a 500 with the generic envelope; the log has the cause and the stack.
func TestPanicIsA500ThatLogsTheStack(t *testing.T) {
	logs := &syncBuffer{}
	s := &server{log: slog.New(slog.NewTextHandler(logs, nil)), metrics: metrics{routes: map[string]*routeMetrics{}}}
	h := s.withBasics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/anything", nil)
	req.Header.Set("X-Request-Id", "trace-500")
	h.ServeHTTP(rec, req)

	want := `{"isSuccess":false,"data":"","message":"internal error","code":"internal"}`
	if rec.Code != 500 || rec.Body.String() != want {
		t.Errorf("got %d %s, want 500 %s", rec.Code, rec.Body, want)
	}
	got := logs.String()
	for _, part := range []string{"secret detail", "requestId=trace-500", "goroutine", "status=500"} {
		if !strings.Contains(got, part) {
			t.Errorf("the log lacks %q:\n%s", part, got)
		}
	}
}
