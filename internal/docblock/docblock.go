// Package docblock finds the fenced code blocks of a Markdown file by their
// explicit markers. A fence's info string is "lang marker...": the first word
// is the language, the rest (trimmed) is the marker, e.g. "```sh quick-start".
// Tests that run a document's commands select blocks by Marker, never by prose;
// tables are marked likewise by an HTML comment above them (Tables).
package docblock

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Block is one fenced code block.
type Block struct {
	Lang    string // first word of the info string ("" if none)
	Marker  string // rest of the info string, trimmed ("" if unmarked)
	Line    int    // 1-based line of the opening fence
	Text    string // body, each line ending in "\n"
	Section string // text of the nearest heading above the block
}

// Blocks returns every fenced block of the file at path, in order.
func Blocks(path string) ([]Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(string(data)), nil
}

// Parse returns every fenced block of the Markdown text, in order. An
// unterminated block runs to the end of the text.
func Parse(text string) []Block {
	var out []Block
	var cur *Block
	var body strings.Builder
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				cur.Text = body.String()
				out = append(out, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			b := Block{Line: n, Section: section}
			if len(info) > 0 {
				b.Lang = info[0]
				b.Marker = strings.Join(info[1:], " ")
			}
			cur = &b
			body.Reset()
			continue
		}
		if strings.HasPrefix(line, "#") {
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	if cur != nil {
		cur.Text = body.String()
		out = append(out, *cur)
	}
	return out
}

// Marked returns the blocks whose Marker equals marker.
func Marked(blocks []Block, marker string) []Block {
	var out []Block
	for _, b := range blocks {
		if b.Marker == marker {
			out = append(out, b)
		}
	}
	return out
}

// One returns the text of the one block of the file at path whose language
// is lang and whose marker is marker, or an error naming what it found.
func One(path, lang, marker string) (string, error) {
	blocks, err := Blocks(path)
	if err != nil {
		return "", err
	}
	var found []Block
	for _, b := range Marked(blocks, marker) {
		if b.Lang == lang {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s: want one %s block marked %q, have %d", path, lang, marker, len(found))
	}
	return found[0].Text, nil
}
