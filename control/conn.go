package control

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
)

// conn is one client connection: a goroutine reading and answering
// requests in order, and, while subscribed, one writing events.
type conn struct {
	s    *Server
	nc   *net.UnixConn
	cred unix.Ucred // the peer's, from SO_PEERCRED at accept

	wmu sync.Mutex // serializes writes: replies and events

	// The subscription, owned by the serving goroutine.
	sub     Subscription
	subDone chan struct{} // closed when the event goroutine ends

	idleClosing bool // the idle timeout fired: the read side is shut (serving goroutine)

	// What the server weighs when it must evict a connection (evict.go).
	lastActive atomic.Int64 // time.Now().UnixNano() of the last message's start (or of accept)
	waiting    atomic.Bool  // between messages: waiting for the next one's first byte
	subscribed atomic.Bool  // sub != nil
	evicted    atomic.Bool  // closed by the server to admit another; guarded by Server.mu when set

	// The IKE hand-off registration, if any (ike.go): set by the serving
	// goroutine, cleared by it or by the forwarding goroutine.
	ikeMu  sync.Mutex
	ikeReg *ikeReg
}

func newConn(s *Server, nc *net.UnixConn, cred unix.Ucred) *conn {
	c := &conn{s: s, nc: nc, cred: cred}
	c.lastActive.Store(time.Now().UnixNano())
	// A new connection is between messages (before its first) even
	// before its goroutine reaches readHeader: eviction must not take it
	// for one in the middle of a message and close an older idle one.
	c.waiting.Store(true)
	return c
}

// write sends one encoded message within WriteTimeout. On failure the
// connection is closed, which ends the serving goroutine too.
func (c *conn) write(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	_, err := c.nc.Write(msg)
	if err != nil {
		c.nc.Close()
	}
	return err
}

// writeFinal sends the last reply to the message being handled. From the
// moment it is written the peer may send its next request, so the
// connection counts as between messages from then on, not only once its
// goroutine is back in readHeader: eviction prefers such a connection, and
// the scheduler must not make a connection that was answered look busy.
func (c *conn) writeFinal(msg []byte) error {
	c.waiting.Store(true)
	return c.write(msg)
}

// sendError sends an ERROR in reply to the message with this header.
func (c *conn) sendError(version uint8, seq uint32, t wire.MsgType, e *wire.Error) error {
	if e.Type == 0 {
		e.Type = t
	}
	b := wire.NewBuilder(replyVersion(version), wire.MsgError, wire.FlagReply, seq)
	wire.PutError(b, e)
	msg, err := b.Bytes()
	if err != nil {
		return err
	}
	return c.writeFinal(msg)
}

// initialReadBuffer is the read buffer a connection starts with; a larger
// message grows it to wire.MaxMessageSize.
const initialReadBuffer = 4096

// serve reads and answers messages until the peer leaves, the framing is
// lost or the server closes.
//
// Messages carry keys, so nothing of one outlives its handling: the body
// is read, decoded and handled under crypto.DoSecret (the decoder's and
// the handler's temporaries are erased when freed, their stack frames at
// once), the read buffer is cleared after each message and when the
// connection ends, and an oversized message is skipped through that same
// buffer rather than a shared one.
func (c *conn) serve() {
	buf := make([]byte, initialReadBuffer)
	defer func() {
		clear(buf)
		c.close()
	}()
	for {
		h, err := c.readHeader(buf)
		if err != nil {
			c.readFailed(h, err)
			return
		}
		if h.Oversized() {
			e := wire.Errorf(wire.EMSGSIZE, "message of %d bytes exceeds the maximum of %d", h.Length, wire.MaxMessageSize)
			if h.Length > maxSkip {
				c.sendError(h.Version, h.Seq, h.Type, e)
				return
			}
			if err := c.skip(buf, int64(h.Length)-wire.HeaderLen); err != nil {
				c.readFailed(h, err)
				return
			}
			if c.sendError(h.Version, h.Seq, h.Type, e) != nil {
				return
			}
			continue
		}
		if cap(buf) < int(h.Length) {
			// The header read so far is in the old buffer: carry it over.
			nb := make([]byte, wire.MaxMessageSize)
			copy(nb, buf[:wire.HeaderLen])
			clear(buf)
			buf = nb
		}
		if !c.serveOne(h, buf[:h.Length]) {
			return
		}
	}
}

