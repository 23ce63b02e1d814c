package goclient_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paybuttons/paybuttons/examples/goclient"
)

// server is the service, built from the repository's root, serving a fresh
// database on a free port until the test ends.
type server struct {
	url, key string // key is a read-write key of account "default"
	bin, db  string
}

func startServer(t *testing.T) server {
	t.Helper()
	dir := t.TempDir()
	s := server{bin: filepath.Join(dir, "paybuttons"), db: filepath.Join(dir, "paybuttons.db")}
	build := exec.Command("go", "build", "-o", s.bin, ".")
	build.Dir = "../.." // the service's own module
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s.key = newKey(t, s, false)
	logPath := filepath.Join(dir, "stderr.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.bin, "-addr", "127.0.0.1:0", "-db", s.db)
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	// serve logs the address it listens on.
	for deadline := time.Now().Add(30 * time.Second); s.url == ""; time.Sleep(20 * time.Millisecond) {
		logs, _ := os.ReadFile(logPath)
		for line := range strings.Lines(string(logs)) {
			if _, after, ok := strings.Cut(line, " url="); ok && strings.Contains(line, "listening") {
				s.url = strings.Fields(after)[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server logged no address in 30 s:\n%s", logs)
		}
	}
	return s
}

// newKey makes a key for account "default" with the service's own command,
// which prints only the secret on stdout.
func newKey(t *testing.T, s server, readOnly bool) string {
	t.Helper()
	args := []string{"keys", "create", "-account", "default", "-db", s.db}
	if readOnly {
		args = append(args, "-read-only")
	}
	out, err := exec.Command(s.bin, args...).Output()
	if err != nil {
		t.Fatalf("paybuttons %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// client is the generated client, sending key as X-API-KEY.
func client(t *testing.T, url, key string) *goclient.ClientWithResponses {
	t.Helper()
	c, err := goclient.NewClientWithResponses(url, goclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("X-API-KEY", key)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

// answered fails the test unless the call succeeded with status want.
func answered(t *testing.T, what string, got interface {
	StatusCode() int
	GetBody() []byte
}, err error, want int) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got.StatusCode() != want {
		t.Fatalf("%s: got status %d, want %d\n%s", what, got.StatusCode(), want, got.GetBody())
	}
}

// TestLifecycle runs a button through every operation with the client
// generated from openapi.json, against the real service.
func TestLifecycle(t *testing.T) {
	srv := startServer(t)
	ctx, api := t.Context(), client(t, srv.url, srv.key)

	created, err := api.CreateButtonWithResponse(ctx, goclient.CreateButtonRequest{ProductName: "Pro plan", Amount: "19.90",
		Currency: "usd", PaymentMethod: goclient.Stripe, PaymentType: goclient.OneTime,
		Metadata: &goclient.MetadataInput{"orderRef": ptr("A-17"), "team": ptr("web")}})
	answered(t, "create", created, err, 200)
	id := created.JSON200.Data
	if created.JSON200.Message != goclient.WriteResultMessageCreated || !strings.HasPrefix(id, "btn_") ||
		created.Headers200.ETag != `"1"` {
		t.Fatalf("create: got %+v and ETag %s, want a new id, created, \"1\"", created.JSON200, created.Headers200.ETag)
	}
	other, err := api.CreateButtonWithResponse(ctx, goclient.CreateButtonRequest{ProductName: "Sticker", Amount: "500",
		Currency: "JPY", PaymentMethod: goclient.TheService, PaymentType: goclient.OneTime, IsLive: true})
	answered(t, "create without metadata", other, err, 200)

	got, err := api.GetButtonWithResponse(ctx, id)
	answered(t, "get", got, err, 200)
	b := got.JSON200.Data
	if got.Headers200.ETag != `"1"` || b.Version != 1 || b.Amount != "19.90" || b.Currency != "USD" ||
		b.State != goclient.ButtonStateActive || !reflect.DeepEqual(b.Metadata, goclient.Metadata{"orderRef": "A-17", "team": "web"}) {
		t.Fatalf("get: got ETag %s and %+v, want version 1, 19.90 USD, active, its metadata", got.Headers200.ETag, b)
	}

	listed, err := api.ListButtonsWithResponse(ctx, &goclient.ListButtonsParams{PaymentMethod: ptr("Stripe"), IsLive: ptr(false)})
	answered(t, "list by payment method", listed, err, 200)
	if items := listed.JSON200.Data.Items; len(items) != 1 || items[0].Id != id || listed.JSON200.Data.HasMore {
		t.Errorf("list?paymentMethod=Stripe&isLive=false: got %+v, want only %s", listed.JSON200.Data, id)
	}
	// Both buttons, a page of one at a time: the first page's next is its one item's id.
	firstPage, err := api.ListButtonsWithResponse(ctx, &goclient.ListButtonsParams{Limit: ptr(1)})
	answered(t, "list, a page of one", firstPage, err, 200)
	page := firstPage.JSON200.Data
	if len(page.Items) != 1 || !page.HasMore || page.Next == nil || *page.Next != page.Items[0].Id {
		t.Fatalf("list?limit=1: got %+v, want one button, and its id as next", page)
	}
	secondPage, err := api.ListButtonsWithResponse(ctx, &goclient.ListButtonsParams{Limit: ptr(1), After: page.Next})
	answered(t, "list, the next page", secondPage, err, 200)
	seen := []string{page.Items[0].Id}
	if page = secondPage.JSON200.Data; len(page.Items) != 1 || page.HasMore || page.Next != nil {
		t.Fatalf("list?limit=1&after=%s: got %+v, want the other button and no more", seen[0], page)
	}
	if seen = append(seen, page.Items[0].Id); !reflect.DeepEqual(seen, []string{other.JSON200.Data, id}) &&
		!reflect.DeepEqual(seen, []string{id, other.JSON200.Data}) {
		t.Errorf("list, two pages of one: got %v, want %s and %s", seen, id, other.JSON200.Data)
	}

	change := goclient.UpdateButtonRequest{Amount: ptr("12.00"), Metadata: &goclient.MetadataInput{"orderRef": nil}}
	updated, err := api.UpdateButtonWithResponse(ctx, id, &goclient.UpdateButtonParams{IfMatch: ptr(`"1"`)}, change)
	answered(t, "update", updated, err, 200)
	if updated.JSON200.Message != goclient.WriteResultMessageUpdated || updated.Headers200.ETag != `"2"` {
		t.Errorf("update: got message %s and ETag %s, want updated, \"2\"", updated.JSON200.Message, updated.Headers200.ETag)
	}
	stale, err := api.UpdateButtonWithResponse(ctx, id, &goclient.UpdateButtonParams{IfMatch: ptr(`"1"`)}, change)
	answered(t, "update with a stale If-Match", stale, err, 412)
	again, err := api.UpdateButtonWithResponse(ctx, id, nil, change)
	if answered(t, "the same update again", again, err, 200); again.JSON200.Message != goclient.WriteResultMessageUnchanged ||
		again.Headers200.ETag != `"2"` {
		t.Errorf("the same update again: got message %s and ETag %s, want unchanged, \"2\"", again.JSON200.Message, again.Headers200.ETag)
	}
	// A new currency needs its amount, and no write takes an Idempotency-Key: both are refused, naming it.
	noAmount, err := api.UpdateButtonWithResponse(ctx, id, nil, goclient.UpdateButtonRequest{Currency: ptr("EUR")})
	if answered(t, "update of the currency alone", noAmount, err, 400); noAmount.JSON400.Errors["amount"] == "" {
		t.Errorf("update of the currency alone: got errors %v, want one for amount", noAmount.JSON400.Errors)
	}
	keyed, err := api.DeleteButtonWithResponse(ctx, id, nil, func(_ context.Context, req *http.Request) error {
		req.Header.Set("Idempotency-Key", "order-17")
		return nil
	})
	if answered(t, "delete with an Idempotency-Key", keyed, err, 400); keyed.JSON400.Errors["Idempotency-Key"] == "" {
		t.Errorf("delete with an Idempotency-Key: got errors %v, want one for Idempotency-Key", keyed.JSON400.Errors)
	}
	deleted, err := api.DeleteButtonWithResponse(ctx, id, &goclient.DeleteButtonParams{IfMatch: ptr(`"2"`)})
	answered(t, "delete", deleted, err, 200)
	if deleted.JSON200.Message != goclient.WriteResultMessageDeleted || deleted.Headers200.ETag != `"3"` {
		t.Errorf("delete: got message %s and ETag %s, want deleted, \"3\"", deleted.JSON200.Message, deleted.Headers200.ETag)
	}
	gone, err := api.UpdateButtonWithResponse(ctx, id, nil, goclient.UpdateButtonRequest{ProductName: ptr("Pro")})
	if answered(t, "update of a deleted button", gone, err, 409); gone.JSON409.Code != goclient.ErrorCodeWrongState {
		t.Errorf("update of a deleted button: got code %s, want wrong_state", gone.JSON409.Code)
	}
	restored, err := api.RestoreButtonWithResponse(ctx, id, &goclient.RestoreButtonParams{IfMatch: ptr(`"3"`)})
	answered(t, "restore", restored, err, 200)
	if restored.JSON200.Message != goclient.WriteResultMessageRestored || restored.Headers200.ETag != `"4"` {
		t.Errorf("restore: got message %s and ETag %s, want restored, \"4\"", restored.JSON200.Message, restored.Headers200.ETag)
	}

	// A read-only key reads, and is refused any change.
	reader := client(t, srv.url, newKey(t, srv, true))
	read, err := reader.GetButtonWithResponse(ctx, id)
	answered(t, "get with a read-only key", read, err, 200)
	refused, err := reader.DeleteButtonWithResponse(ctx, id, nil)
	answered(t, "delete with a read-only key", refused, err, 403)
	if refused.JSON403.Code != goclient.ErrorCodeForbidden {
		t.Errorf("delete with a read-only key: got code %s, want forbidden", refused.JSON403.Code)
	}
	if after, err := api.GetButtonWithResponse(ctx, id); err != nil || after.JSON200.Data.Version != 4 {
		t.Errorf("after the refused delete: got %+v (%v), want the button unchanged at version 4", after.JSON200, err)
	}
}

// TestMoneyTravelsAsText sends an amount and a fee that a float32 would round through the generated
// client, and reads them back through it exactly: the document gives them as decimal strings.
func TestMoneyTravelsAsText(t *testing.T) {
	srv := startServer(t)
	ctx, api := t.Context(), client(t, srv.url, srv.key)
	created, err := api.CreateButtonWithResponse(ctx, goclient.CreateButtonRequest{ProductName: "Franchise",
		Amount: "123456789.12", Currency: "USD", PaymentMethod: goclient.StripeConnect,
		ApplicationFeePercentage: ptr("33.33"), PaymentType: goclient.OneTime})
	answered(t, "create", created, err, 200)
	got, err := api.GetButtonWithResponse(ctx, created.JSON200.Data)
	answered(t, "get", got, err, 200)
	if b := got.JSON200.Data; b.Amount != "123456789.12" || b.ApplicationFeePercentage == nil || *b.ApplicationFeePercentage != "33.33" {
		t.Errorf("get: got amount %q, fee %v; want exactly 123456789.12 and 33.33", b.Amount, b.ApplicationFeePercentage)
	}
}
