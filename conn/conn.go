// Package conn owns espd's outer sockets, as wireguard-go's conn owns
// WireGuard's: the raw ESP sockets (IP protocol 50), the ESP-in-UDP
// sockets on the encapsulation port (RFC 3948) with UDP_SEGMENT and
// UDP_GRO, the IPPROTO_RAW senders, the IKE port and the IKE hand-off
// relay, recvmmsg/sendmmsg and their control messages.
//
// The data plane sees only Bind: receive functions that fill Messages,
// Send for Packets (the ESP bytes plus the endpoint and the outer header
// fields), counters, and the IKE hand-off. A sender builds an outer IP
// header only where the kernel needs a complete packet (the raw sockets,
// and outer fragmentation); the UDP sockets send the ESP bytes as they
// are, with the addresses, TOS and TTL as socket options.
package conn

import (
	"errors"
	"net/netip"

	"github.com/espd/espd/packet"
)

// RecvOffset is where receivers place an outer packet in its buffer. The
// room in front lets the inner packet, once decrypted in place, be written
// to the TUN with the header the TUN driver puts in front of it, even when
// transport mode writes an IPv6 header in front of a payload that the ESP
// header alone preceded (ENCR_NULL: no IV).
const RecvOffset = 48

// HeaderRoom is the headroom a Packet leaves in front of its ESP bytes:
// the largest outer header a sender may write there (IPv6 and UDP).
const HeaderRoom = packet.IPv6HeaderLen + packet.UDPHeaderLen

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

// Endpoint is an SA's outer path: the tunnel's addresses, the UDP ports
// for ESP-in-UDP and the TTL or hop limit. It is fixed per SA.
type Endpoint struct {
	// Src and Dst are the tunnel endpoints, both IPv4 or both IPv6.
	Src, Dst netip.Addr
	// SrcPort and DstPort are the UDP ports of ESP-in-UDP; DstPort 0
	// means raw ESP (IP protocol 50).
	SrcPort, DstPort uint16
	// TTL is the outer TTL or hop limit.
	TTL uint8
}

// Packet is one outer packet to send: the ESP packet (or, for a NAT
// keepalive, the one-byte UDP payload) and where and how it goes.
type Packet struct {
	// Buf[Start:End] is the ESP packet from its SPI, or the UDP payload.
	// Buf[:Start] is headroom of at least HeaderRoom bytes into which a
	// sender that needs a complete IP packet writes the outer header.
	Buf        []byte
	Start, End int
	Endpoint
	// TOS is the outer DSCP and ECN, per packet (they follow the inner
	// packet's, RFC 4303 and RFC 6040).
	TOS uint8
	// DF sets the outer IPv4 Don't Fragment bit.
	DF bool
	// ID is the outer IPv4 Identification.
	ID uint16
	// FlowLabel is the outer IPv6 flow label (transport mode keeps the
	// packet's own); the raw sockets write it, the UDP sockets leave it
	// to the kernel.
	FlowLabel uint32
	// FragmentAbove, when positive, is the largest outer packet the path
	// takes: a larger one is sent as IPv4 fragments (DF clear) or IPv6
	// fragments of at most that size. 0 sends it whole.
	FragmentAbove int
}

// Bind is the data plane's side of the outer sockets; *Sockets implements
// it, and the data plane's tests implement it with fakes.
type Bind interface {
	// Receivers returns the receiving sockets, each read by one
	// goroutine.
	Receivers() []Receiver
	// Send sends pkts in order. Several goroutines may call it at once
	// (the shards' in-order senders, the readers that run to completion);
	// none waits for another. It returns how many outer packets
	// left (a fragmented Packet counts each fragment) and the first
	// error met; a packet that fails is skipped.
	Send(pkts []Packet) (int, error)
	// Stats returns the sockets' counters.
	Stats() Stats
	// Close closes every socket; blocked Receives return an error.
	Close() error
}

// Stats count the outer sockets' system calls and what they carried, to
// tell the batch sizes achieved. Zero on fakes that do not count.
type Stats struct {
	// RecvCalls counts recvmmsg calls, RecvDatagrams the datagrams they
	// returned (a UDP_GRO datagram counts once).
	RecvCalls, RecvDatagrams uint64
	// SendCalls counts sendmmsg calls, SendMessages the messages they
	// sent (a UDP_SEGMENT message counts once).
	SendCalls, SendMessages uint64
}

// Errors set in Message.Err and returned by Send.
var (
	ErrTruncated   = errors.New("conn: outer packet truncated (larger than the buffer)")
	ErrOuterHeader = errors.New("conn: malformed outer IP header")
	ErrNotESP      = errors.New("conn: outer packet is not ESP")
	ErrEndpoint    = errors.New("conn: endpoint addresses are not both IPv4 or both IPv6")
	ErrHeadroom    = errors.New("conn: packet without HeaderRoom bytes in front")
	ErrNoIPv6      = errors.New("conn: IPv6 outer packet with IPv6 disabled")
)
