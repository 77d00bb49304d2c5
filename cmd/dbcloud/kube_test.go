package main

import (
	"io"
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
	if err := m.ParseFlags([]string{"--runtime", "kubernetes", "--kubeconfig", "/etc/kube/config", "--kube-object-store", "archive"}); err != nil {
		t.Fatal(err)
	}
	if m.Config.Runtime != "kubernetes" || m.Config.Kube.Kubeconfig != "/etc/kube/config" || m.Config.Kube.ObjectStore != "archive" {
		t.Fatalf("config %+v", m.Config.Kube)
	}
}
