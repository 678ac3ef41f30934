package esp

// Test-only API: what the tests use and espd does not.

// Decapsulate is Open followed, for an authentic packet, by Replay.Update:
// it opens pkt and records its sequence number at once. ErrReplay from the
// record means another caller recorded the same number first (or the
// window moved past it during decryption); the packet is then refused.
// Dummy and ECN-dropped packets are recorded too before ErrDummy or
// ErrECNDrop is returned. Use it where packets need not be recorded in
// arrival order; a pipeline that opens in parallel uses Open and records
// in order (see Open).
func (d *Decapsulator) Decapsulate(pkt []byte, outerTOS uint8) (inner []byte, seq uint64, err error) {
	inner, seq, err = d.Open(pkt, outerTOS)
	if !Authentic(err) || d.Replay == nil {
		return inner, seq, err
	}
	if uerr := d.Replay.Update(seq); uerr != nil {
		return nil, seq, uerr
	}
	return inner, seq, err
}

// Overhead returns how many bytes Encapsulate adds to an inner packet of
// innerLen bytes: outer IP and UDP headers, ESP header, IV, TFC padding
// (when the buffer has room for it), ESP padding, Pad Length, Next Header
// and ICV.
func (e *Encapsulator) Overhead(innerLen int) int {
	p := max(innerLen, e.TFCPadTo)
	return e.fixedOverhead() + p - innerLen + padLen(p, e.Transform.BlockSize()) + 2
}

// EncapsulateDummy builds a dummy ESP packet (Next Header 59, RFC 4303
// section 2.6) whose payload is n zero bytes written at buf[off:off+n],
// framed as Encapsulate does: receivers discard it after the ICV check.
// Sent with n around TFCPadTo it hides when real traffic flows. Its outer
// DSCP is Outer.DSCP (or 0 when copying), ECN Not-ECT, and DF set in
// DFCopy mode.
func (e *Encapsulator) EncapsulateDummy(buf []byte, off, n int, seq uint64) (Packet, error) {
	if off < 0 || n < 0 || off > cap(buf)-n {
		return Packet{}, ErrInner
	}
	return e.encapsulate(buf[:cap(buf)], off, n, seq, NextHeaderDummy, false)
}
