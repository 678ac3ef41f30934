package dataplane

import (
	"errors"
	"net/netip"
)

// RecvOffset is where receivers place an outer packet in its buffer. The
// room in front lets the inner packet, once decrypted in place, be written
// to the TUN with the header the TUN driver puts in front of it.
const RecvOffset = 32

// Message is one outer packet received.
type Message struct {
	// Buf is the buffer to receive into (set by the caller); the packet
	// is read at Buf[RecvOffset:].
	Buf []byte
	// Buf[Start:End] is the ESP packet (from the SPI), or for ESP-in-UDP
	// the whole UDP payload (ESP packet, non-ESP-marked IKE message or
	// keepalive).
	Start, End int
	// Src and Dst are the outer addresses; the ports are set for UDP.
	Src, Dst netip.AddrPort
	// TOS is the outer IPv4 TOS or IPv6 Traffic Class (DSCP and ECN).
	TOS uint8
	// UDP reports that the packet arrived on the ESP-in-UDP port.
	UDP bool
	// Err, when set, says why the packet is unusable (truncated, bad outer
	// header); Start and End are then meaningless.
	Err error
}

// Receiver reads outer packets. Each receiver is used by one goroutine.
type Receiver interface {
	// Receive blocks until at least one packet arrives and reads up to
	// len(msgs) packets into msgs. It returns how many it filled in. An
	// error means the receiver is closed or broken.
	Receive(msgs []Message) (int, error)
	// Close stops the receiver; a blocked Receive returns an error.
	Close() error
}

// Sender sends outer packets. It is safe for concurrent use.
type Sender interface {
	// Send sends each of pkts, a complete IPv4 or IPv6 packet (IP header,
	// UDP header for ESP-in-UDP, ESP) routed by its destination address.
	// A packet that fails is skipped. It returns how many were sent and
	// the first error met.
	Send(pkts [][]byte) (int, error)
	// Close releases the sender.
	Close() error
}

// Errors set in Message.Err.
var (
	ErrTruncated   = errors.New("dataplane: outer packet truncated (larger than the buffer)")
	ErrOuterHeader = errors.New("dataplane: malformed outer IP header")
	ErrNotESP      = errors.New("dataplane: outer packet is not ESP")
)
