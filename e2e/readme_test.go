package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// walkthroughMarker precedes each README code block the walkthrough test
// runs.
const walkthroughMarker = "<!-- walkthrough -->"

// readmeWalkthrough returns the README's walkthrough commands: the sh
// blocks that follow the marker, in order.
func readmeWalkthrough(t testing.TB) string {
	t.Helper()
	return readmeBlocks(t, walkthroughMarker)
}

// readmeBlocks returns the README's sh blocks that follow marker, in
// order, as one script.
func readmeBlocks(t testing.TB, marker string) string {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var script []string
	parts := strings.Split(string(raw), marker)
	for _, p := range parts[1:] {
		p = strings.TrimLeft(p, "\n")
		body, ok := strings.CutPrefix(p, "```sh\n")
		if !ok {
			t.Fatalf("README: %s is not followed by a ```sh block", marker)
		}
		end := strings.Index(body, "\n```")
		if end < 0 {
			t.Fatal("README: unterminated walkthrough block")
		}
		script = append(script, body[:end+1])
	}
	if len(script) == 0 {
		t.Fatalf("README has no block after %s", marker)
	}
	return strings.Join(script, "")
}

// TestReadme_Walkthrough runs the README's walkthrough as written, in an
// empty shell (bash, no variables set) whose working directory has the
// server's fresh data directory as dbcloud-data, as scripts/run.sh makes it.
func TestReadme_Walkthrough(t *testing.T) {
	script := readmeWalkthrough(t)
	s := newServer(t)
	work := t.TempDir()
	if err := os.Symlink(s.dir, filepath.Join(work, "dbcloud-data")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = work
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("walkthrough failed: %v\n%s\n--- script ---\n%s", err, out, script)
	}
	for _, want := range []string{`"type": "apiKey"`, "PostgreSQL ", "create_service\tsucceeded"} {
		if !strings.Contains(strings.ReplaceAll(string(out), `"type":"apiKey"`, `"type": "apiKey"`), want) {
			t.Errorf("walkthrough output lacks %q:\n%s", want, out)
		}
	}
}
