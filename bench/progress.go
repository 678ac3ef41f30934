package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// progress prints one line per run: on a terminal it rewrites the same
// line, elsewhere (logs, CI) it prints a line for each finished run.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	done  int
	start time.Time
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) eta() string {
	if p.done == 0 {
		return "?"
	}
	left := time.Duration(float64(time.Since(p.start)) / float64(p.done) * float64(p.total-p.done))
	return left.Round(time.Second).String()
}

// running shows what runs now (terminal only).
func (p *progress) running(what string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s ... (elapsed %v, eta %s)", p.done+1, p.total, what,
			time.Since(p.start).Round(time.Second), p.eta())
	}
}

// finished reports a run's result.
func (p *progress) finished(what, result string) {
	p.done++
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s: %s (elapsed %v, eta %s)", p.done, p.total, what, result,
			time.Since(p.start).Round(time.Second), p.eta())
		return
	}
	fmt.Fprintf(p.w, "[%d/%d] %s: %s (eta %s)\n", p.done, p.total, what, result, p.eta())
}

// skip counts runs that will not happen (a system that cannot carry a
// suite).
func (p *progress) skip(n int) { p.total -= n }

// note prints a line of its own.
func (p *progress) note(format string, args ...any) {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// end finishes the terminal line.
func (p *progress) end() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
