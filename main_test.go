package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestKeysCommands(t *testing.T) {
	db := filepath.Join(t.TempDir(), "keys.db")
	out, err := runCLI(t, nil, "keys", "create", "-account", "acme", "-db", db)
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key := strings.TrimSuffix(out, "\n")
	if !regexp.MustCompile(`^pbk_[A-Za-z0-9_-]{43}$`).MatchString(key) || strings.Count(out, "\n") != 1 {
		t.Fatalf("got keys create output %q, want only a pbk_ key of 43 URL-safe characters", out)
	}

	list, err := runCLI(t, nil, "keys", "list", "-db", db)
	if err != nil {
		t.Fatalf("keys list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")
	fields := strings.Split(lines[0], "\t")
	if len(lines) != 1 || !strings.HasPrefix(fields[0], "key_") || fields[1] != "acme" || !strings.Contains(lines[0], "revoked never") {
		t.Fatalf("got keys list %q, want one line: id, acme, created, last used, revoked never", list)
	}
	if strings.Contains(list, key) || strings.Contains(list, key[4:]) {
		t.Fatalf("keys list shows the secret: %q", list)
	}

	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, fields[0]); err != nil {
		t.Fatalf("keys revoke: %v", err)
	}
	list, _ = runCLI(t, nil, "keys", "list", "-db", db)
	if strings.Contains(list, "revoked never") {
		t.Errorf("got %q after revoke, want a revoked time", list)
	}
	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, fields[0]); err != nil {
		t.Errorf("revoking a revoked key: got %v, want a no-op", err)
	}
	if again, _ := runCLI(t, nil, "keys", "list", "-db", db); again != list {
		t.Errorf("revoking a revoked key changed the list: got %q, want %q", again, list)
	}
	if _, err := runCLI(t, nil, "keys", "revoke", "-db", db, "key_unknown"); err == nil || exitStatus(err) != 1 {
		t.Errorf("revoking an unknown key: got %v (status %d), want an error with status 1", err, exitStatus(err))
	}
}

func TestEnvironmentFallbacks(t *testing.T) {
	dir := t.TempDir()
	fromEnv, fromFlag := filepath.Join(dir, "env.db"), filepath.Join(dir, "flag.db")
	env := map[string]string{"PAYBUTTONS_DB": fromEnv}
	if _, err := runCLI(t, env, "keys", "create", "-account", "a"); err != nil {
		t.Fatalf("keys create with PAYBUTTONS_DB: %v", err)
	}
	if _, err := os.Stat(fromEnv); err != nil {
		t.Errorf("PAYBUTTONS_DB was not used: %v", err)
	}
	if _, err := runCLI(t, env, "keys", "create", "-account", "a", "-db", fromFlag); err != nil {
		t.Fatalf("keys create with -db: %v", err)
	}
	if _, err := os.Stat(fromFlag); err != nil {
		t.Errorf("-db did not beat PAYBUTTONS_DB: %v", err)
	}
	if _, err := runCLI(t, map[string]string{"PAYBUTTONS_RATE": "fast"}, "-db", fromFlag); exitStatus(err) != 2 {
		t.Errorf("PAYBUTTONS_RATE=fast: got %v, want a usage error", err)
	}
}

func TestCommandLineErrors(t *testing.T) {
	dir := t.TempDir()
	notADB := filepath.Join(dir, "garbage.db")
	os.WriteFile(notADB, bytes.Repeat([]byte("not sqlite "), 1000), 0o600)
	tests := []struct {
		name     string
		args     []string
		status   int
		contains string
	}{
		{"unknown flag", []string{"-bogus"}, 2, "bogus"},
		{"unknown command", []string{"frobnicate"}, 2, "frobnicate"},
		{"negative rate", []string{"-rate", "-1"}, 2, "-rate"},
		{"tls cert without key", []string{"-tls-cert", "c.pem"}, 2, "-tls-key"},
		{"keys without command", []string{"keys"}, 2, "create"},
		{"keys create without account", []string{"keys", "create", "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"account name with a space", []string{"keys", "create", "-account", "a b", "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"account name of 65 characters", []string{"keys", "create", "-account", strings.Repeat("a", 65), "-db", filepath.Join(dir, "k.db")}, 2, "-account"},
		{"missing directory", []string{"-db", filepath.Join(dir, "no", "such", "x.db")}, 1, "does not exist"},
		{"not a database", []string{"-db", notADB, "-addr", "127.0.0.1:0"}, 1, "not a SQLite database"},
		{"keys list without database", []string{"keys", "list", "-db", filepath.Join(dir, "none.db")}, 1, "no database"},
		{"busy port", []string{"-db", filepath.Join(dir, "p.db"), "-addr", "256.0.0.1:1"}, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runCLI(t, nil, tt.args...)
			if err == nil || exitStatus(err) != tt.status || !strings.Contains(err.Error(), tt.contains) {
				t.Errorf("args %q: got %v (status %d), want status %d mentioning %q", tt.args, err, exitStatus(err), tt.status, tt.contains)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("args %q: got a multi-line error %q, want one line", tt.args, err)
			}
		})
	}
}
