package dbcloud

import (
	"strings"
	"testing"
)

// TestChoosePGVersion: the newest when none is asked, the one asked when
// the installation has it, else a 400 naming those there are.
func TestChoosePGVersion(t *testing.T) {
	have := []PGVersion{{Major: 17, Full: "17.12"}, {Major: 15, Full: "15.20"}}
	ask := func(n int) *int { return &n }
	if v, err := ChoosePGVersion(nil, have); err != nil || v.Full != "17.12" {
		t.Errorf("no version asked: %+v %v, want 17.12", v, err)
	}
	if v, err := ChoosePGVersion(ask(15), have); err != nil || v.Full != "15.20" {
		t.Errorf("15 asked: %+v %v, want 15.20", v, err)
	}
	for _, n := range []int{16, 0, -15, 170} {
		_, err := ChoosePGVersion(ask(n), have)
		if ErrorKindOf(err) != KindInvalid || !strings.Contains(err.Error(), "15, 17") {
			t.Errorf("%d asked: %v, want invalid naming 15, 17", n, err)
		}
	}
	if _, err := ChoosePGVersion(nil, nil); err == nil {
		t.Error("no version installed: no error")
	}
}
