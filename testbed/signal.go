package testbed

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var (
	openMu   sync.Mutex
	openTops = map[*Topology]struct{}{}
)

func register(t *Topology) {
	openMu.Lock()
	openTops[t] = struct{}{}
	openMu.Unlock()
}

func unregister(t *Topology) {
	openMu.Lock()
	delete(openTops, t)
	openMu.Unlock()
}

// CloseAll closes every topology of this process that is still open and
// returns the first error.
func CloseAll() error {
	openMu.Lock()
	tops := make([]*Topology, 0, len(openTops))
	for t := range openTops {
		tops = append(tops, t)
	}
	openMu.Unlock()
	var first error
	for _, t := range tops {
		if err := t.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// HandleSignals makes SIGINT, SIGTERM and SIGHUP run onSignal (if not
// nil: the harness's own teardown), close every open topology (stopping
// its processes) and then exit the program with status 130. A harness
// calls it once at start; the returned function undoes it.
func HandleSignals(onSignal func(os.Signal)) (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-c:
			if onSignal != nil {
				onSignal(sig)
			} else {
				fmt.Fprintf(os.Stderr, "testbed: %v: removing the test bed\n", sig)
			}
			if err := CloseAll(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			os.Exit(130)
		case <-quit:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(c)
			close(quit)
		})
	}
}

// RemoveStale deletes namespaces named <prefix>-<role>-<pid>-<n> whose pid
// is not a running process: the leftovers of a harness that was killed
// with SIGKILL. It returns the names it removed.
func RemoveStale(prefix string) ([]string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	entries, err := os.ReadDir(NetnsDir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix+"-")
		if !ok {
			continue
		}
		parts := strings.Split(rest, "-")
		if len(parts) != 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			continue // still running
		}
		if err := deleteNamespace(name); err != nil {
			return removed, err
		}
		removed = append(removed, name)
	}
	return removed, nil
}
