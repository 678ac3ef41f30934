// Package uringbench measures, on the machine it runs on, what io_uring
// would save on the TUN write path (issue 14): small IPv4 packets written
// to a TUN one write(2) each, as tun.Device writes packets it cannot
// coalesce today, against the same packets written as IORING_OP_WRITE
// submissions, one io_uring_enter per batch of 8, 32 or 128.
//
// It holds test files only: a minimal io_uring ring over
// golang.org/x/sys/unix (io_uring_setup, the mmapped rings,
// io_uring_enter), TestURingWritesEveryPacket, which checks that the ring
// path hands every packet to the kernel's stack, and BenchmarkTUNWrite,
// which reports wall time and CPU time (user+sys from getrusage, which
// counts the kernel's work and io_uring's worker threads) per packet, and
// BenchmarkNullSyscall, the cost of one kernel entry and exit here. It
// needs root and a network namespace of its own (testbed.NewNodeT); run
// it with
//
//	go test -run XXX -bench . ./tun/uringbench
//
// It is a separate package so that `go test ./tun` stays quick, and espd
// imports nothing from it.
package uringbench
