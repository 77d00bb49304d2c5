package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"dbcloud"
)

// TestBootstrapOwnerAndAdminUsers: the first start writes the first
// owner's password once (bootstrap.json, 0600, never the log); the
// operator's user commands create, list and disable users, and what they
// make signs in (or, disabled, does not).
func TestBootstrapOwnerAndAdminUsers(t *testing.T) {
	dir := t.TempDir()
	logs := &syncBuffer{}
	m := MustRunMain(t, dir, logs)
	b := readBootstrap(t, dir)
	if b.OwnerEmail == "" || len(b.OwnerPassword) < 20 || !strings.HasPrefix(b.ConsoleURL, "https://") {
		t.Fatalf("bootstrap.json lacks the owner's sign-in: %+v", b)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bootstrap.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("bootstrap.json mode %v, want 0600", fi.Mode())
	}
	if strings.Contains(logs.String(), b.OwnerPassword) {
		t.Error("the log contains the owner's password")
	}
	ctx := context.Background()
	if _, err := m.cloud.SignIn(ctx, b.OwnerEmail, b.OwnerPassword); err != nil {
		t.Fatalf("the bootstrap owner cannot sign in: %v", err)
	}
	m.Close()

	admin := func(args ...string) (string, error) {
		var out, errs bytes.Buffer
		err := runAdmin(ctx, append(args, "--data-dir", dir), &out, &errs)
		return out.String(), err
	}
	out, err := admin("user", "create", "--email", "bob@example.com", "--name", "Bob", "--project", b.ProjectID, "--role", "viewer", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var made map[string]string
	if err := json.Unmarshal([]byte(out), &made); err != nil || len(made["password"]) < 20 {
		t.Fatalf("user create printed %q, want the generated password once", out)
	}
	if _, err := admin("user", "create", "--email", "BOB@example.com", "--name", "Bob again"); err == nil {
		t.Error("a second user with the same e-mail was created")
	}
	if _, err := admin("user", "create", "--email", "x@example.com", "--name", "X", "--project", b.ProjectID, "--role", "root"); err == nil {
		t.Error("an unknown role was accepted")
	}
	out, _ = admin("user", "list")
	if !strings.Contains(out, "bob@example.com") || !strings.Contains(out, b.OwnerEmail) {
		t.Errorf("user list:\n%s", out)
	}
	out, err = admin("key", "create", "--project", b.ProjectID, "--name", "reader", "--role", "viewer", "--json")
	if err != nil || !strings.Contains(out, "secret_key") {
		t.Fatalf("key create --role viewer: %v %s", err, out)
	}
	if _, err := admin("key", "create", "--project", b.ProjectID, "--name", "x", "--role", "god"); err == nil {
		t.Error("key create accepted an unknown role")
	}
	if _, err := admin("user", "disable", "--email", "bob@example.com"); err != nil {
		t.Fatal(err)
	}

	m2 := MustRunMain(t, dir, logs)
	if _, err := m2.cloud.SignIn(ctx, "bob@example.com", made["password"]); dbcloud.ErrorKindOf(err) != dbcloud.KindUnauthorized {
		t.Errorf("a disabled user signed in: %v", err)
	}
}