// serveOne reads the body of the message whose header h is in msg, then
// decodes and answers it, under crypto.DoSecret, and clears msg. It
// reports whether the connection goes on.
//
// A panic while decoding or handling the message (a bug: nothing a client
// sends should cause one) is not allowed to take the daemon, and with it
// every tunnel, down: it is logged with its stack, the client gets an EIO
// error, and its connection is closed, since what the handler left half
// done is unknown. The data path and the other connections go on.
func (c *conn) serveOne(h wire.Header, msg []byte) (ok bool) {
	crypto.DoSecret(func() {
		defer clear(msg) // keys do not linger in the buffer
		if _, err := io.ReadFull(c.nc, msg[wire.HeaderLen:]); err != nil {
			c.readFailed(h, err)
			return
		}
		defer func() {
			if r := recover(); r != nil {
				c.s.cfg.Logf("control: internal error handling a %v message (connection closed): %v\n%s", h.Type, r, debug.Stack())
				c.sendError(h.Version, h.Seq, h.Type, wire.Errorf(wire.EIO, "internal error in espd; the request may be partly applied: check its state"))
				ok = false
			}
		}()
		m, err := wire.Decode(msg)
		if err != nil {
			err = c.sendError(h.Version, h.Seq, h.Type, &wire.Error{Code: wire.EBADMSG, Msg: err.Error()})
		} else {
			err = c.handle(m)
		}
		ok = err == nil
	})
	return ok
}

// skip reads and discards n bytes of an oversized message through buf,
// clearing it afterwards: the message may hold keys.
func (c *conn) skip(buf []byte, n int64) error {
	defer clear(buf)
	for n > 0 {
		k, err := c.nc.Read(buf[:min(int64(len(buf)), n)])
		n -= int64(k)
		if err != nil {
			return err
		}
	}
	return nil
}

// readHeader waits for the next message (IdleTimeout, none while
// subscribed or registered for the IKE hand-off), then reads its header
// within MessageTimeout and checks it. The MessageTimeout deadline stays
// set for the body.
//
// An idle connection is closed without a race against a request the client
// sends at that moment: the read side is shut first, so that from then on
// the client's write fails at its end (EPIPE) with nothing done, and it can
// retry on a new connection (charon's plugin does); a request that arrived
// before is already queued and is still answered. Only then does the
// connection get its ETIMEDOUT ERROR and close.
func (c *conn) readHeader(buf []byte) (wire.Header, error) {
	var idle time.Time
	if c.s.cfg.IdleTimeout > 0 && !c.pinned() && !c.idleClosing {
		idle = time.Now().Add(c.s.cfg.IdleTimeout)
	}
	c.nc.SetReadDeadline(idle)
	c.waiting.Store(true)
	_, err := io.ReadFull(c.nc, buf[:1])
	if errors.Is(err, os.ErrDeadlineExceeded) && !c.idleClosing {
		c.idleClosing = true
		shut := func() { c.nc.CloseRead() }
		if hook := idleHook.Load(); hook != nil {
			(*hook)(shut)
		} else {
			shut()
		}
		c.nc.SetReadDeadline(time.Time{})
		if _, err = io.ReadFull(c.nc, buf[:1]); err != nil {
			err = errIdleTimeout
		}
	}
	c.waiting.Store(false)
	if err != nil {
		return wire.Header{}, errIdle{err}
	}
	c.lastActive.Store(time.Now().UnixNano())
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.MessageTimeout))
	if _, err := io.ReadFull(c.nc, buf[1:wire.HeaderLen]); err != nil {
		return wire.Header{}, err
	}
	return wire.ParseHeader(buf[:wire.HeaderLen])
}

