package report

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Table is a titled grid of text cells. A row shorter than Head has its
// last cell span the remaining columns (for "unavailable: ..." rows).
type Table struct {
	Title string
	Head  []string
	Rows  [][]string
	// Notes follow the table, one per line.
	Notes []string
}

func width(s string) int { return utf8.RuneCountInString(s) }

func pad(s string, w int) string {
	if n := width(s); n < w {
		return s + strings.Repeat(" ", w-n)
	}
	return s
}

// Text writes the table with aligned columns.
func (t Table) Text(w io.Writer) {
	widths := make([]int, len(t.Head))
	for i, h := range t.Head {
		widths[i] = width(h)
	}
	for _, row := range t.Rows {
		for i, c := range row {
			if i == len(row)-1 && len(row) < len(t.Head) {
				break // spans: does not widen the column
			}
			widths[i] = max(widths[i], width(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i > 0 {
				b.WriteString("  ")
			}
			if i == len(cells)-1 {
				b.WriteString(c)
			} else {
				b.WriteString(pad(c, widths[i]))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	if t.Title != "" {
		fmt.Fprintln(w, t.Title)
	}
	line(t.Head)
	for _, row := range t.Rows {
		line(row)
	}
	for _, n := range t.Notes {
		fmt.Fprintln(w, n)
	}
}

// Markdown writes the table as GitHub-flavoured Markdown; a spanning cell
// stays in its column and the rest of its row is left empty.
func (t Table) Markdown(w io.Writer) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	row := func(cells []string) {
		out := make([]string, len(t.Head))
		for i := range out {
			if i < len(cells) {
				out[i] = esc(cells[i])
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(out, " | "))
	}
	if t.Title != "" {
		fmt.Fprintf(w, "**%s**\n\n", t.Title)
	}
	row(t.Head)
	sep := make([]string, len(t.Head))
	for i := range sep {
		sep[i] = "---"
		if i >= 2 {
			sep[i] = "---:"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	for _, r := range t.Rows {
		row(r)
	}
	if len(t.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range t.Notes {
			fmt.Fprintf(w, "%s\n", n)
		}
	}
	fmt.Fprintln(w)
}
