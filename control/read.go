package control

import (
	"errors"
	"fmt"
	"io"

	"github.com/espd/espd/control/wire"
)

// ReadMessage reads one message from r into buf (grown as needed) and
// decodes it with wire.Decode. A message larger than wire.MaxMessageSize is
// not read: the error wraps ErrOversized and the header is returned so
// that the caller can skip the body. Framing errors (bad magic, bad
// length) wrap wire.ErrBadMagic or wire.ErrFraming; io errors are returned
// as they are.
func ReadMessage(r io.Reader, buf []byte) (*wire.Message, wire.Header, []byte, error) {
	if cap(buf) < wire.HeaderLen {
		buf = make([]byte, wire.HeaderLen, 4096)
	}
	buf = buf[:wire.HeaderLen]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, wire.Header{}, buf, err
	}
	h, err := wire.ParseHeader(buf)
	if err != nil {
		return nil, h, buf, err
	}
	if h.Oversized() {
		return nil, h, buf, fmt.Errorf("%w: %d bytes, the maximum is %d", ErrOversized, h.Length, wire.MaxMessageSize)
	}
	if cap(buf) < int(h.Length) {
		nb := make([]byte, h.Length)
		copy(nb, buf)
		buf = nb
	}
	buf = buf[:h.Length]
	if _, err := io.ReadFull(r, buf[wire.HeaderLen:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, h, buf, err
	}
	m, err := wire.Decode(buf)
	return m, h, buf, err
}

// ErrOversized is wrapped by ReadMessage's error for a message larger than
// wire.MaxMessageSize.
var ErrOversized = errors.New("message too large")
