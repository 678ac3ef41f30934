// Package wire is the codec of espd's control protocol
// (docs/control-protocol.md): it turns the protocol's bytes into values
// and back, and does nothing else. It opens no socket, reads and writes no
// stream, starts no goroutine and knows no server: package control serves
// and speaks the protocol with it.
//
// Every message is a 16-byte header (magic, version, flags, type, length,
// sequence number) followed by netlink-like TLV attributes in network byte
// order, 4-byte aligned. Decode checks a whole message's framing and
// splits its attributes; a Builder encodes one. Each message's body has a
// pair of functions, PutX appending its attributes to a Builder and ReadX
// reading them back into values (sa.Config, sa.Policy, Event, ...), which
// checks every attribute's size, range and repetition and reports the
// first problem as an *Error with the code and the attribute a server
// sends back in its ERROR reply. Keys go in with SA_ADD and never come
// back out.
package wire
