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
	url, key string // the key serve printed for account "default"
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
	// serve prints the first key on a line of its own and logs the address it listens on.
	for deadline := time.Now().Add(30 * time.Second); s.url == "" || s.key == ""; time.Sleep(20 * time.Millisecond) {
		logs, _ := os.ReadFile(logPath)
		for line := range strings.Lines(string(logs)) {
			if strings.HasPrefix(line, "pbk_") {
				s.key = strings.TrimSpace(line)
			}
			if _, after, ok := strings.Cut(line, " url="); ok && strings.Contains(line, "listening") {
				s.url = strings.Fields(after)[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server printed no key or address in 30 s:\n%s", logs)
		}
	}
	return s
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

	created, err := api.CreateButtonWithResponse(ctx, &goclient.CreateButtonParams{IdempotencyKey: ptr("order-17")},
		goclient.CreateButtonRequest{ProductName: "Pro plan", Amount: "19.90", Currency: "usd", PaymentMethod: goclient.Stripe,
			PaymentType: goclient.OneTime, Metadata: &goclient.MetadataInput{"orderRef": ptr("A-17"), "team": ptr("web")}})
	answered(t, "create", created, err, 200)
	id := created.JSON200.Data
	if created.JSON200.Message != goclient.CreatedResultMessageCreated || !strings.HasPrefix(id, "btn_") {
		t.Fatalf("create: got %+v, want a new id, created", created.JSON200)
	}
	other, err := api.CreateButtonWithResponse(ctx, nil, goclient.CreateButtonRequest{ProductName: "Sticker", Amount: "500",
		Currency: "JPY", PaymentMethod: goclient.TheService, PaymentType: goclient.OneTime, IsLive: true})
	answered(t, "create without metadata", other, err, 200)

	got, err := api.GetButtonWithResponse(ctx, id, nil)
	answered(t, "get", got, err, 200)
	b := got.JSON200.Data
	if got.Headers200.ETag != `"1"` || b.Version != 1 || b.Amount != "19.90" || b.Currency != "USD" || b.ChangeSeq < 1 ||
		b.State != goclient.ButtonStateActive || !reflect.DeepEqual(b.Metadata, goclient.Metadata{"orderRef": "A-17", "team": "web"}) {
		t.Fatalf("get: got ETag %s and %+v, want version 1, 19.90 USD, active, its metadata", got.Headers200.ETag, b)
	}
	head, err := api.HeadButtonWithResponse(ctx, id, nil)
	if answered(t, "head", head, err, 200); head.Headers200.ETag != `"1"` {
		t.Errorf("head: got ETag %s, want \"1\"", head.Headers200.ETag)
	}

	listed, err := api.ListButtonsWithResponse(ctx, &goclient.ListButtonsParams{Metadata: &goclient.MetadataFilter{"team": "web"}})
	answered(t, "list by metadata", listed, err, 200)
	if items := listed.JSON200.Data.Items; len(items) != 1 || items[0].Id != id || listed.JSON200.Data.HasMore {
		t.Errorf("list?metadata[team]=web: got %+v, want only %s", listed.JSON200.Data, id)
	}

	change := goclient.UpdateButtonRequest{Amount: ptr("12.00"), Metadata: &goclient.MetadataInput{"orderRef": nil}}
	updated, err := api.UpdateButtonWithResponse(ctx, id, &goclient.UpdateButtonParams{IfMatch: ptr(`"1"`)}, change)
	answered(t, "update", updated, err, 200)
	if updated.JSON200.Message != goclient.UpdatedResultMessageUpdated {
		t.Errorf("update: got message %s, want updated", updated.JSON200.Message)
	}
	stale, err := api.UpdateButtonWithResponse(ctx, id, &goclient.UpdateButtonParams{IfMatch: ptr(`"1"`)}, change)
	answered(t, "update with a stale If-Match", stale, err, 412)
	again, err := api.UpdateButtonWithResponse(ctx, id, nil, change)
	if answered(t, "the same update again", again, err, 200); again.JSON200.Message != goclient.UpdatedResultMessageUnchanged {
		t.Errorf("the same update again: got message %s, want unchanged", again.JSON200.Message)
	}
	deleted, err := api.DeleteButtonWithResponse(ctx, id, &goclient.DeleteButtonParams{IfMatch: ptr(`"2"`)})
	answered(t, "delete", deleted, err, 200)
	restored, err := api.RestoreButtonWithResponse(ctx, id, &goclient.RestoreButtonParams{IfMatch: ptr(`"3"`)})
	answered(t, "restore", restored, err, 200)

	// History, two entries a page: create and update, then delete and restore.
	var sizes []int
	var entries []goclient.HistoryEntry
	for after, more := ptr(int64(0)), true; more; {
		page, err := api.GetButtonHistoryWithResponse(ctx, id, &goclient.GetButtonHistoryParams{Limit: ptr(2), After: after})
		answered(t, "history", page, err, 200)
		entries, sizes = append(entries, page.JSON200.Data.Items...), append(sizes, len(page.JSON200.Data.Items))
		after, more = page.JSON200.Data.Next, page.JSON200.Data.HasMore
	}
	if !reflect.DeepEqual(sizes, []int{2, 2}) {
		t.Fatalf("history: got pages of %v entries, want 2 and 2", sizes)
	}
	for i, action := range []goclient.HistoryEntryAction{goclient.Create, goclient.Update, goclient.Delete, goclient.Restore} {
		if entries[i].Action != action || entries[i].Version != int64(i+1) {
			t.Errorf("history[%d]: got %s version %d, want %s version %d", i, entries[i].Action, entries[i].Version, action, i+1)
		}
	}
	repriced, unset := entries[1].Changes.Amount, entries[1].Changes.AdditionalProperties["metadata.orderRef"]
	if repriced == nil || *repriced.From != "19.90" || *repriced.To != "12.00" || *unset.From != "A-17" || unset.To != nil {
		t.Errorf("history[1] changes: got %+v, want amount 19.90 -> 12.00 and metadata.orderRef A-17 -> null", entries[1].Changes)
	}

	// The change feed: each button once, as it is now, in the order of its last change.
	feed, err := api.GetChangesWithResponse(ctx, &goclient.GetChangesParams{Since: ptr(int64(0))})
	answered(t, "changes", feed, err, 200)
	items := feed.JSON200.Data.Items
	if len(items) != 2 || items[0].Id != other.JSON200.Data || items[1].Id != id || items[1].Version != 4 ||
		feed.JSON200.Data.Next != items[1].ChangeSeq || feed.JSON200.Data.HasMore {
		t.Fatalf("changes?since=0: got %+v, want the other button, then %s at version 4, next its changeSeq", feed.JSON200.Data, id)
	}
	quiet, err := api.GetChangesWithResponse(ctx, &goclient.GetChangesParams{Since: &feed.JSON200.Data.Next})
	answered(t, "changes with nothing new", quiet, err, 200)
	if len(quiet.JSON200.Data.Items) != 0 || quiet.JSON200.Data.Next != feed.JSON200.Data.Next {
		t.Errorf("changes?since=%d: got %+v, want nothing, the same next", feed.JSON200.Data.Next, quiet.JSON200.Data)
	}

	// A read-only key reads, and is refused any change.
	out, err := exec.Command(srv.bin, "keys", "create", "-account", "default", "-read-only", "-db", srv.db).Output()
	if err != nil {
		t.Fatalf("keys create -read-only: %v", err)
	}
	reader := client(t, srv.url, strings.TrimSpace(string(out)))
	read, err := reader.GetButtonWithResponse(ctx, id, nil)
	answered(t, "get with a read-only key", read, err, 200)
	refused, err := reader.DeleteButtonWithResponse(ctx, id, nil)
	answered(t, "delete with a read-only key", refused, err, 403)
	if refused.JSON403.Code != goclient.ForbiddenErrorCodeForbidden {
		t.Errorf("delete with a read-only key: got code %s, want forbidden", refused.JSON403.Code)
	}
	if after, err := api.GetButtonWithResponse(ctx, id, nil); err != nil || after.JSON200.Data.Version != 4 {
		t.Errorf("after the refused delete: got %+v (%v), want the button unchanged at version 4", after.JSON200, err)
	}
}

// TestMoneyTravelsAsText sends an amount and a fee that a float32 would round through the generated
// client, and reads them back through it exactly: the document gives them as decimal strings.
func TestMoneyTravelsAsText(t *testing.T) {
	srv := startServer(t)
	ctx, api := t.Context(), client(t, srv.url, srv.key)
	created, err := api.CreateButtonWithResponse(ctx, nil, goclient.CreateButtonRequest{ProductName: "Franchise",
		Amount: "123456789.12", Currency: "USD", PaymentMethod: goclient.StripeConnect,
		ApplicationFeePercentage: ptr("33.33"), PaymentType: goclient.OneTime})
	answered(t, "create", created, err, 200)
	got, err := api.GetButtonWithResponse(ctx, created.JSON200.Data, nil)
	answered(t, "get", got, err, 200)
	if b := got.JSON200.Data; b.Amount != "123456789.12" || b.ApplicationFeePercentage == nil || *b.ApplicationFeePercentage != "33.33" {
		t.Errorf("get: got amount %q, fee %v; want exactly 123456789.12 and 33.33", b.Amount, b.ApplicationFeePercentage)
	}
}
