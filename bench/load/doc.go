// Package load generates the benchmark harness's traffic between two
// namespaces of a testbed line: a TCP bulk stream with a fixed MSS
// (TCP_MAXSEG) whose goodput and retransmits (TCP_INFO) are measured over a
// window, a flood of small UDP datagrams counted at the receiver, ICMP echo
// round-trip times (in Go: no ping program needed), and the same TCP
// measurement done by iperf3.
//
// Every measurement has a warm-up (Omit) that is not counted, then a window
// of Duration; the Window hook runs at the start and at the end of the
// window so that the caller can sample CPU time over exactly the same
// interval.
package load
