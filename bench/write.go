package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/espd/espd/bench/report"
)

// write prints the tables and writes the JSON, the chart and the
// Markdown.
func (h *harness) write() error {
	rep := h.rep
	for _, info := range h.infos {
		rep.Systems = append(rep.Systems, *info)
	}
	var paths []string
	for _, p := range []string{h.o.jsonPath, h.o.svgPath, h.o.mdPath} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	fmt.Fprintln(h.stdout)
	for _, l := range rep.Header() {
		fmt.Fprintln(h.stdout, l)
	}
	for _, t := range rep.Tables() {
		fmt.Fprintln(h.stdout)
		t.Text(h.stdout)
	}
	var errs []error
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			errs = append(errs, err)
		}
	}
	writeFile := func(path string, fn func(io.Writer) error) {
		f, err := os.Create(path)
		if err == nil {
			err = fn(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return
		}
		fmt.Fprintf(h.stderr, "bench: wrote %s\n", path)
	}
	if h.o.jsonPath != "" {
		writeFile(h.o.jsonPath, rep.WriteJSON)
	}
	if hasTCP(rep) {
		writeFile(h.o.svgPath, rep.Chart)
	} else if rep.HasScale() {
		writeFile(h.o.svgPath, rep.ScaleChart)
	}
	writeFile(h.o.mdPath, func(w io.Writer) error {
		for _, l := range rep.Header() {
			fmt.Fprintf(w, "%s  \n", l)
		}
		fmt.Fprintln(w)
		for _, t := range rep.Tables() {
			t.Markdown(w)
		}
		return nil
	})
	failed := 0
	for _, r := range rep.Runs {
		if !r.OK() {
			failed++
		}
	}
	if failed > 0 && h.o.render == "" {
		errs = append(errs, fmt.Errorf("%d of %d runs failed (see the JSON)", failed, len(rep.Runs)))
	}
	return errors.Join(errs...)
}

func hasTCP(r *report.Report) bool {
	for _, run := range r.Runs {
		if run.Kind == report.KindTCP && run.OK() && !report.IsCeiling(run.System) {
			return true
		}
	}
	return false
}
