// Package testbed builds a line of network namespaces for espd's end-to-end
// tests and its benchmark harness:
//
//	client --- gwA ===== gwB --- server
//	  LAN A       transit      LAN B
//
// Every namespace has a unique name (so that several test beds can exist at
// once), the links are veth pairs, and the addresses come only from the
// benchmarking ranges 198.18.0.0/15 and 2001:db8::/32 (see the Addr
// variables). The gateways forward, the client and the server route through
// their gateway, and IPv6 duplicate address detection is off so that every
// address is usable at once. There is no route between the LANs through the
// transit link unless Options.RouteLANs asks for one: only a tunnel (espd,
// kernel XFRM, wireguard-go, ...) installed by the caller connects them.
//
// Topology.Close removes every namespace (and with them the links) after
// stopping every process started with Node.Start. NewT registers Close with
// t.Cleanup; a harness calls HandleSignals so that Ctrl-C tears down what is
// still open.
//
// Around the topology the package offers what a test of a tunnel needs, each
// bounded in time:
//
//   - Node.Run runs a command inside a namespace (ip netns exec) and
//     captures its output; Node.Start starts a long-running one (a daemon)
//     with its output in a log file, stopped with SIGTERM, then SIGKILL.
//   - Node.Do runs Go code on a thread switched into the namespace; a
//     socket made there stays in the namespace. Transfer (a TCP bulk
//     transfer checked with SHA-256), Node.Ping, SendUDP/ListenUDP,
//     ProbePathMTU, Node.StartCapture (AF_PACKET capture with a
//     classification of every frame) and Node.InjectIP (raw IPv4/IPv6
//     packets, for replay and tampering) are built on it.
package testbed
