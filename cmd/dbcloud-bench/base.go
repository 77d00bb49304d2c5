package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// baseline is an older commit checked out beside the working tree, so
// that every section can run there too, in the same run and alternating
// with ours: "old numbers beside new" without trusting a report from
// another day on a shared, noisy machine.
type baseline struct {
	Rev    string // as given
	Commit string // short hash
	Dir    string // a detached worktree of it
}

// checkoutBaseline makes a detached worktree of rev in a new temporary
// directory; remove it with close.
func checkoutBaseline(ctx context.Context, rev string) (*baseline, error) {
	commit, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", rev+"^{commit}").Output()
	if err != nil {
		return nil, fmt.Errorf("-base %s: not a commit: %v", rev, err)
	}
	dir, err := os.MkdirTemp("", "dbcloud-bench-base-")
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, "git", "worktree", "add", "--detach", dir, rev).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("-base %s: git worktree add: %v: %s", rev, err, strings.TrimSpace(string(out)))
	}
	return &baseline{Rev: rev, Commit: strings.TrimSpace(string(commit)), Dir: dir}, nil
}

// close removes the worktree.
func (b *baseline) close() error {
	out, err := exec.Command("git", "worktree", "remove", "--force", b.Dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("git worktree remove %s: %v: %s", b.Dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// label marks a row measured on the baseline.
func (b *baseline) label(name string) string { return name + " (base " + b.Commit + ")" }

// interleave puts each baseline row right after our row of the same
// name, so a table reads old beside new; baseline rows without a
// counterpart (a benchmark since removed) come last.
func (b *baseline) interleave(ours, base []Result) []Result {
	byName := map[string]Result{}
	for _, r := range base {
		byName[r.Name] = r
	}
	out := make([]Result, 0, len(ours)+len(base))
	for _, r := range ours {
		out = append(out, r)
		if old, ok := byName[r.Name]; ok {
			out = append(out, Result{Name: b.label(old.Name), Metrics: old.Metrics})
			delete(byName, r.Name)
		}
	}
	for _, r := range base {
		if _, left := byName[r.Name]; left {
			out = append(out, Result{Name: b.label(r.Name), Metrics: r.Metrics})
		}
	}
	return out
}
