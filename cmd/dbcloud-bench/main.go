// Command dbcloud-bench runs every benchmark of dbcloud on this machine, one
// after another, and writes the report: bench/report.md and
// bench/report.json, with the machine, its load and the command that
// redoes each number. A benchmark that fails or does not exist is
// reported as not run, with the reason; the others still run.
//
//	go run ./cmd/dbcloud-bench            # the full run (make bench)
//	go run ./cmd/dbcloud-bench -short     # tiny sizes, a smoke test (make bench-short)
//
// It runs from the module root, as root (the benchmarks start PostgreSQL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dbcloud-bench:", err)
		os.Exit(1)
	}
}

// realReport is where the full run's report lives; a short run must not
// overwrite it.
const realReport = "bench"

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("dbcloud-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	short := fs.Bool("short", false, "tiny sizes: checks that every benchmark and the report work, in a few minutes; numbers are not measurements")
	out := fs.String("out", "", `directory for report.md, report.json and the raw outputs (default "bench", or "bench/out/short" with -short)`)
	only := fs.String("only", "", "run only the sections whose ID matches this regular expression (create, fork, logs, failover, idle, timescale, api-blackbox, api, load, load-open, density)")
	verbose := fs.Bool("v", false, "copy go test's output to stderr as it runs")
	check := fs.Bool("check", false, "exit 1 if a benchmark failed (a missing one is only reported), as CI wants")
	baseRev := fs.String("base", "", "also run every section at this commit (a temporary worktree), alternating with ours in each round, and show its rows beside ours")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		*out = realReport
		if *short {
			*out = filepath.Join(realReport, "out", "short")
		}
	}
	if abs, _ := filepath.Abs(*out); *short && abs == mustAbs(realReport) {
		return fmt.Errorf("-short must not write into %s/: that is the full run's report", realReport)
	}
	if _, err := os.Stat("go.mod"); err != nil {
		return errors.New("run it from the module root (where go.mod is)")
	}
	var filter *regexp.Regexp
	if *only != "" {
		var err error
		if filter, err = regexp.Compile(*only); err != nil {
			return fmt.Errorf("-only: %w", err)
		}
	}
	rawDir := filepath.Join(*out, "raw")
	if *out == realReport {
		rawDir = filepath.Join(realReport, "out", "raw") // ignored by git, beside the committed report
	}
	if err := os.MkdirAll(rawDir, 0o755); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	var base *baseline
	if *baseRev != "" {
		var err error
		if base, err = checkoutBaseline(ctx, *baseRev); err != nil {
			return err
		}
		defer func() {
			if err := base.close(); err != nil {
				logger.Warn("baseline worktree left behind", "dir", base.Dir, "err", err)
			}
		}()
	}

	rep := &Report{Started: time.Now().UTC(), Short: *short, Command: redoCommand(*short, *only, *baseRev), Machine: describeMachine(), LoadStart: loadAverage()}
	if base != nil {
		rep.Base = base.Commit
	}
	logger.Info("benchmarks start", "short", *short, "out", *out, "load_average", rep.LoadStart.String())
	for _, sec := range sections() {
		if filter != nil && !filter.MatchString(sec.ID) {
			continue
		}
		if ctx.Err() != nil {
			rep.Sections = append(rep.Sections, SectionReport{ID: sec.ID, Title: sec.Title, Status: statusNotRun, Reason: "interrupted", Failed: true})
			continue
		}
		rep.Sections = append(rep.Sections, runSection(ctx, sec, base, *short, rawDir, *verbose, stderr, logger))
	}
	rep.Finished, rep.LoadEnd = time.Now().UTC(), loadAverage()
	if err := rep.write(*out); err != nil {
		return err
	}
	logger.Info("report written", "markdown", filepath.Join(*out, "report.md"), "json", filepath.Join(*out, "report.json"),
		"took", rep.Finished.Sub(rep.Started).Round(time.Second).String(), "load_average", rep.LoadEnd.String())
	if err := ctx.Err(); err != nil {
		return err
	}
	if *check {
		var failed []string
		for _, s := range rep.Sections {
			if s.Failed {
				failed = append(failed, s.ID+": "+s.Reason)
			}
		}
		if len(failed) > 0 {
			return fmt.Errorf("%d of %d sections failed:\n%s", len(failed), len(rep.Sections), strings.Join(failed, "\n"))
		}
	}
	return nil
}

