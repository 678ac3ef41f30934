// Package control serves espd's control socket and speaks to it: a Server
// that carries the requests of docs/control-protocol.md out over a
// Backend, and the Client that espctl, the benchmark harness and the tests
// use. The protocol's codec, which turns its bytes into values and back
// with no I/O, is package control/wire; this package does the I/O: the
// Unix socket, its peers' credentials, framing a stream into messages,
// timeouts, eviction, event and IKE hand-off streams.
package control
