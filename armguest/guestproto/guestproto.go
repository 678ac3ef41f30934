// Package guestproto is what armguest's test and its guests' init
// (armguest/cmd/guestinit) agree on: the console lines the test waits for
// and the port of the guest's echo server.
package guestproto

const (
	// ReadyLine is the console line the init writes once espd is ready:
	// its control socket, opened after its outer sockets and its
	// configuration's states, accepts a connection, and its TUN is up.
	ReadyLine = "ARMGUEST-READY"
	// DoneLine starts the console line the init writes when it ends (espd
	// exited, or the init failed), followed by why.
	DoneLine = "ARMGUEST-DONE"
	// EchoPort is the TCP port of the guest's echo server, on its inner
	// address: each connection gets back what it sends.
	EchoPort = 5001
)