func mustAbs(p string) string {
	abs, _ := filepath.Abs(p)
	return abs
}

// redoCommand is the command that makes the same report.
func redoCommand(short bool, only, base string) string {
	cmd := "make bench"
	if short {
		cmd = "make bench-short"
	}
	if only == "" && base == "" {
		return cmd
	}
	cmd = "go run ./cmd/dbcloud-bench"
	if only != "" {
		cmd += " -only '" + only + "'"
	}
	if base != "" {
		cmd += " -base " + base
	}
	if short {
		cmd += " -short"
	}
	return cmd
}

// runSection runs one section's rounds and summarises them. Whatever
// goes wrong is the section's status, never the end of the run.
func runSection(ctx context.Context, sec section, base *baseline, short bool, rawDir string, verbose bool, stderr io.Writer, logger *slog.Logger) SectionReport {
	test, rounds := sec.Test, max(1, sec.Rounds)
	test.Short = short
	if short {
		if sec.ShortTimeout != "" {
			test.Timeout = sec.ShortTimeout
		}
		rounds = max(1, sec.ShortRounds)
	}
	rep := SectionReport{ID: sec.ID, Title: sec.Title, About: sec.About, Command: test.String(), Rounds: rounds,
		Columns: sec.Columns, LoadStart: loadAverage()}
	if rounds > 1 {
		rep.Command = fmt.Sprintf("%s   # %d times; medians", test.String(), rounds)
	}
	logger.Info("section start", "id", sec.ID, "command", test.String(), "rounds", rounds)
	start := time.Now()
	raw, err := os.Create(filepath.Join(rawDir, sec.ID+".txt"))
	if err != nil {
		rep.Status, rep.Reason, rep.Failed = statusNotRun, err.Error(), true
		return rep
	}
	defer raw.Close()
	var w io.Writer = raw
	if verbose {
		w = io.MultiWriter(raw, stderr)
	}
	var all, allBase [][]Result
	var failure, baseFailure error
	runBase := func(i int) {
		if base == nil || baseFailure != nil {
			return
		}
		bt := test
		bt.Dir = filepath.Join(base.Dir, test.Dir)
		fmt.Fprintf(raw, "### round %d of %d at base %s: %s\n", i+1, rounds, base.Commit, bt)
		results, err := bt.run(ctx, w)
		if len(results) > 0 {
			allBase = append(allBase, results)
		}
		baseFailure = err
	}
	for i := range rounds {
		// The baseline goes first in odd rounds, second in even ones, so
		// that a machine warming up or cooling down favours neither.
		if i%2 == 0 {
			runBase(i)
		}
		fmt.Fprintf(raw, "### round %d of %d: %s\n", i+1, rounds, test)
		results, err := test.run(ctx, w)
		if len(results) > 0 {
			all = append(all, results)
		}
		if err != nil {
			failure = err
			break
		}
		if i%2 == 1 {
			runBase(i)
		}
	}
	summarize := sec.Summarize
	if summarize == nil {
		summarize = summarizeMedians
	}
	if len(all) > 0 {
		rep.Results = summarize(all)
	}
	if base != nil {
		var old []Result
		if len(allBase) > 0 {
			old = summarize(allBase)
		}
		rep.Results = base.interleave(rep.Results, old)
		if baseFailure != nil {
			// The baseline may predate a benchmark: said, never a failure of ours.
			rep.BaseNote = fmt.Sprintf("at base %s: %s", base.Commit, baseFailure)
		}
	}
	rep.Seconds, rep.LoadEnd = time.Since(start).Seconds(), loadAverage()
	switch {
	case failure != nil && len(rep.Results) == 0:
		rep.Status, rep.Reason = statusNotRun, failure.Error()
	case failure != nil:
		rep.Status, rep.Reason = statusPartial, failure.Error()
	default:
		rep.Status = statusOK
	}
	rep.Failed = failure != nil && !errors.Is(failure, errMissing) && !errors.Is(failure, errSkipped)
	logger.Info("section done", "id", sec.ID, "status", rep.Status, "seconds", int(rep.Seconds), "reason", rep.Reason)
	return rep
}
