// Package dataplane is espd's data path: it reads cleartext packets from
// the TUN device, encrypts them as ESP and sends them to the peers, and
// receives ESP from the outer sockets, decrypts it and writes the inner
// packets to the TUN.
//
// The pipeline follows wireguard-go's device package. Every stage moves
// batches of packets. Outbound, one goroutine reads a batch from the TUN
// (the TUN driver splits TSO/USO super-packets into it), looks up each
// packet's policy and state, reserves the batch's sequence numbers once
// per state, and puts the batch on two bounded queues: the crypto queue,
// served by Config.Workers goroutines, and the in-order queue, served by
// one sender. A batch carries a mutex held until a worker has encrypted it;
// the sender takes batches in the order they were read, waits for that
// mutex and sends the batch with sendmmsg. Inbound, one goroutine per outer
// socket reads a batch with recvmmsg and looks up each packet's state by
// SPI; workers check the replay window, decrypt and check the inner packet
// against the state's selectors; one writer takes the batches in order,
// records their sequence numbers in the replay windows and writes them to
// the TUN, which coalesces TCP and UDP segments (GRO). So each state's
// packets leave in the order they arrived, and the windows advance in that
// order, whatever the number of workers.
//
// A batch holds each state it uses (sa.SA.Hold) from the reader's lookup
// until a worker has done its crypto, so that a state deleted or expired
// meanwhile keeps its keys until then and has them zeroed right after.
//
// A reader that finds the in-order queue full waits for room, so that a
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
