// Package dataplane is espd's data path: it reads cleartext packets from
// the TUN device, encrypts them as ESP and sends them to the peers, and
// receives ESP from the outer sockets, decrypts it and writes the inner
// packets to the TUN.
//
// Every stage moves batches of packets, as wireguard-go's device package
// does. Outbound, one goroutine reads a batch from the TUN (the TUN driver
// splits TSO/USO super-packets into it), looks up each packet's policy
// and state, and reserves the batch's sequence numbers once per state.
// Inbound, one goroutine per outer socket (conn.Receiver) reads a batch
// and looks up each packet's state by SPI. What happens next depends on
// Config.Workers: a reader either runs the batch to completion itself or
// hands it off to the workers.
//
// With no workers each reader runs its batch to completion:
// it encrypts it and sends it through the conn.Bind, or
// checks the replay window, decrypts, checks the inner packets against
// their state's selectors, records the sequence numbers in the window and
// writes the batch to the TUN, which coalesces TCP and UDP segments (GRO).
// A batch costs no goroutine handoff, and so no thread wakeup, on its way.
//
// With workers and Config.HandOffBelow, each direction times its crypto
// (handOffGauge): batches whose crypto runs slower than HandOffBelow are
// handed off to the workers, faster ones are run to completion by their
// reader as above, and a reader stops handing off only when none of the
// direction's batches is in flight, so that the order holds.
//
// With n workers each direction has two bounded queues: the crypto queue,
// served by the n workers of both directions, and the in-order queue,
// served by one sender (outbound) or one TUN writer (inbound). A batch
// carries a mutex held until a worker has done its crypto; the in-order
// stage takes batches in the order they were read, waits for that mutex,
// records inbound sequence numbers and sends or writes the batch. So each
// state's packets leave in the order they arrived, and the windows advance
// in that order, whatever the number of workers.
//
// A batch holds each state it uses (sa.SA.Hold) from the reader's lookup
// until its crypto is done, so that a state deleted or expired
// meanwhile keeps its keys until then and has them zeroed right after.
//
// With workers, a reader that finds the in-order queue full waits for room, so that a
// burst is held by the kernel (the TUN's queue, the socket's receive
// buffer) instead of being dropped here, but only while the in-order stage
// keeps finishing batches: when it has finished none for stallTimeout the
// reader drops the batch, and goes on dropping at once until the stage
// moves again, counting QueueDrops. Buffers and batches come from a
// sync.Pool and the steady state allocates nothing per packet.
//
// The kernel side (TUN device, outer sockets, routes) is behind small
// interfaces (TUN, Receiver, Sender) so that tests and benchmarks run the
// pipeline on in-memory fakes.
package dataplane
