package testports

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Ports claimed here are never handed out twice, within this process or
// to another process, and lie below the ephemeral range.
func TestClaims(t *testing.T) {
	if os.Getenv("TESTPORTS_CHILD") != "" {
		var out []string
		for range 3 {
			p, err := Port()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strconv.Itoa(p))
		}
		b, err := Block()
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("PORTS " + strings.Join(append(out, strconv.Itoa(b)), " ") + "\n")
		// Hold the claims until the parent has compared.
		os.Stdin.Read(make([]byte, 1))
		return
	}
	seen := map[int]bool{}
	for range 5 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] || p < singleLo || p >= singleHi {
			t.Fatalf("port %d: handed out twice or outside %d-%d", p, singleLo, singleHi-1)
		}
		seen[p] = true
	}
	b, err := Block()
	if err != nil || b < blockLo || b+BlockSize > blockHi {
		t.Fatalf("block %d, %v", b, err)
	}
	for p := b; p < b+BlockSize; p++ {
		seen[p] = true
	}
	// Another process, started while this one holds its claims, gets
	// other ports.
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaims$")
	cmd.Env = append(os.Environ(), "TESTPORTS_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	buf := make([]byte, 4096)
	var text string
	for !strings.Contains(text, "\n") {
		n, err := stdout.Read(buf)
		if err != nil {
			t.Fatalf("child: %v (output %q)", err, text)
		}
		text += string(buf[:n])
	}
	fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(text[strings.Index(text, "PORTS"):]), "PORTS"))
	for i, f := range fields {
		p, _ := strconv.Atoi(f)
		if i == len(fields)-1 {
			for q := p; q < p+BlockSize; q++ {
				if seen[q] {
					t.Errorf("the other process's block %d holds port %d, which this process holds", p, q)
				}
			}
		} else if seen[p] {
			t.Errorf("the other process got port %d, which this process holds", p)
		}
	}
}
