package dataplane

import "sync/atomic"

// Stats are a Device's global counters. Per-state counters (packets,
// bytes, drops by reason) are in sa.SA.Stats.
type Stats struct {
	// TUNRxPackets and TUNRxBytes count cleartext packets read from the
	// TUN; TUNTxPackets and TUNTxBytes those handed to it (ICMP errors
	// included).
	TUNRxPackets, TUNRxBytes uint64
	TUNTxPackets, TUNTxBytes uint64
	// RxPackets counts outer packets received and RxBytes their ESP (or
	// UDP payload) bytes; TxPackets and TxBytes count outer packets handed
	// to the sockets, IP headers included (each fragment counts;
	// keepalives included), SendErrors those the kernel refused.
	RxPackets, RxBytes uint64
	TxPackets, TxBytes uint64

	// Outbound drops.
	NoPolicy    uint64 // no outbound policy matches the packet
	BypassInTUN uint64 // a bypass policy matches: bypass does not apply inside the TUN
	PolicyDrops uint64 // a drop policy matches
	NoSA        uint64 // a protect policy without a live state (an acquire was raised)
	TooBig      uint64 // larger than the path allows with DF set (or IPv6)
	ICMPSent    uint64 // fragmentation needed / packet too big written to the TUN
	ICMPLimited uint64 // ICMP errors suppressed by the rate limit
	Fragments   uint64 // outer fragments sent (an outer packet split in k counts k)

	// Inbound drops and control traffic.
	InvalidSPI   uint64 // no live inbound state has the SPI
	Malformed    uint64 // outer or inner packet that cannot be parsed
	KeepalivesRx uint64 // NAT-keepalives received (and dropped)
	KeepalivesTx uint64 // NAT-keepalives sent
	IKE          uint64 // non-ESP-marked (IKE) datagrams on the encapsulation port
	SelectorDrop uint64 // inner packet outside its state's selectors
	CryptoDrops  uint64 // refused by a state: replay, integrity, padding, sequence exhausted, ... (per reason in its Stats)

	// Both directions.
	QueueDrops     uint64 // batches' packets dropped because a queue was full
	SendErrors     uint64 // outer packets the kernel refused
	TUNWriteErrors uint64 // failed TUN writes
	ReadErrors     uint64 // failed TUN or socket reads

	// System calls, to tell the batch sizes achieved: TUNRxPackets per
	// TUNReads (read(2) of the TUN; TUNSuperReads of them returned a
	// TSO/USO super-packet), TUNTxPackets per TUNWrites (TUNSuperWrites
	// of them a coalesced super-packet); RecvDatagrams per RecvCalls
	// (recvmmsg; a UDP_GRO datagram counts once) and RxPackets per
	// RecvDatagrams; SendMessages per SendCalls (sendmmsg; a UDP_SEGMENT
	// message counts once) and TxPackets per SendMessages. Zero on
	// fakes.
	TUNReads, TUNSuperReads, TUNWrites, TUNSuperWrites uint64
	RecvCalls, RecvDatagrams, SendCalls, SendMessages  uint64

	// InlineBatches counts the batches a reader ran to completion itself,
	// HandedOff those it handed to the workers (Config.Workers,
	// Config.HandOffBelow).
	InlineBatches, HandedOff uint64
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
	cTooBig
	cICMPSent
	cICMPLimited
	cFragments
	cInvalidSPI
	cMalformed
	cKeepalivesRx
	cKeepalivesTx
	cIKE
	cSelectorDrop
	cCryptoDrops
	cQueueDrops
	cSendErrors
	cTUNWriteErrors
	cReadErrors
	cInlineBatches
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
		NoSA: g(cNoSA), TooBig: g(cTooBig), ICMPSent: g(cICMPSent), ICMPLimited: g(cICMPLimited),
		Fragments: g(cFragments), InvalidSPI: g(cInvalidSPI), Malformed: g(cMalformed),
		KeepalivesRx: g(cKeepalivesRx), KeepalivesTx: g(cKeepalivesTx), IKE: g(cIKE),
		SelectorDrop: g(cSelectorDrop), CryptoDrops: g(cCryptoDrops), QueueDrops: g(cQueueDrops),
		SendErrors: g(cSendErrors), TUNWriteErrors: g(cTUNWriteErrors), ReadErrors: g(cReadErrors),
		InlineBatches: g(cInlineBatches), HandedOff: g(cHandedOff),
	}
}
