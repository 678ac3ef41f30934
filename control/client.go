package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/espd/espd/control/wire"
)

// ErrClosed is returned by requests on a closed Client.
var ErrClosed = errors.New("control: connection closed")

// clientEventBuffer is how many events a Client holds for a Subscribe
// reader that falls behind; beyond it they are dropped and counted in the
// next event's Lost.
const clientEventBuffer = 1024

// Client is a connection to espd's control socket. Its methods are safe
// for concurrent use; each sends one request and waits for its reply or
// for the context to end.
type Client struct {
	nc *net.UnixConn

	wmu sync.Mutex // serializes writes

	mu      sync.Mutex
	seq     uint32
	pending map[uint32]*call
	err     error           // why the connection ended
	refusal *wire.Error     // an unsolicited ERROR (sequence 0): why the server hung up
	events  chan wire.Event // nil until Subscribe
	lost    uint64          // events dropped since the last one delivered
	done    chan struct{}

	// Server is what the server said in its HELLO reply.
	Server wire.HelloInfo
}

// call is one request waiting for its reply.
type call struct {
	parts []*wire.Message
	err   error
	done  chan struct{}
}

// Dial connects to the socket at path (DefaultSocketPath if empty) and
// negotiates the protocol version with HELLO.
func Dial(ctx context.Context, path string) (*Client, error) {
	if path == "" {
		path = DefaultSocketPath
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	c := &Client{nc: nc.(*net.UnixConn), pending: map[uint32]*call{}, done: make(chan struct{})}
	go c.readLoop()
	h, err := c.Hello(ctx)
	if err != nil {
		var e *wire.Error
		if !errors.As(err, &e) {
			// A server that refuses us (EACCES, EAGAIN) says why, then
			// hangs up, maybe before our HELLO is written: prefer its
			// reason to the write error.
			select {
			case <-c.done:
			case <-time.After(time.Second):
			}
			c.mu.Lock()
			if c.refusal != nil {
				err = c.refusal
			}
			c.mu.Unlock()
		}
		c.Close()
		return nil, err
	}
	c.Server = h
	return c, nil
}

// Close closes the connection; pending requests fail with ErrClosed and
// the event channel closes.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = ErrClosed
	}
	c.mu.Unlock()
	err := c.nc.Close()
	<-c.done
	return err
}

// readLoop reads messages and hands them to the waiting calls and to the
// event channel, until the connection ends.
func (c *Client) readLoop() {
	defer close(c.done)
	var err error
	for {
		var m *wire.Message
		m, _, _, err = ReadMessage(c.nc, nil)
		if err != nil {
			break
		}
		c.dispatch(m)
	}
	c.mu.Lock()
	if c.err == nil {
		switch {
		case c.refusal != nil:
			c.err = c.refusal
		case err != nil:
			c.err = fmt.Errorf("control: connection lost: %w", err)
		}
	}
	for seq, cl := range c.pending {
		cl.err = c.err
		close(cl.done)
		delete(c.pending, seq)
	}
	if c.events != nil {
		close(c.events)
	}
	c.mu.Unlock()
	c.nc.Close()
}

func (c *Client) dispatch(m *wire.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Type == wire.MsgEvent && m.Flags&wire.FlagReply == 0 {
		if c.events == nil {
			return
		}
		e, err := wire.ReadEvent(m.Attrs)
		if err != nil {
			c.lost++
			return
		}
		e.Lost += c.lost
		select {
		case c.events <- e:
			c.lost = 0
		default:
			c.lost = e.Lost + 1
		}
		return
	}
	cl := c.pending[m.Seq]
	if cl == nil {
		if m.Type == wire.MsgError {
			if e, err := wire.ReadError(m.Attrs); err == nil {
				c.refusal = e
			}
		}
		return
	}
	switch {
	case m.Type == wire.MsgError:
		e, err := wire.ReadError(m.Attrs)
		if err != nil {
			cl.err = fmt.Errorf("control: malformed ERROR reply: %w", err)
		} else {
			cl.err = e
		}
	case m.Flags&wire.FlagMulti != 0:
		cl.parts = append(cl.parts, m)
		return
	case m.Type == wire.MsgDone:
	default:
		cl.parts = append(cl.parts, m)
	}
	delete(c.pending, m.Seq)
	close(cl.done)
}

// do sends a request built by fill and returns its reply messages: one for
// a single reply, the parts (without DONE) for a multi-part one.
func (c *Client) do(ctx context.Context, t wire.MsgType, fill func(*wire.Builder)) ([]*wire.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cl := &call{done: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.seq++
	if c.seq == 0 {
		c.seq = 1 // 0 is for unsolicited errors
	}
	seq := c.seq
	c.pending[seq] = cl
	c.mu.Unlock()

	b := wire.NewBuilder(wire.Version, t, 0, seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err == nil {
		err = c.send(ctx, msg)
	}
	b.Clear() // keys do not linger
	if err != nil {
		c.forget(seq)
		return nil, err
	}
	select {
	case <-cl.done:
		if cl.err != nil {
			return nil, cl.err
		}
		for _, m := range cl.parts {
			if m.Type != t {
				return nil, fmt.Errorf("control: %v request answered with %v", t, m.Type)
			}
		}
		return cl.parts, nil
	case <-ctx.Done():
		c.forget(seq)
		return nil, ctx.Err()
	}
}

func (c *Client) forget(seq uint32) {
	c.mu.Lock()
	delete(c.pending, seq)
	c.mu.Unlock()
}

// send writes one message, giving up when ctx ends; a partial write
// breaks the framing, so the connection is then closed.
func (c *Client) send(ctx context.Context, msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	dl, _ := ctx.Deadline()
	c.nc.SetWriteDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.nc.SetWriteDeadline(time.Unix(1, 0)) })
	n, err := c.nc.Write(msg)
	stop()
	if err != nil {
		if n > 0 {
			c.nc.Close()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("control: %w", err)
	}
	return nil
}

// single returns the attributes of a single reply.
func single(parts []*wire.Message, err error) ([]wire.Attr, error) {
	if err != nil {
		return nil, err
	}
	if len(parts) != 1 {
		return nil, fmt.Errorf("control: %d replies to a single request", len(parts))
	}
	return parts[0].Attrs, nil
}
