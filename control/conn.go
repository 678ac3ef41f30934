package control

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// conn is one client connection: a goroutine reading and answering
// requests in order, and, while subscribed, one writing events.
type conn struct {
	s  *Server
	nc *net.UnixConn

	wmu sync.Mutex // serializes writes: replies and events

	// The subscription, owned by the serving goroutine.
	sub     Subscription
	subDone chan struct{} // closed when the event goroutine ends
}

func newConn(s *Server, nc *net.UnixConn) *conn { return &conn{s: s, nc: nc} }

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

// sendError sends an ERROR in reply to the message with this header.
func (c *conn) sendError(version uint8, seq uint32, t MsgType, e *Error) error {
	if e.Type == 0 {
		e.Type = t
	}
	b := NewBuilder(replyVersion(version), MsgError, FlagReply, seq)
	putError(b, e)
	msg, err := b.Bytes()
	if err != nil {
		return err
	}
	return c.write(msg)
}

// replyVersion is the version a reply carries: the request's if supported,
// else ours.
func replyVersion(v uint8) uint8 {
	for _, s := range SupportedVersions {
		if s == v {
			return v
		}
	}
	return Version
}

// serve reads and answers messages until the peer leaves, the framing is
// lost or the server closes.
func (c *conn) serve() {
	defer c.close()
	buf := make([]byte, 4096)
	for {
		h, err := c.readHeader(buf)
		if err != nil {
			c.readFailed(h, err)
			return
		}
		if h.Oversized() {
			e := Errorf(EMSGSIZE, "message of %d bytes exceeds the maximum of %d", h.Length, MaxMessageSize)
			if h.Length > maxSkip {
				c.sendError(h.Version, h.Seq, h.Type, e)
				return
			}
			if _, err := io.CopyN(io.Discard, c.nc, int64(h.Length)-HeaderLen); err != nil {
				c.readFailed(h, err)
				return
			}
			if c.sendError(h.Version, h.Seq, h.Type, e) != nil {
				return
			}
			continue
		}
		if cap(buf) < int(h.Length) {
			buf = make([]byte, MaxMessageSize)
		}
		msg := buf[:h.Length]
		if _, err := io.ReadFull(c.nc, msg[HeaderLen:]); err != nil {
			c.readFailed(h, err)
			return
		}
		m, err := Decode(msg)
		if err != nil {
			err = c.sendError(h.Version, h.Seq, h.Type, &Error{Code: EBADMSG, Msg: err.Error()})
		} else {
			err = c.handle(m)
		}
		clear(msg) // keys do not linger in the buffer
		if err != nil {
			return
		}
	}
}

// readHeader waits for the next message (IdleTimeout, none while
// subscribed), then reads its header within MessageTimeout and checks it.
// The MessageTimeout deadline stays set for the body.
func (c *conn) readHeader(buf []byte) (Header, error) {
	var idle time.Time
	if c.s.cfg.IdleTimeout > 0 && c.sub == nil {
		idle = time.Now().Add(c.s.cfg.IdleTimeout)
	}
	c.nc.SetReadDeadline(idle)
	if _, err := io.ReadFull(c.nc, buf[:1]); err != nil {
		return Header{}, errIdle{err}
	}
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.MessageTimeout))
	if _, err := io.ReadFull(c.nc, buf[1:HeaderLen]); err != nil {
		return Header{}, err
	}
	return ParseHeader(buf[:HeaderLen])
}

// errIdle marks an error while waiting for a message to start.
type errIdle struct{ error }

func (e errIdle) Unwrap() error { return e.error }

// readFailed answers what can be answered about a failed read before the
// connection closes: framing errors and timeouts get an ERROR.
func (c *conn) readFailed(h Header, err error) {
	var idle errIdle
	switch {
	case errors.As(err, &idle):
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.sendError(Version, 0, 0, Errorf(ETIMEDOUT, "idle for %v; closing", c.s.cfg.IdleTimeout))
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.sendError(h.Version, h.Seq, h.Type, Errorf(ETIMEDOUT, "message not received within %v; closing", c.s.cfg.MessageTimeout))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
	case errors.Is(err, ErrBadMagic), errors.Is(err, ErrFraming):
		c.s.cfg.Logf("control: closing connection: %v", err)
		c.sendError(Version, 0, 0, &Error{Code: EBADMSG, Msg: err.Error() + "; framing lost, closing"})
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
func (c *conn) subscribe(sub Subscription, version uint8, seq uint32, mask EventMask) {
	c.sub = sub
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
			b := NewBuilder(version, MsgEvent, 0, seq)
			putEvent(b, e)
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
}
