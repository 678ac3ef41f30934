package docblock

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	text := "# Title\n\n```sh quick-start gateway A\necho a\n  echo b\n```\n\n## Flags\n\n```\nplain\n```\n```go\nx\n```\n```sh open\nrest\n"
	got := Parse(text)
	want := []Block{
		{Lang: "sh", Marker: "quick-start gateway A", Line: 3, Text: "echo a\n  echo b\n", Section: "Title"},
		{Lang: "", Marker: "", Line: 10, Text: "plain\n", Section: "Flags"},
		{Lang: "go", Marker: "", Line: 13, Text: "x\n", Section: "Flags"},
		{Lang: "sh", Marker: "open", Line: 16, Text: "rest\n", Section: "Flags"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if m := Marked(got, "quick-start gateway A"); len(m) != 1 || m[0].Line != 3 {
		t.Errorf("Marked: got %+v", m)
	}
	if m := Marked(got, "gateway A"); len(m) != 0 {
		t.Errorf("Marked matched a marker that is only a suffix: %+v", m)
	}
}

func TestTables(t *testing.T) {
	text := "<!-- table flags -->\n| flag | meaning |\n| --- | :-: |\n| `--a` | x\\|y |\n|`--b`|z|\n\n" +
		"```md\n| in | fence |\n```\n<!-- table other -->\n\n| plain |\n|---|\n| row |\n"
	got := Tables(text)
	if len(got) != 2 {
		t.Fatalf("got %d tables %+v, want 2", len(got), got)
	}
	want := [][]string{{"flag", "meaning"}, {"`--a`", "x|y"}, {"`--b`", "z"}}
	if got[0].Marker != "flags" || got[0].Line != 2 || len(got[0].Rows) != len(want) {
		t.Fatalf("table 0: %+v", got[0])
	}
	for i, row := range want {
		if len(got[0].Rows[i]) != len(row) {
			t.Fatalf("table 0 row %d: got %q, want %q", i, got[0].Rows[i], row)
		}
		for j := range row {
			if got[0].Rows[i][j] != row[j] {
				t.Errorf("table 0 row %d: got %q, want %q", i, got[0].Rows[i], row)
			}
		}
	}
	// A blank line between the comment and the table unmarks it.
	if got[1].Marker != "" || got[1].Line != 12 || len(got[1].Rows) != 2 {
		t.Errorf("table 1: %+v", got[1])
	}
	if m := MarkedTables(got, "flags"); len(m) != 1 || m[0].Line != 2 {
		t.Errorf("MarkedTables: %+v", m)
	}
}

func TestOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	doc := "# T\n\n```sh run me\necho a\n```\n\n```toml run me\nx = 1\n```\n\n```sh twice\n```\n```sh twice\n```\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := One(path, "sh", "run me"); err != nil || got != "echo a\n" {
		t.Errorf("One(sh, run me) = %q, %v; want \"echo a\\n\"", got, err)
	}
	if got, err := One(path, "toml", "run me"); err != nil || got != "x = 1\n" {
		t.Errorf("One(toml, run me) = %q, %v", got, err)
	}
	for _, m := range []string{"twice", "absent"} {
		if _, err := One(path, "sh", m); err == nil {
			t.Errorf("One(sh, %s): no error", m)
		}
	}
}
