package dbcloud

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a compute allocation. The zero CPU and memory of a shared size mean
// "a small slice of a shared host", not zero.
type Size struct {
	Shared    bool `json:"shared,omitempty"`
	CPUMillis int  `json:"cpu_millis,omitempty"`
	MemoryGBs int  `json:"memory_gbs,omitempty"`
}

// SharedSize is the size of a service on shared resources.
var SharedSize = Size{Shared: true}

// DefaultSize is used when a create names neither CPU nor memory.
var DefaultSize = Size{CPUMillis: 500, MemoryGBs: 2}

// DefaultSizes is the default table of allowed CPU/memory pairs.
var DefaultSizes = []Size{
	SharedSize,
	{CPUMillis: 500, MemoryGBs: 2},
	{CPUMillis: 1000, MemoryGBs: 4},
	{CPUMillis: 2000, MemoryGBs: 8},
	{CPUMillis: 4000, MemoryGBs: 16},
	{CPUMillis: 8000, MemoryGBs: 32},
	{CPUMillis: 16000, MemoryGBs: 64},
	{CPUMillis: 32000, MemoryGBs: 128},
}

func (s Size) String() string {
	if s.Shared {
		return "shared/shared"
	}
	return fmt.Sprintf("%d/%d", s.CPUMillis, s.MemoryGBs)
}

// SizeTable is the configured list of allowed sizes.
type SizeTable []Size

func (t SizeTable) Allowed() string {
	parts := make([]string, len(t))
	for i, s := range t {
		parts[i] = s.String()
	}
	return strings.Join(parts, ", ")
}

// Resolve turns the optional cpu and memory strings of a create, fork or
// resize body into an allowed size: given one, the other follows from the
// table; given neither, def. An empty string means "not given".
func (t SizeTable) Resolve(cpu, mem string, def Size) (Size, error) {
	if cpu == "" && mem == "" {
		return def, nil
	}
	bad := func() error {
		return Errorf(KindInvalid, "cpu_millis %q and memory_gbs %q are not an allowed size; allowed cpu_millis/memory_gbs pairs: %s.",
			cpu, mem, t.Allowed())
	}
	var want Size
	if cpu != "" {
		c, shared, ok := parseAmount(cpu)
		if !ok {
			return Size{}, bad()
		}
		want.Shared, want.CPUMillis = shared, c
	}
	if mem != "" {
		m, shared, ok := parseAmount(mem)
		if !ok {
			return Size{}, bad()
		}
		if cpu != "" && shared != want.Shared {
			return Size{}, bad()
		}
		want.Shared, want.MemoryGBs = shared, m
	}
	for _, s := range t {
		if s.Shared != want.Shared {
			continue
		}
		if s.Shared ||
			(cpu == "" || s.CPUMillis == want.CPUMillis) && (mem == "" || s.MemoryGBs == want.MemoryGBs) {
			return s, nil
		}
	}
	return Size{}, bad()
}

// ResolveNumbers checks a numeric pair, as read replica sets take them.
func (t SizeTable) ResolveNumbers(cpu, mem int) (Size, error) {
	for _, s := range t {
		if !s.Shared && s.CPUMillis == cpu && s.MemoryGBs == mem {
			return s, nil
		}
	}
	return Size{}, Errorf(KindInvalid, "cpu_millis %d and memory_gbs %d are not an allowed size; allowed pairs: %s.",
		cpu, mem, SizeTable(t.Dedicated()).Allowed())
}

func (t SizeTable) Dedicated() []Size {
	var out []Size
	for _, s := range t {
		if !s.Shared {
			out = append(out, s)
		}
	}
	return out
}

// parseAmount reads "shared" or a positive decimal integer.
func parseAmount(s string) (n int, shared bool, ok bool) {
	if s == "shared" {
		return 0, true, true
	}
	if s == "" || len(s) > 9 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false, false
	}
	n, err := strconv.Atoi(s)
	return n, false, err == nil && n > 0
}

// ParseSizeTable reads sizes from "shared/shared,500/2,..." (the --sizes flag).
func ParseSizeTable(s string) (SizeTable, error) {
	var t SizeTable
	for _, part := range strings.Split(s, ",") {
		cpu, mem, ok := strings.Cut(strings.TrimSpace(part), "/")
		c, cs, ok1 := parseAmount(cpu)
		m, ms, ok2 := parseAmount(mem)
		if !ok || !ok1 || !ok2 || cs != ms {
			return nil, fmt.Errorf("size %q: want CPU_MILLIS/MEMORY_GBS or shared/shared", part)
		}
		t = append(t, Size{Shared: cs, CPUMillis: c, MemoryGBs: m})
	}
	return t, nil
}
