package dataplane

import "sync/atomic"

// Stats are a Device's own counters: the one home of what the data path
// counts outside the states. What a state carries and drops (packets,
// bytes, drops by reason) is counted on the state, sa.SA.Stats, and summed
// over every state in sa.GlobalStats.
type Stats struct {
	// TUNRxPackets counts packets read from the TUN (each packet of a
	// split super-packet counts), TUNRxBytes their bytes; TUNTxPackets
	// counts packets handed to the TUN (decapsulated packets and the ICMP
	// errors the data path writes), TUNTxBytes their bytes.
	TUNRxPackets, TUNRxBytes uint64
	TUNTxPackets, TUNTxBytes uint64
	// RxPackets counts outer packets received and RxBytes their ESP (or
	// UDP payload) bytes; TxPackets and TxBytes count outer packets handed
	// to the sockets, IP headers included (each fragment counts;
	// keepalives included), SendErrors those the kernel refused.
	RxPackets, RxBytes uint64
	TxPackets, TxBytes uint64

	// Outbound drops, before a state is found.
	NoPolicy    uint64 // no outbound policy matches the packet
	BypassInTUN uint64 // a bypass policy matches: bypass does not apply inside the TUN
	PolicyDrops uint64 // an outbound drop policy matches (inbound policies are not checked)
	NoSA        uint64 // a protect policy matches but its reqid has no live state; each one calls sa.DB.Acquire
	ICMPSent    uint64 // fragmentation needed / packet too big written to the TUN
	ICMPLimited uint64 // ICMP errors suppressed by the rate limit
	Fragments   uint64 // outer fragments sent (an outer packet split in k counts k)

	// Inbound drops and control traffic.
	InvalidSPI   uint64 // no live inbound state has the SPI
	Malformed    uint64 // outer packet (or, outbound, a TUN packet) that cannot be parsed far enough to find its state or policy
	KeepalivesRx uint64 // NAT-keepalives received (and dropped)
	KeepalivesTx uint64 // NAT-keepalives sent
	IKE          uint64 // non-ESP-marked (IKE) datagrams on the encapsulation port
	NoInterface  uint64 // packets of an inbound state whose interface ID (sa.Config.IfID) has no route-based interface

	// Both directions.
	QueueDrops     uint64 // packets of batches dropped because the workers' queue was full
	SendErrors     uint64 // outer packets the kernel refused
	TUNWriteErrors uint64 // TUN writes (of a batch, or of one ICMP error) that failed
	ReadErrors     uint64 // TUN or outer socket reads that failed
	// TUNQueueDrops counts the packets the kernel dropped at the TUN's
	// transmit queue before espd read them (tun.Stats.QueueDrops: the
	// interface's tx_dropped; zero on fakes).
	TUNQueueDrops uint64

	// System calls, to tell the batch sizes achieved: TUNRxPackets per
	// TUNReads (read(2) of the TUN; TUNSuperReads of them returned a
	// TSO/USO super-packet), TUNTxPackets per TUNWrites (each a writev or
	// an io_uring submission; TUNSuperWrites of them a coalesced
	// super-packet; TUNUringEnters the io_uring_enter calls); RecvDatagrams per RecvCalls
	// (recvmmsg; a UDP_GRO datagram counts once) and RxPackets per
	// RecvDatagrams; SendMessages per SendCalls (sendmmsg; a UDP_SEGMENT
	// message counts once) and TxPackets per SendMessages. Zero on
	// fakes.
	TUNReads, TUNSuperReads, TUNWrites, TUNSuperWrites uint64
	TUNUringEnters                                     uint64
	RecvCalls, RecvDatagrams, SendCalls, SendMessages  uint64

	// CompletedBatches counts the batches a reader ran to completion itself,
	// HandedOff those it handed to the workers (Config.Workers,
	// Config.HandOffBelow).
	CompletedBatches, HandedOff uint64
}

type counter int

const (
	cTUNRxPackets counter = iota
	cTUNRxBytes
	cTUNTxPackets
	cTUNTxBytes
	cRxPackets
	cRxBytes
	cTxPackets
	cTxBytes
	cNoPolicy
	cBypassInTUN
	cPolicyDrops
	cNoSA
	cICMPSent
	cICMPLimited
	cFragments
	cInvalidSPI
	cMalformed
	cKeepalivesRx
	cKeepalivesTx
	cIKE
	cNoInterface
	cQueueDrops
	cSendErrors
	cTUNWriteErrors
	cReadErrors
	cCompletedBatches
	cHandedOff
	numCounters
)

// counters are the device's shared counters. Stages count a batch in a
// local and add it once, so they are not padded against false sharing.
type counters [numCounters]atomic.Uint64

// local counts one batch's events before they are added to counters.
type local [numCounters]uint64

func (l *local) flush(c *counters) {
	for i := range l {
		if l[i] != 0 {
			c[i].Add(l[i])
			l[i] = 0
		}
	}
}

func (c *counters) snapshot() Stats {
	g := func(i counter) uint64 { return c[i].Load() }
	return Stats{ // system calls: Device.Stats
		TUNRxPackets: g(cTUNRxPackets), TUNRxBytes: g(cTUNRxBytes),
		TUNTxPackets: g(cTUNTxPackets), TUNTxBytes: g(cTUNTxBytes),
		RxPackets: g(cRxPackets), RxBytes: g(cRxBytes),
		TxPackets: g(cTxPackets), TxBytes: g(cTxBytes),
		NoPolicy: g(cNoPolicy), BypassInTUN: g(cBypassInTUN), PolicyDrops: g(cPolicyDrops),
		NoSA: g(cNoSA), ICMPSent: g(cICMPSent), ICMPLimited: g(cICMPLimited),
		Fragments: g(cFragments), InvalidSPI: g(cInvalidSPI), Malformed: g(cMalformed),
		KeepalivesRx: g(cKeepalivesRx), KeepalivesTx: g(cKeepalivesTx), IKE: g(cIKE), NoInterface: g(cNoInterface),
		QueueDrops: g(cQueueDrops),
		SendErrors: g(cSendErrors), TUNWriteErrors: g(cTUNWriteErrors), ReadErrors: g(cReadErrors),
		CompletedBatches: g(cCompletedBatches), HandedOff: g(cHandedOff),
	}
}
