package docblock

import "testing"

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
