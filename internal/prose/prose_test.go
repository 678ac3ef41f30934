package prose

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const (
	maxFlagHelp   = 120
	maxLogMessage = 160
)

// flagFuncs are the flag package's definers; their last argument is the
// help (Func's and BoolFunc's second).
var flagFuncs = map[string]bool{
	"Bool": true, "BoolVar": true, "Int": true, "IntVar": true, "Int64": true, "Int64Var": true,
	"Uint": true, "UintVar": true, "Uint64": true, "Uint64Var": true, "String": true, "StringVar": true,
	"Float64": true, "Float64Var": true, "Duration": true, "DurationVar": true, "Var": true,
	"Func": true, "BoolFunc": true, "TextVar": true,
}

// logFuncs are slog's and log's record makers, with the index of the message.
var logFuncs = map[string]int{
	"Debug": 0, "Info": 0, "Warn": 0, "Error": 0,
	"DebugContext": 1, "InfoContext": 1, "WarnContext": 1, "ErrorContext": 1, "Log": 2,
	"Printf": 0, "Println": 0, "Print": 0, "Fatalf": 0, "Fatal": 0, "Panicf": 0,
}

// TestFlagHelpAndLogLength: no flag help over 120 characters and no log
// message over 160 in the product's Go code (tests, generators and the
// bench module's harness excepted: they speak to developers).
func TestFlagHelpAndLogLength(t *testing.T) {
	root := filepath.Join("..", "..")
	flags, logs := 0, 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case strings.HasPrefix(d.Name(), ".") && rel != ".", d.Name() == "testdata",
				rel == "bench", strings.HasSuffix(rel, "/gen"):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			name := sel.Sel.Name
			if flagFuncs[name] && len(call.Args) >= 3 && isFlagSet(sel.X) {
				help := call.Args[len(call.Args)-1]
				if name == "Func" || name == "BoolFunc" {
					help = call.Args[1]
				}
				if s, ok := literal(help); ok {
					flags++
					if len(s) > maxFlagHelp {
						t.Errorf("%s: flag help of %d characters (at most %d): %q", fset.Position(call.Pos()), len(s), maxFlagHelp, s)
					}
				}
			}
			if i, ok := logFuncs[name]; ok && len(call.Args) > i && isLogger(sel.X) {
				if s, ok := literal(call.Args[i]); ok {
					logs++
					if len(s) > maxLogMessage {
						t.Errorf("%s: log message of %d characters (at most %d): %q", fset.Position(call.Pos()), len(s), maxLogMessage, s)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scan must have found what it checks, or it checks nothing.
	if flags < 20 || logs < 50 {
		t.Fatalf("found %d flag helps and %d log messages: the scan misses them", flags, logs)
	}
}

// isFlagSet reports whether x names the flag package or a *FlagSet by
// the names the tree gives them.
func isFlagSet(x ast.Expr) bool {
	id, ok := x.(*ast.Ident)
	return ok && (id.Name == "flag" || id.Name == "fs" || strings.HasSuffix(id.Name, "Flags"))
}

// isLogger reports whether x is a logger: log, slog, or an expression
// ending in log or logger (d.log, n.cfg.Logger).
func isLogger(x ast.Expr) bool {
	var name string
	switch e := x.(type) {
	case *ast.Ident:
		name = e.Name
	case *ast.SelectorExpr:
		name = e.Sel.Name
	default:
		return false
	}
	n := strings.ToLower(name)
	return n == "log" || n == "slog" || n == "logger" || strings.HasSuffix(n, "log") || strings.HasSuffix(n, "logger")
}

// literal returns the value of a string literal or a sum of them.
func literal(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := literal(e.X)
		b, ok2 := literal(e.Y)
		return a + b, ok1 && ok2
	case *ast.ParenExpr:
		return literal(e.X)
	}
	return "", false
}
