// Package rawsendbench measures, on the machine it runs on, what sending
// raw ESP below the IP stack would save (issue 14): IPv4 ESP packets of
// 1400 bytes sent from one network namespace to another over a veth pair
// through an IPPROTO_RAW socket with sendmmsg, as conn's rawSender sends
// raw ESP, against an AF_PACKET socket (SOCK_DGRAM, the kernel writes the
// Ethernet header) with sendmmsg, with and without PACKET_QDISC_BYPASS, and
// through an AF_PACKET TX ring (TPACKET_V2, one send per batch). The
// receiving namespace holds a raw ESP socket, as espd's receiver is, that
// nobody reads, so each path ends in the same delivery.
//
// It holds test files only: TestEveryPathDelivers checks that each path's
// packets reach the receiving namespace's raw socket intact, and
// BenchmarkSend reports nanoseconds per packet (one goroutine sends, so
// the time is the sender's CPU, the receiving namespace's softirq that veth
// runs in the sender's system call included, as in espd's hub). It needs
// root and network namespaces of its own (testbed.NewNodeT); run it with
//
//	go test -run XXX -bench . ./conn/rawsendbench
//
// espd imports nothing from it.
package rawsendbench
