package dbcloud_test

import (
	"go/build"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestLayers holds the layering of docs/ARCHITECTURE.md: data flows down,
// nothing flows up. It reads the production imports (tests may reach
// further) of every package in the module, transitively.
func TestLayers(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	l := layers{root: filepath.Dir(file), deps: map[string][]string{}}
	adapters := []string{"dbcloud/sqlite", "dbcloud/postgres", "dbcloud/sqlstore", "dbcloud/engine",
		"dbcloud/runtime/local", "dbcloud/runtime/kubernetes", "dbcloud/network/loopback"}
	for _, rule := range []struct {
		pkg string
		// may lists the module's packages pkg may reach; nil: any but never.
		may   []string
		never []string
	}{
		// The vocabulary: entities, errors, rules on values, contracts.
		{pkg: "dbcloud", may: []string{"dbcloud/identity"}},
		// Pure packages on the vocabulary.
		{pkg: "dbcloud/sizing", may: []string{"dbcloud", "dbcloud/identity"}},
		{pkg: "dbcloud/history", may: []string{"dbcloud", "dbcloud/identity"}},
		// The service layer decides; it reaches no adapter.
		{pkg: "dbcloud/cloud", may: []string{"dbcloud", "dbcloud/identity", "dbcloud/history", "dbcloud/sizing"}},
		// Adapters implement the vocabulary's contracts and never call the
		// service layer; one runtime never imports the other.
		{pkg: "dbcloud/engine", never: []string{"dbcloud/cloud", "dbcloud/runtime/local", "dbcloud/runtime/kubernetes"}},
		{pkg: "dbcloud/sqlite", never: []string{"dbcloud/cloud"}},
		{pkg: "dbcloud/postgres", never: []string{"dbcloud/cloud"}},
		{pkg: "dbcloud/runtime/local", never: []string{"dbcloud/cloud", "dbcloud/runtime/kubernetes", "dbcloud/engine"}},
		{pkg: "dbcloud/runtime/kubernetes", never: []string{"dbcloud/cloud", "dbcloud/runtime/local", "dbcloud/engine"}},
		{pkg: "dbcloud/network/loopback", never: []string{"dbcloud/cloud"}},
		// The transport translates; it does not reach past the service layer.
		{pkg: "dbcloud/http", never: adapters},
		{pkg: "dbcloud/console", never: adapters},
	} {
		reach := l.reach(t, rule.pkg)
		for _, p := range reach {
			if rule.may != nil && !slices.Contains(rule.may, p) {
				t.Errorf("%s reaches %s; it may reach only %v", rule.pkg, p, rule.may)
			}
			if slices.Contains(rule.never, p) || slices.ContainsFunc(rule.never, func(n string) bool { return strings.HasPrefix(p, n+"/") }) {
				t.Errorf("%s reaches %s", rule.pkg, p)
			}
		}
	}
}

type layers struct {
	root string
	deps map[string][]string
}

// reach lists the module's packages pkg imports, directly or not.
func (l layers) reach(t *testing.T, pkg string) []string {
	seen := map[string]bool{}
	var walk func(p string)
	walk = func(p string) {
		for _, d := range l.imports(t, p) {
			if !seen[d] {
				seen[d] = true
				walk(d)
			}
		}
	}
	walk(pkg)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// imports lists the module's packages that pkg's non-test files import.
func (l layers) imports(t *testing.T, pkg string) []string {
	if d, ok := l.deps[pkg]; ok {
		return d
	}
	dir := filepath.Join(l.root, strings.TrimPrefix(strings.TrimPrefix(pkg, "dbcloud"), "/"))
	bp, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatalf("%s: %v", pkg, err)
	}
	var out []string
	for _, imp := range bp.Imports {
		if imp == "dbcloud" || strings.HasPrefix(imp, "dbcloud/") {
			out = append(out, imp)
		}
	}
	l.deps[pkg] = out
	return out
}
