package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestServe_Banner: every start, the first and a restart, tells the person
// at the terminal where the API, the CA and the credentials are and how to
// stop services, and never shows the secret.
func TestServe_Banner(t *testing.T) {
	dir := t.TempDir()
	for _, start := range []string{"first start", "restart"} {
		logs := &syncBuffer{}
		m := MustRunMain(t, dir, logs)
		b := readBootstrap(t, dir)
		out := logs.String()
		for _, want := range []string{"dbcloud is serving.", m.URL(), b.CAFile, filepath.Join(dir, "bootstrap.json"),
			"admin service stop-all --data-dir " + dir, "admin teardown --data-dir " + dir, "keep running when dbcloud stops"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: banner lacks %q:\n%s", start, want, out)
			}
		}
		if strings.Contains(out, b.SecretKey) {
			t.Errorf("%s: the banner shows the secret", start)
		}
		m.Close()
	}
}
