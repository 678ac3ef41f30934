package tun

import "sync/atomic"

// Stats count a Device's system calls and packets, to tell how well the
// offloads batch: ReadPackets/Reads packets per read, WritePackets/Writes
// per write.
type Stats struct {
	// Reads counts read system calls, SuperReads those that returned a
	// TSO/USO super-packet, ReadPackets the packets Read returned.
	Reads, SuperReads, ReadPackets uint64
	// Writes counts the writes of packets and super-packets, each a
	// writev system call or an io_uring write submission, SuperWrites
	// those that wrote a coalesced super-packet, WritePackets the packets
	// written.
	Writes, SuperWrites, WritePackets uint64
	// QueueDrops counts the packets the kernel routed into the TUN and
	// dropped because its transmit queue was full (Config.TxQueueLen):
	// the interface's tx_dropped, read from the kernel at each Stats call.
	QueueDrops uint64
	// URingEnters counts the io_uring_enter calls through which Write
	// submitted writes (Device.URingErr says when there are none).
	URingEnters uint64
}

type stats struct {
	reads, superReads, readPackets    atomic.Uint64
	writes, superWrites, writePackets atomic.Uint64
	uringEnters                       atomic.Uint64
}

// Stats returns the counters. QueueDrops costs a netlink request; it is
// 0 if the kernel did not answer.
func (d *Device) Stats() Stats {
	s := &d.stats
	drops, _ := d.queueDrops()
	return Stats{
		Reads: s.reads.Load(), SuperReads: s.superReads.Load(), ReadPackets: s.readPackets.Load(),
		Writes: s.writes.Load(), SuperWrites: s.superWrites.Load(), WritePackets: s.writePackets.Load(),
		QueueDrops:  drops,
		URingEnters: s.uringEnters.Load(),
	}
}
