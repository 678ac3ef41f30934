package docblock

import "strings"

// TablePrefix begins the HTML comment that marks the Markdown table on the
// line right below it: "<!-- table espd-flags -->" marks a table with the
// marker "espd-flags". The comment does not show when the page is rendered.
const TablePrefix = "<!-- table "

// Table is one Markdown table outside fenced blocks: a run of lines that
// begin with "|".
type Table struct {
	Marker string // from the TablePrefix comment right above ("" if unmarked)
	Line   int    // 1-based line of the header row
	// Rows are the cells of each row, trimmed, with "\|" read as "|"; the
	// header row comes first, the delimiter row (| --- |) is left out.
	Rows [][]string
}

// Tables returns every table of the Markdown text, in order.
func Tables(text string) []Table {
	var out []Table
	var cur *Table
	marker, inFence := "", false
	for n, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if inFence {
			inFence = trimmed != "```"
			continue
		}
		if !strings.HasPrefix(trimmed, "|") {
			if cur != nil {
				out = append(out, *cur)
				cur = nil
			}
			inFence = strings.HasPrefix(trimmed, "```")
			marker = ""
			if m, ok := strings.CutPrefix(trimmed, TablePrefix); ok && strings.HasSuffix(m, "-->") {
				marker = strings.TrimSpace(strings.TrimSuffix(m, "-->"))
			}
			continue
		}
		if cur == nil {
			cur = &Table{Marker: marker, Line: n + 1}
		}
		if cells := splitRow(trimmed); !isDelimiter(cells) {
			cur.Rows = append(cur.Rows, cells)
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// MarkedTables returns the tables whose Marker equals marker.
func MarkedTables(tables []Table, marker string) []Table {
	var out []Table
	for _, t := range tables {
		if t.Marker == marker {
			out = append(out, t)
		}
	}
	return out
}

// splitRow splits "| a | b\|c |" into "a" and "b|c".
func splitRow(row string) []string {
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var cells []string
	var cell strings.Builder
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			cell.WriteByte('|')
			i++
		case row[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(row[i])
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

// isDelimiter reports whether cells are a table's delimiter row.
func isDelimiter(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, ":-") != "" || c == "" {
			return false
		}
	}
	return true
}
