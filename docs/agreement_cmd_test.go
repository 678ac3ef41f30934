package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// definedFlags returns the flags the Go files of the command directory dir
// (../cmd/espd, ../cmd/espctl) define with package flag: the name of every
// fs.String("name", ...), fs.IntVar(&v, "name", ...), fs.Var(v, "name", ...).
func definedFlags(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := `(?:Bool|String|Int|Int64|Uint|Uint64|Float64|Duration|Func|BoolFunc|Text)`
	def := regexp.MustCompile(`\.(?:` + kinds + `\(|(?:` + kinds + `)?Var\([^,()]+,\s*)"([a-z][a-z0-9-]*)"`)
	flags := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			flags[m[1]] = true
		}
	}
	if len(flags) < 10 {
		t.Fatalf("%s defines %d flags: the pattern no longer finds them", dir, len(flags))
	}
	return flags
}

// commandFlags returns the --flags a page gives espd or espctl: on one line,
// the words after "espd" or "espctl" (also /usr/sbin/espd, ...) up to a
// backtick, a pipe, ';', '&', ')' or the line's end; each word starting
// with "--" is a flag (without "=value"). A --flag written apart from the
// command ("run it with `--udp-port 4501`") is not read.
func commandFlags(page string) map[string][]string {
	cmd := regexp.MustCompile("(?m)(?:^|[\\s`(/\"'])(espd|espctl)((?:[ \\t]+[^\\s`|;&)]+)*)")
	out := map[string][]string{}
	for _, m := range cmd.FindAllStringSubmatch(page, -1) {
		for _, w := range strings.Fields(m[2]) {
			if f, ok := strings.CutPrefix(w, "--"); ok && f != "" {
				f, _, _ = strings.Cut(f, "=")
				f = strings.TrimRight(f, ".,:")
				if !slices.Contains(out[m[1]], f) {
					out[m[1]] = append(out[m[1]], f)
				}
			}
		}
	}
	return out
}

// TestDocFlags: every --flag a page gives espd or espctl exists.
func TestDocFlags(t *testing.T) {
	defined := map[string]map[string]bool{
		"espd":   definedFlags(t, "../cmd/espd"),
		"espctl": definedFlags(t, "../cmd/espctl"),
	}
	n := 0
	for name, page := range agreementPages(t) {
		for cmd, flags := range commandFlags(page) {
			for _, f := range flags {
				n++
				if !defined[cmd][f] {
					t.Errorf("%s gives %s --%s, which %s does not have", name, cmd, f, cmd)
				}
			}
		}
	}
	t.Logf("%d flags given to espd and espctl checked", n)
	if n < 20 {
		t.Errorf("found %d flags given to espd and espctl in the pages: the reader has stopped finding them", n)
	}
}

// TestCommandFlags pins what commandFlags reads.
func TestCommandFlags(t *testing.T) {
	page := "espd --tun esp0 --socket=/run/x.sock && swanctl --load-all\n" +
		"`/usr/sbin/espd --config /etc/espd/espd.toml --ike-handoff`\n" +
		"run espd with `--udp-port 4501`; espctl sa add --spi 0x100 | grep --count x\n" +
		"libstrongswan-espd --nope, espd-ike --nope2\n"
	got := commandFlags(page)
	want := map[string][]string{"espd": {"tun", "socket", "config", "ike-handoff"}, "espctl": {"spi"}}
	for cmd, w := range want {
		if !slices.Equal(got[cmd], w) {
			t.Errorf("commandFlags[%s] = %v, want %v", cmd, got[cmd], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("commandFlags = %v", got)
	}
}
