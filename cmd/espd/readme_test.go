package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// flagTableMarker marks docs/reference.md's table of espd's flags
// ("<!-- table espd-flags -->", docblock.Tables).
const flagTableMarker = "espd-flags"

// readmeFlags returns the flags that the first column of docs/reference.md's
// table marked flagTableMarker names, in table order.
func readmeFlags(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	tables := docblock.MarkedTables(docblock.Tables(string(b)), flagTableMarker)
	if len(tables) != 1 {
		t.Fatalf("docs/reference.md: want one table marked %q, have %d", flagTableMarker, len(tables))
	}
	name := regexp.MustCompile("`--([a-z0-9-]+)`")
	var flags []string
	for _, row := range tables[0].Rows[1:] {
		for _, m := range name.FindAllStringSubmatch(row[0], -1) {
			flags = append(flags, m[1])
		}
	}
	if len(flags) == 0 {
		t.Fatalf("docs/reference.md's table %q names no flag", flagTableMarker)
	}
	return flags
}

// helpFlags returns the flags that "espd -h" lists, built from this
// checkout.
func helpFlags(t *testing.T) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "espd")
	if err := testbed.GoBuild(bin, testbed.EspdPackage); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-h").CombinedOutput()
	// flag.ContinueOnError: -h prints the usage and fails with ErrHelp.
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
		t.Fatalf("espd -h: %v\n%s", err, out)
	}
	re := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	var flags []string
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	if len(flags) == 0 {
		t.Fatalf("espd -h lists no flags:\n%s", out)
	}
	return flags
}

// TestReadmeFlagTable checks that docs/reference.md's flag table (marked
// flagTableMarker, in section "espd") and "espd -h" name the same flags,
// each once in the table.
func TestReadmeFlagTable(t *testing.T) {
	table, help := readmeFlags(t), helpFlags(t)
	seen := map[string]bool{}
	for _, f := range table {
		if seen[f] {
			t.Errorf("docs/reference.md's flag table has --%s twice", f)
		}
		seen[f] = true
		if !slices.Contains(help, f) {
			t.Errorf("docs/reference.md's flag table has --%s, which espd -h does not list", f)
		}
	}
	for _, f := range help {
		if !seen[f] {
			t.Errorf("espd -h lists -%s, which docs/reference.md's flag table (%q) lacks", f, flagTableMarker)
		}
	}
}
