package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuntimeFlag(t *testing.T) {
	m := NewMain(io.Discard)
	err := m.ParseFlags([]string{"--runtime", "nomad"})
	if err == nil || !strings.Contains(err.Error(), "--runtime") {
		t.Fatalf("--runtime nomad: %v", err)
	}
	m = NewMain(io.Discard)
	if err := m.ParseFlags([]string{"--runtime", "kubernetes", "--kubeconfig", "/etc/kube/config", "--kube-object-store", "archive", "--kube-guard"}); err != nil {
		t.Fatal(err)
	}
	if m.Config.Runtime != "kubernetes" || m.Config.Kube.Kubeconfig != "/etc/kube/config" || m.Config.Kube.ObjectStore != "archive" || !m.Config.Kube.Guard {
		t.Fatalf("config %+v", m.Config.Kube)
	}
}

// TestKubeFlags: a wrong exposure, annotation or object store stops serve
// at start, naming the flag, before any service is made.
func TestKubeFlags(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-expose", "ingress"}, "--kube-expose"},
		{[]string{"--kube-expose-annotations", "no-value"}, "--kube-expose-annotations"},
		{[]string{"--kube-expose", "nodeport", "--kube-expose-annotations", "a=b, c=d"}, ""},
		{[]string{"--kube-object-store", "dbcloud-backups/"}, "--kube-object-store"},
		{[]string{"--kube-object-store", "/archive"}, "--kube-object-store"},
		{[]string{"--kube-object-store", "a/b/c"}, "--kube-object-store"},
		{[]string{"--kube-object-store", "dbcloud-backups/archive"}, ""},
		{[]string{"--kube-object-store", "archive"}, ""},
	} {
		m := NewMain(io.Discard)
		if err := m.ParseFlags(append([]string{"--runtime", "kubernetes", "--kubeconfig", kubeconfig}, c.args...)); err != nil {
			t.Fatal(err)
		}
		_, _, err := m.kubernetesRuntime(context.Background())
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
