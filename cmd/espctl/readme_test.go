package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/sa"
)

// saAddTableMarker marks docs/reference.md's table of sa add's flags
// ("<!-- table espctl-sa-add-flags -->", docblock.Tables).
const saAddTableMarker = "espctl-sa-add-flags"

// globalFlags are espctl's own options, which every command accepts too
// and docs/reference.md's synopsis ("espctl [-s SOCKET] [--json] COMMAND") gives
// instead of each command's table.
var globalFlags = []string{"json"}

// saAddTable returns the rows of docs/reference.md's table of sa add's flags,
// header left out, by the flags of their first column.
func saAddTable(t *testing.T) (order []string, rows map[string][]string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	tables := docblock.MarkedTables(docblock.Tables(string(b)), saAddTableMarker)
	if len(tables) != 1 {
		t.Fatalf("docs/reference.md: want one table marked %q, have %d", saAddTableMarker, len(tables))
	}
	name := regexp.MustCompile("`--([a-z0-9-]+)`")
	rows = map[string][]string{}
	for _, row := range tables[0].Rows[1:] {
		if len(row) != 3 {
			t.Errorf("docs/reference.md's table %q: row %q has %d cells, want 3 (flag, default, meaning)", saAddTableMarker, row, len(row))
			continue
		}
		for _, m := range name.FindAllStringSubmatch(row[0], -1) {
			if _, dup := rows[m[1]]; dup {
				t.Errorf("docs/reference.md's table %q has --%s twice", saAddTableMarker, m[1])
			}
			order = append(order, m[1])
			rows[m[1]] = row
		}
	}
	if len(order) == 0 {
		t.Fatalf("docs/reference.md's table %q names no flag", saAddTableMarker)
	}
	return order, rows
}

// saAddHelp returns the flags that "espctl sa add -h" lists.
func saAddHelp(t *testing.T) []string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"sa", "add", "-h"}, strings.NewReader(""), &out, &errb); code != exitOK {
		t.Fatalf("espctl sa add -h: exit %d\n%s%s", code, out.String(), errb.String())
	}
	help := out.String() + errb.String()
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags = append(flags, m[1])
	}
	if len(flags) == 0 {
		t.Fatalf("espctl sa add -h lists no flags:\n%s", help)
	}
	return flags
}

// TestReadmeSAAddTable holds docs/reference.md's table of sa add's flags to the
// command: every flag "espctl sa add -h" lists but the global ones is in
// the table, once, and every flag of the table is one the command defines.
// The defaults that the code has as values (the flags' own defaults and
// sa.DefaultConfig's) are the ones the table gives.
func TestReadmeSAAddTable(t *testing.T) {
	order, rows := saAddTable(t)
	help := saAddHelp(t)
	for _, f := range order {
		if !slices.Contains(help, f) || slices.Contains(globalFlags, f) {
			t.Errorf("docs/reference.md's table %q has --%s, which espctl sa add does not define as its own", saAddTableMarker, f)
		}
	}
	for _, f := range help {
		if _, ok := rows[f]; !ok && !slices.Contains(globalFlags, f) {
			t.Errorf("espctl sa add -h lists -%s, which docs/reference.md's table %q lacks", f, saAddTableMarker)
		}
	}

	fs := newSAFlags("sa add", "config").fs
	onOff := map[string]string{"true": "on", "false": "off"}
	want := map[string]string{
		"replay-window": fmt.Sprint(sa.DefaultReplayWindow),
		"ttl":           fmt.Sprint(sa.DefaultTTL),
		"ecn":           onOff[fs.Lookup("ecn").DefValue],
		"esn":           onOff[fs.Lookup("esn").DefValue],
		"proto":         "`" + fs.Lookup("proto").DefValue + "`",
		"mode":          "`" + fs.Lookup("mode").DefValue + "`",
	}
	for f, w := range want {
		if row, ok := rows[f]; ok && row[1] != w {
			t.Errorf("docs/reference.md's table %q: --%s's default is %q, the code's %q", saAddTableMarker, f, row[1], w)
		}
	}
}
