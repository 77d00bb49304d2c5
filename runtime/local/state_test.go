package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// State files keep their layout ("ports" at the top level) and a state
// read without ports can be given some at once.
func TestReadState(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ha.json")
	if st, err := readState[haState](path); st != nil || err != nil {
		t.Fatalf("missing file: %v, %v; want nil, nil", st, err)
	}
	if err := os.WriteFile(path, []byte(`{"primary": 1, "members": [0, 1]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := readState[haState](path)
	if err != nil || st.Primary != 1 || st.Ports == nil {
		t.Fatalf("got %+v, %v; want primary 1 and a ports map", st, err)
	}
	st.Ports[1] = 5433
	if err := writeState(path, st); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), `"ports": {`) || !strings.Contains(string(raw), `"1": 5433`) {
		t.Errorf("written state %s: want a top-level ports map", raw)
	}
	rs, err := readState[replicaSetState](path)
	if err != nil || rs.Ports[1] != 5433 {
		t.Errorf("replica set state from the same layout: %+v, %v", rs, err)
	}
}
