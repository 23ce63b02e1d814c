package main

import (
	"cmp"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http/httptest"
	"slices"
	"testing"
)

// openapi.json's error codes are the server's, and the document served names -provider-name where the
// file says "the service". (examples/goclient's TestConformance holds every kind of answer to the
// document, and the document to the answers, with a JSON Schema validator.)
func TestOpenAPIDocument(t *testing.T) {
	var file, served struct {
		Components struct {
			Schemas map[string]struct{ Enum []string }
		}
	}
	rec := httptest.NewRecorder()
	newServer(nil, slog.New(slog.DiscardHandler), "Acme Pay").ServeHTTP(rec,
		httptest.NewRequest("GET", "/openapi.json", nil))
	err := cmp.Or(json.Unmarshal(openAPIDocument, &file), json.Unmarshal(rec.Body.Bytes(), &served))
	require(t, err == nil, "decode openapi.json: %v", err)
	codes := slices.Sorted(slices.Values(file.Components.Schemas["ErrorCode"].Enum))
	expect(t, slices.Equal(codes, slices.Sorted(maps.Keys(statusOf))), "openapi.json's error codes: got %v, "+
		"want the server's %v", codes, statusOf)
	methods := served.Components.Schemas["PaymentMethod"].Enum
	expect(t, slices.Equal(methods, []string{"Acme Pay", "Stripe", "StripeConnect"}), "GET /openapi.json "+
		"with -provider-name \"Acme Pay\": got paymentMethod %v", methods)
}
