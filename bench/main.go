// Command bench is espd's comparison harness: on a line of network
// namespaces client - gwA - gwB - server it measures, cipher suite by
// cipher suite and TCP MSS by MSS, the throughput, retransmits and CPU cost
// of plain routing (the ceiling), espd, the kernel's XFRM, strongSwan's
// userspace ESP (kernel-libipsec) and wireguard-go, each in the same run,
// and prints the table, writes every run to JSON and draws a chart.
//
//	sudo go run ./bench          # the full comparison with what is installed
//	sudo go run ./bench -quick   # a smoke run: routing and espd, under a minute
//
// See BENCHMARKS.md for a run and how to read it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
