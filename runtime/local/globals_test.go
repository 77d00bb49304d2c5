package local

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoPackageState keeps state out of package-level variables anywhere
// in the runtime: state lives on structs that a Runtime opens and closes,
// so two runtimes in one process (tests do that) never share a lock, a
// cache or a child process, and ownership is visible. A package-level var
// may only be an interface assertion (var _ I = ...), a compiled regexp or
// a sentinel error, which never change.
func TestNoPackageState(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if name.Name == "_" {
						continue
					}
					if i < len(vs.Values) && immutable(vs.Values[i]) {
						continue
					}
					t.Errorf("%s: package-level var %s holds state; put it on the struct that owns it",
						fset.Position(name.Pos()), name.Name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// immutable reports whether a var's initial value is one that code never
// changes: regexp.MustCompile(...) or errors.New(...).
func immutable(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return false
	}
	return pkg.Name == "regexp" && sel.Sel.Name == "MustCompile" || pkg.Name == "errors" && sel.Sel.Name == "New"
}

// TestSubpackagesTakeSpecs keeps the domain out of the runtime's
// sub-packages: they take paths and specs, and runtime/local alone turns
// services into them (and their typed errors into users' sentences).
func TestSubpackagesTakeSpecs(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Dir(path) == "." || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if imp.Path.Value == `"dbcloud"` {
				t.Errorf("%s imports the domain package; sub-packages of runtime/local take paths and specs", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
