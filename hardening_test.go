package main

// What an attacker and a careless operator found (the hardening issue), each
// reproduced with real processes and files.

import (
	"testing"
)

// An update whose every value equals what is stored changes nothing: version, updatedAt, changeSeq, history.
func TestUnchangedUpdate(t *testing.T) {
	e := newTestServer(t)
	id := e.create(e.key, createBody(map[string]any{"description": nil, "metadata": map[string]any{"k": "v"}}))
	before := e.mustStored("acme", id)
	for _, body := range []string{`{"description":null}`, `{"productName":"Pro plan","amount":"19.9"}`,
		`{"currency":"usd","metadata":{"k":"v","gone":null}}`} {
		for range 2 { // the second time is a replay
			r := e.do("POST", "/product-payment/update/"+id, e.key, body, "If-Match", `"1"`, "Idempotency-Key", body)
			r.want(t, 200, "")
			if r.env.Message != "unchanged" {
				t.Errorf("%s: got message %q, want unchanged", r.request, r.env.Message)
			}
		}
	}
	after := e.mustStored("acme", id)
	if after.Version != 1 || after.UpdatedAt != before.UpdatedAt || after.ChangeSeq != before.ChangeSeq ||
		e.count(`SELECT count(*) FROM button_history`) != 0 {
		t.Errorf("got %+v, want version, updatedAt and changeSeq as before, and no history", after)
	}
}
