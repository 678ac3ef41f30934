// Package control implements espd's control socket: the binary protocol of
// docs/control-protocol.md (codec), a Server that carries requests out over
// a Backend, and the Client that espctl, the benchmark harness and the
// tests use.
//
// Every message is a 16-byte header (magic, version, flags, type, length,
// sequence number) followed by netlink-like TLV attributes in network byte
// order, 4-byte aligned. Keys go in with SA_ADD and never come back out.
package control
