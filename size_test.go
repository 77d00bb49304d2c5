package dbcloud_test

import (
	"testing"

	"dbcloud"
)

func TestSizeTable_Resolve(t *testing.T) {
	table := dbcloud.SizeTable(dbcloud.DefaultSizes)
	for _, tc := range []struct {
		cpu, mem string
		want     dbcloud.Size
		err      bool
	}{
		{"", "", dbcloud.DefaultSize, false},
		{"500", "2", dbcloud.Size{CPUMillis: 500, MemoryGBs: 2}, false},
		{"1000", "", dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}, false},
		{"", "128", dbcloud.Size{CPUMillis: 32000, MemoryGBs: 128}, false},
		{"shared", "", dbcloud.SharedSize, false},
		{"", "shared", dbcloud.SharedSize, false},
		{"shared", "shared", dbcloud.SharedSize, false},
		{"shared", "2", dbcloud.Size{}, true},
		{"500", "4", dbcloud.Size{}, true},
		{"0500", "", dbcloud.Size{CPUMillis: 500, MemoryGBs: 2}, false},
		{"250", "", dbcloud.Size{}, true},
		{"-500", "", dbcloud.Size{}, true},
		{"1e3", "", dbcloud.Size{}, true},
		{"0", "", dbcloud.Size{}, true},
		{"99999999999", "", dbcloud.Size{}, true},
	} {
		got, err := table.Resolve(tc.cpu, tc.mem, dbcloud.DefaultSize)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("Resolve(%q, %q) = %v, %v; want %v, error %v", tc.cpu, tc.mem, got, err, tc.want, tc.err)
		}
		if err != nil && dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
			t.Errorf("Resolve(%q, %q): error kind %v, want invalid", tc.cpu, tc.mem, dbcloud.ErrorKindOf(err))
		}
	}
}

func TestParseSizeTable(t *testing.T) {
	got, err := dbcloud.ParseSizeTable("shared/shared, 500/2,1000/4")
	if err != nil || len(got) != 3 || !got[0].Shared || got[2] != (dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}) {
		t.Fatalf("ParseSizeTable = %v, %v", got, err)
	}
	for _, bad := range []string{"", "500", "500/shared", "a/b", "500/2,"} {
		if _, err := dbcloud.ParseSizeTable(bad); err == nil {
			t.Errorf("ParseSizeTable(%q) accepted", bad)
		}
	}
}
