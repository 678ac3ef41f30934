package conn

import (
	"errors"
	"net/netip"
)

// DefaultIKEPort is IKE's UDP port (RFC 7296).
const DefaultIKEPort = 500

// DefaultEncapPort is the ESP-in-UDP port of RFC 3948 (IKE's NAT-T port).
const DefaultEncapPort = 4500

// IKEPacket is one IKE datagram handed between espd's UDP ports and an IKE
// daemon: the one type the sockets, the daemon and the control protocol
// share.
type IKEPacket struct {
	// Src and Dst are the datagram's addresses and ports. Sent by the IKE
	// daemon, an invalid Src address lets the kernel choose the source
	// address.
	Src, Dst netip.AddrPort
	// Data is the UDP payload as on the wire: on the encapsulation (NAT-T)
	// port it starts with the 4-byte non-ESP marker.
	Data []byte
}

// IKEHandler receives the IKE datagrams that arrive: everything on the IKE
// port, the non-ESP-marked datagrams on the encapsulation port. It is
// called from receiving goroutines, must not block and must copy p.Data
// to keep it.
type IKEHandler func(p IKEPacket)

// IKEStats count the IKE hand-off's datagrams.
type IKEStats struct {
	// Received counts datagrams handed to the handler (both ports).
	Received uint64
	// Sent counts datagrams sent for the IKE daemon; SendErrors those the
	// kernel refused; Refused those SendIKE refused (wrong port, ESP on
	// the NAT-T port, ...).
	Sent, SendErrors, Refused uint64
	// ReadErrors counts failed reads of the IKE port's sockets.
	ReadErrors uint64
}

// IKE is the IKE hand-off: espd owns IKE's UDP port and the encapsulation
// port, keeps ESP-in-UDP for itself and relays IKE to and from the IKE
// daemon.
type IKE interface {
	// StartIKE takes over the IKE port (0: DefaultIKEPort) next to the
	// encapsulation port and hands every IKE datagram that arrives on
	// either to h. StopIKE (or Close) ends it.
	StartIKE(port uint16, h IKEHandler) error
	// StopIKE closes the IKE port and stops handing datagrams over.
	StopIKE() error
	// DeliverIKE hands a non-ESP-marked datagram that the data plane
	// received on the encapsulation port to the handler, if the hand-off
	// runs. p.Data is only borrowed.
	DeliverIKE(p IKEPacket)
	// SendIKE sends an IKE datagram from the IKE port or the
	// encapsulation port. From the encapsulation port only non-ESP-marked
	// datagrams and NAT-keepalives go: the IKE daemon cannot inject ESP.
	SendIKE(p IKEPacket) error
	// IKEPorts returns the IKE port (0 when the hand-off is off) and the
	// encapsulation port.
	IKEPorts() (ike, natt uint16)
	// IKEStats returns the hand-off's counters.
	IKEStats() IKEStats
}

// Errors of the IKE hand-off.
var (
	ErrIKEOff     = errors.New("conn: IKE hand-off not started")
	ErrIKERunning = errors.New("conn: IKE hand-off already started")
)

// IKERefusal is the error of a datagram SendIKE refuses to send.
type IKERefusal struct{ Reason string }

// Error implements error.
func (r *IKERefusal) Error() string { return "conn: IKE hand-off: " + r.Reason }
