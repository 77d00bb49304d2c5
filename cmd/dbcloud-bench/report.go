package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"dbcloud/internal/atomicfile"
)

// Section statuses.
const (
	statusOK      = "ok"
	statusNotRun  = "not run"
	statusPartial = "failed after partial results"
)

// Report is what a run measured, with where and how.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Short    bool      `json:"short"`
	// Command redoes the whole report, from the module root.
	Command string  `json:"command"`
	Machine Machine `json:"machine"`
	// Base is the commit every section also ran at (-base), if any.
	Base      string          `json:"base,omitempty"`
	LoadStart LoadAverage     `json:"load_average_start"`
	LoadEnd   LoadAverage     `json:"load_average_end"`
	Sections  []SectionReport `json:"sections"`
}

// SectionReport is one section's outcome.
type SectionReport struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	About string `json:"about,omitempty"`
	// Command redoes this section's numbers.
	Command string `json:"command,omitempty"`
	Rounds  int    `json:"rounds,omitempty"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	// BaseNote says why the baseline has no or partial rows.
	BaseNote string `json:"base_note,omitempty"`
	// Failed is set when the benchmark ran and failed, rather than being
	// missing; -check fails the run for it.
	Failed    bool        `json:"failed"`
	Seconds   float64     `json:"seconds"`
	LoadStart LoadAverage `json:"load_average_start"`
	LoadEnd   LoadAverage `json:"load_average_end"`
	Results   []Result    `json:"results"`
	Columns   []column    `json:"-"`
}

// write writes report.json and report.md into dir, each atomically.
func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, "report.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "report.md"), []byte(r.Markdown()), 0o644)
}

// Markdown renders the report for people.
func (r *Report) Markdown() string {
	var b strings.Builder
	title := "# dbcloud benchmarks"
	if r.Short {
		title += " (short mode: a smoke test, not measurements)"
	}
	fmt.Fprintf(&b, "%s\n\n", title)
	fmt.Fprintf(&b, "Run %s to %s (%s). Redo it from the module root, as root: `%s`.\n\n",
		r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339), r.Finished.Sub(r.Started).Round(time.Second), r.Command)
	m := r.Machine
	fmt.Fprintf(&b, "| machine | |\n|---|---|\n")
	for _, row := range [][2]string{
		{"CPU", fmt.Sprintf("%s, %d cores", m.CPU, m.Cores)},
		{"memory", fmt.Sprintf("%.1f GiB", m.MemoryGiB)},
		{"OS, kernel", m.OS + ", " + m.Kernel},
		{"data directory", fmt.Sprintf("%s (%s)", m.DataDir, m.Filesystem)},
		{"Go", m.Go},
		{"PostgreSQL", m.PostgreSQL},
		{"commit", m.Commit},
		{"baseline", baseRow(r.Base)},
		{"load average (1, 5, 15 min)", fmt.Sprintf("%s at the start, %s at the end", r.LoadStart, r.LoadEnd)},
	} {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], row[1])
	}
	b.WriteString("\nThis machine may be shared with other work (the load averages show how much), so absolute numbers are noisy. " +
		"Each comparison (forks beside cp -a, the log reader beside tac | grep, the API beside a minimal server) is " +
		"taken in the same run, alternating, so that the noise falls on both sides.\n")
	for _, s := range r.Sections {
		fmt.Fprintf(&b, "\n## %s\n\n", s.Title)
		if s.Command != "" {
			fmt.Fprintf(&b, "`%s`\n\n", s.Command)
		}
		switch s.Status {
		case statusNotRun:
			fmt.Fprintf(&b, "**Not run:** %s\n", oneLine(s.Reason))
			continue
		case statusPartial:
			fmt.Fprintf(&b, "**Failed after partial results:** %s\n\n", oneLine(s.Reason))
		}
		if s.About != "" {
			fmt.Fprintf(&b, "%s\n\n", s.About)
		}
		fmt.Fprintf(&b, "Took %s; load average %s before, %s after.\n\n", time.Duration(s.Seconds*float64(time.Second)).Round(time.Second), s.LoadStart, s.LoadEnd)
		b.WriteString(table(s))
		if s.BaseNote != "" {
			fmt.Fprintf(&b, "\nBaseline: %s\n", oneLine(s.BaseNote))
		}
	}
	return b.String()
}

func baseRow(commit string) string {
	if commit == "" {
		return "none (run with -base REV to measure an older commit beside this one)"
	}
	return commit + ": its rows, marked (base " + commit + "), ran in the same rounds as ours, alternating"
}

// table renders a section's results under its columns; a metric no
// column names is still shown, after them.
func table(s SectionReport) string {
	columns := s.Columns
	named := map[string]bool{}
	for _, c := range columns {
		named[c.Key] = true
	}
	for _, r := range s.Results {
		for _, k := range sortedKeys(r.Metrics) {
			// ns/op is the whole benchmark's time when it reports its own metrics.
			if !named[k] && k != "ns/op" {
				named[k] = true
				columns = append(columns, column{k, k})
			}
		}
	}
	var shown []column
	for _, c := range columns {
		for _, r := range s.Results {
			if _, ok := r.Metrics[c.Key]; ok {
				shown = append(shown, c)
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString("| |")
	for _, c := range shown {
		b.WriteString(" " + cell(c.Header) + " |")
	}
	b.WriteString("\n|---|")
	for range shown {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, r := range s.Results {
		b.WriteString("| " + cell(strings.TrimPrefix(r.Name, "Benchmark")) + " |")
		for _, c := range shown {
			v, ok := r.Metrics[c.Key]
			if ok {
				b.WriteString(" " + formatNumber(v) + " |")
			} else {
				b.WriteString(" |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// formatNumber keeps three significant digits, which is more than the
// noise of this machine allows anyway.
func formatNumber(v float64) string {
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e9:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func sortedKeys(m map[string]float64) []string { return slices.Sorted(maps.Keys(m)) }

// cell escapes what would end a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