// errIdle marks an error while waiting for a message to start.
type errIdle struct{ error }

// errIdleTimeout is the error of a connection closed for being idle.
var errIdleTimeout = errors.New("idle timeout")

// idleHook, when set (tests), runs when a connection's idle timeout fires
// and must call shut, which shuts the connection's read side.
var idleHook atomic.Pointer[func(shut func())]

func (e errIdle) Unwrap() error { return e.error }

// readFailed answers what can be answered about a failed read before the
// connection closes: framing errors and timeouts get an ERROR.
func (c *conn) readFailed(h wire.Header, err error) {
	var idle errIdle
	switch {
	case c.evicted.Load():
		// The server shut the read side to make room (evict.go).
		c.sendError(wire.Version, 0, 0, wire.Errorf(wire.EAGAIN, "closed to admit a new connection: the limit of %d connections was reached, and uid %d holds the most", c.s.cfg.MaxConns, c.cred.Uid))
	case errors.Is(err, errIdleTimeout):
		c.s.cfg.Logf("control: closing the connection of pid %d (uid %d): idle for %v (a client reconnects when it next needs espd)", c.cred.Pid, c.cred.Uid, c.s.cfg.IdleTimeout)
		c.sendError(wire.Version, 0, 0, wire.Errorf(wire.ETIMEDOUT, "idle for %v; closing", c.s.cfg.IdleTimeout))
	case errors.As(err, &idle):
		// The client left, or, after an idle timeout, the request that
		// crossed it was answered.
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.sendError(h.Version, h.Seq, h.Type, wire.Errorf(wire.ETIMEDOUT, "message not received within %v; closing", c.s.cfg.MessageTimeout))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
	case errors.Is(err, wire.ErrBadMagic), errors.Is(err, wire.ErrFraming):
		c.s.cfg.Logf("control: closing connection: %v", err)
		c.sendError(wire.Version, 0, 0, &wire.Error{Code: wire.EBADMSG, Msg: err.Error() + "; framing lost, closing"})
	default:
		c.s.cfg.Logf("control: closing connection: %v", err)
	}
}

// close ends the subscription, the IKE hand-off registration and the
// connection.
func (c *conn) close() {
	c.nc.Close()
	c.unsubscribe()
	c.ikeClose()
}

// subscribe starts the event goroutine. Events of kinds outside mask are
// consumed and not sent.
func (c *conn) subscribe(sub Subscription, version uint8, seq uint32, mask wire.EventMask) {
	c.sub = sub
	c.subscribed.Store(true)
	c.subDone = make(chan struct{})
	go func() {
		defer close(c.subDone)
		var reported uint64
		for e := range sub.Events() {
			if !mask.Has(e.Kind) {
				continue
			}
			d := sub.Dropped()
			e.Lost, reported = d-reported, d
			b := wire.NewBuilder(version, wire.MsgEvent, 0, seq)
			wire.PutEvent(b, e)
			msg, err := b.Bytes()
			if err != nil {
				c.s.cfg.Logf("control: encoding event: %v", err)
				continue
			}
			if c.write(msg) != nil {
				sub.Close()
				for range sub.Events() {
				}
				return
			}
		}
	}()
}

// unsubscribe closes the subscription and waits for the event goroutine,
// which a stuck client holds for at most WriteTimeout.
func (c *conn) unsubscribe() {
	if c.sub == nil {
		return
	}
	c.sub.Close()
	<-c.subDone
	c.sub, c.subDone = nil, nil
	c.subscribed.Store(false)
}

// pinned reports whether the connection is one that must stay open while
// idle: subscribed to events or registered for the IKE hand-off (charon's
// plugin holds one of each).
func (c *conn) pinned() bool { return c.subscribed.Load() || c.ikeRegistered() }
