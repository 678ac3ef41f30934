// Package dataplane is espd's data path: it reads cleartext packets from
// the TUN device, encrypts them as ESP and sends them to the peers, and
// receives ESP from the outer sockets, decrypts it and writes the inner
// packets to the TUN.
//
// Every stage moves batches of packets, as wireguard-go's device package
// does. Outbound, one goroutine reads a batch from the TUN (the TUN driver
// splits TSO/USO super-packets into it), looks up each packet's policy and
// state, and reserves the batch's sequence numbers once per state. Inbound,
// one goroutine per outer socket (conn.Receiver) reads a batch and looks up
// each packet's state by SPI. What happens next depends on Config.Workers:
// a reader either runs the batch to completion itself or hands it off to
// the workers.
//
// With no workers each reader runs its batch to completion: it encrypts it
// and sends it through the conn.Bind, or checks the replay window,
// decrypts, checks the inner packets against their state's selectors,
// records the sequence numbers in the window and writes the batch to the
// TUN, which coalesces TCP and UDP segments (GRO). A batch costs no
// goroutine handoff, and so no thread wakeup, on its way.
//
// With workers and Config.HandOffBelow, each direction times its crypto
// (handOffGauge): batches whose crypto runs slower than HandOffBelow are
// handed off to the workers, faster ones are run to completion by their
// reader as above, and a reader stops handing off only when none of the
// direction's batches is in flight, so that the order holds. The rate is
// one per direction, a moving average over whatever suites its batches
// carry, not one per suite: a direction whose states mix a slow suite and a
// fast one hands off while the mix is slow on average. One per suite would
// not decide much better, since a batch holds the packets of many states
// and, for the order, may run to completion only once none of its
// direction's batches is in flight: while any slow suite's batch is handed
// off, the fast ones' batches behind it are handed off too. The
// GOMAXPROCS switch that follows the mode (Config.OnHandOff) is called from
// a goroutine of its own at most every 500 ms, never inside a batch.
//
// With n workers each direction has a bounded crypto queue, served by the n
// workers of both directions, and n in-order shards (at most maxShards): a
// state belongs to one shard, chosen by a hash of its SPI (shardOf), and
// each shard has a bounded in-order queue served by a stage of its own, a
// sender (outbound) or a TUN writer (inbound). A reader pushes a batch to
// the in-order queue of every shard it holds packets of, in the order it
// read the batches, and to the crypto queue once. A batch carries a wait
// group that a worker marks done once it has done its crypto; each of its
// shards' stages takes it when its queue's order comes to it, waits for
// that, and records the inbound sequence numbers of, and sends or writes,
// only its own states' packets. The last of the batch's shards and its
// worker to finish with it returns it to the pool. So each state's packets
// leave in the order they arrived, and its window advances in that order,
// whatever the number of workers, while the states of different shards
// never wait for each other: a stage stuck on one state's socket or TUN
// write holds up only its own shard, and the shards' stages run on every
// core. Their system calls still meet in conn's sender and tun's writer,
// each of which serialises its callers around one set of sockets and one
// TUN queue; the stages' own work (accounting, replay windows, building the
// vectors) runs in parallel.
//
// Run to completion, the outbound packets of every state pass through the
// one goroutine that reads the TUN, and the inbound ones through one per
// socket: order holds trivially and nothing is handed over, but one core
// does a direction's system calls. That is the faster choice where the
// crypto is fast and the cores are busy anyway (docs/benchmarks-history.md,
// "Every core, or run to completion?": 256 tunnels on two cores, handing every batch
// off cost more than it gave); Config.HandOffBelow 0 hands every batch to
// the workers and the shards' stages where idle cores can take them.
//
// This is what the kernel's pcrypt does with a finer and a coarser grain,
// and what wireguard-go does with a per-peer one. pcrypt numbers the
// requests of each pcrypt instance (padata's seq_nr, per padata shell:
// every transform, and so every state, of the instance shares one order),
// spreads their crypto over the CPUs and has padata reorder them by that
// number before the serial callback, which runs in the serial workqueue of
// the callback CPU each transform was given at its creation (round robin):
// one reordering domain per instance, one serial queue per CPU. Here a
// shard is both the ordering domain and the serial queue: a state's shard
// plays the part of a transform's callback CPU, but the order is kept per
// shard, not across all states of an algorithm, so a state of another shard
// never waits for a slow one. wireguard-go keeps, for each peer, an inbound
// and an outbound queue of element containers, each container locked until
// a worker of the device-wide pool has done its crypto, drained in order by
// two goroutines of the peer's own (the sequential sender and receiver):
// the same locked-element scheme, with a shard per peer. That costs two
// goroutines and two channels of 1024 slots per peer; with 10,000 states
// espd keeps a fixed number of shards instead.
//
// Memory does not grow with the number of states: there are n shards per
// direction however many states there are, a state costs no goroutine and
// no queue, and the shards share one budget of Config.QueueLen batches per
// direction (each shard's queue holds QueueLen/n rounded up, at least 2):
// a direction holds at most n*(max(QueueLen/n, 2)+1) batches in its
// in-order queues and stages (a batch with packets of several shards
// counts once) plus one per worker and per reader, each batch
// max(Config.Batch, the TUN's batch size) buffers of BufferSize bytes, and
// only while they are in flight (the pool allocates on demand). With the
// defaults on 2 cores that is the 16 batches of one queue before shards
// existed. Several states in one shard share its order: one of them stuck
// holds up the others of its shard, as with pcrypt's instance, but never
// another shard.
//
// A batch holds each state it uses (sa.SA.Hold) from the reader's lookup
// until its crypto is done, so that a state deleted or expired meanwhile
// keeps its keys until then and has them zeroed right after.
//
// With workers, a reader that finds a shard's in-order queue full waits for
// room, so that a burst is held by the kernel (the TUN's transmit queue,
// tun.Config.TxQueueLen; the socket's receive buffer) instead of being dropped here, but only while
// that shard's stage keeps finishing batches: when it has finished none for
// stallTimeout the reader drops the batch's packets of that shard, and goes
// on dropping them at once until the stage moves again, counting
// QueueDrops. The batch goes to the workers as soon as one shard has taken
// it, so the shards that did never wait for one that is stuck; the reader
// itself, shared by all shards, still waits up to stallTimeout for a full
// shard the first time it finds it stuck. Buffers and batches come from a
// sync.Pool and the steady state allocates nothing per packet.
//
// The kernel side (TUN device, outer sockets, routes) is behind small
// interfaces (TUN, Receiver, Sender) so that tests and benchmarks run the
// pipeline on in-memory fakes.
package dataplane
