// Package docs holds espd's documentation; its tests hold the code to the
// import table of architecture.md, the example configuration the espd
// package ships to that of config.md, and run deploy.md's commands as
// written.
package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/espd/espd/conn"
)

const module = "github.com/espd/espd"

// layering reads the tables of architecture.md: for each package, the
// espd packages it may import, and for the packages of the levelled table
// (espd itself), their level.
func layering(t *testing.T) (rows map[string]map[string]bool, levels map[string]int) {
	t.Helper()
	f, err := os.Open("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	name := regexp.MustCompile("`([a-z0-9/]+)`")
	rows, levels = map[string]map[string]bool{}, map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		var pkgs []string
		for _, c := range cells[:len(cells)-1] {
			if m := name.FindAllStringSubmatch(c, -1); m != nil {
				for _, x := range m {
					pkgs = append(pkgs, x[1])
				}
				break
			}
		}
		if pkgs == nil {
			continue // a header row
		}
		allowed := map[string]bool{}
		for _, a := range strings.Split(cells[len(cells)-1], ",") {
			if a = strings.TrimSpace(a); a != "" {
				allowed[a] = true
			}
		}
		level, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err == nil && len(pkgs) != 1 {
			t.Errorf("architecture.md: level %d row without one package: %q", level, line)
		}
		for _, p := range pkgs {
			if rows[p] != nil {
				t.Errorf("architecture.md: %s has two rows", p)
			}
			rows[p] = allowed
			if err == nil {
				levels[p] = level
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows, levels
}

// imports returns, for each package of the module, the module's packages
// that its non-test files import, from go list.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module+"/")
		if !ok || pkg == "docs" {
			continue
		}
		got[pkg] = []string{}
		for _, imp := range f[1:] {
			if dep, ok := strings.CutPrefix(imp, module+"/"); ok {
				got[pkg] = append(got[pkg], dep)
			}
		}
	}
	return got
}

// TestLayering fails when a package imports an espd package that its row
// of architecture.md does not name, or has no row.
func TestLayering(t *testing.T) {
	rows, _ := layering(t)
	if len(rows) < 10 {
		t.Fatalf("architecture.md: only %d package rows found", len(rows))
	}
	got := imports(t)
	if len(got) < 10 {
		t.Fatalf("go list found only %d packages", len(got))
	}
	for pkg, deps := range got {
		allowed, ok := rows[pkg]
		if !ok {
			t.Errorf("%s has no row in architecture.md's import tables", pkg)
			continue
		}
		for _, dep := range deps {
			if !allowed[dep] {
				t.Errorf("%s imports %s, which its row in architecture.md does not allow", pkg, dep)
			}
		}
	}
	for pkg := range rows {
		if _, ok := got[pkg]; !ok {
			t.Errorf("architecture.md has a row for %s, which go list does not find", pkg)
		}
	}
}

// TestLevels fails when a row of architecture.md's levelled table allows
// an import that does not go down the table: a package of a higher level,
// or one of the test and measurement packages, which espd never imports.
func TestLevels(t *testing.T) {
	rows, lv := layering(t)
	if len(lv) < 10 {
		t.Fatalf("architecture.md: only %d levelled rows found", len(lv))
	}
	for pkg, n := range lv {
		for dep := range rows[pkg] {
			d, ok := lv[dep]
			switch {
			case !ok:
				t.Errorf("architecture.md: %s (level %d) may import %s, which is not one of espd's levelled packages", pkg, n, dep)
			case d > n:
				t.Errorf("architecture.md: %s (level %d) may import %s (level %d): imports only go down", pkg, n, dep, d)
			}
		}
	}
}

// TestDataplaneTakesItsIO holds the data plane to "the pipeline only": its
// non-test files import neither routing nor netlink, call no constructor of
// tun or conn (Create*, Open*), and conn.Bind, what it sends and receives
// through, has no IKE relay in it.
func TestDataplaneTakesItsIO(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("../dataplane/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("dataplane's files: %v %v", files, err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == module+"/routing" || strings.Contains(path, "netlink") {
				t.Errorf("%s imports %s: the caller owns the routes", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && (pkg.Name == "tun" || pkg.Name == "conn") &&
				(strings.HasPrefix(sel.Sel.Name, "Create") || strings.HasPrefix(sel.Sel.Name, "Open")) {
				t.Errorf("%s: %s.%s: the caller creates the data plane's devices and sockets", fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name)
			}
			return true
		})
	}
	bind := reflect.TypeOf((*conn.Bind)(nil)).Elem()
	for i := range bind.NumMethod() {
		if m := bind.Method(i).Name; strings.Contains(m, "IKE") {
			t.Errorf("conn.Bind has %s: the IKE relay is conn.IKE, the daemon's", m)
		}
	}
}

// TestWireIsPure holds control/wire to "pure": its non-test files import
// nothing that does I/O or coordinates goroutines (net but net/netip, os,
// io, syscall, golang.org/x/sys, sync, context) and start no goroutine.
// The control socket's I/O is package control's.
func TestWireIsPure(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("../control/wire/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("control/wire's files: %v %v", files, err)
	}
	impure := func(path string) bool {
		for _, p := range []string{"net", "os", "io", "syscall", "golang.org/x/sys", "sync", "context"} {
			if path == p || strings.HasPrefix(path, p+"/") {
				return path != "net/netip"
			}
		}
		return false
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); impure(path) {
				t.Errorf("%s imports %s: the codec does no I/O", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s: a go statement: the codec starts no goroutine", fset.Position(g.Pos()))
			}
			return true
		})
	}
}
