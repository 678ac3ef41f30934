// Command udpencap runs inside the xfrmguest guest so that its kernel
// decapsulates ESP-in-UDP (RFC 3948): XFRM only takes UDP-encapsulated ESP
// that arrives on a UDP socket with the UDP_ENCAP socket option set to
// UDP_ENCAP_ESPINUDP, and the guest has no IKE daemon to open one. It opens
// UDP port 4500 (or -port) on IPv4 and IPv6 with that option, prints
// "udpencap: ready" once both are bound, and then holds them until it is
// killed. It never reads the sockets: the kernel takes the ESP packets off
// them before they would be queued. Like an IKE daemon's sockets, each
// bypasses the XFRM policies (a socket policy that allows, both ways):
// the kernel checks a UDP packet against the inbound policies before it
// decapsulates it, so a transport-mode policy between the two hosts would
// otherwise refuse the UDP packets that carry its own ESP.
//
// It is built as a static binary (CGO_ENABLED=0) by the tests and given to
// the guest with xfrmguest.Options.Files.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	port := flag.Int("port", 4500, "UDP port to open")
	flag.Parse()
	if *port < 1 || *port > 65535 {
		fmt.Fprintf(os.Stderr, "udpencap: -port %d out of range 1-65535\n", *port)
		os.Exit(2)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		if _, err := open(fam, *port); err != nil {
			fmt.Fprintln(os.Stderr, "udpencap:", err)
			os.Exit(1)
		}
	}
	fmt.Println("udpencap: ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// open returns a UDP socket of family fam bound to the wildcard address
// and port, with UDP_ENCAP_ESPINUDP set (and IPV6_V6ONLY for IPv6, so
// that the IPv4 socket gets IPv4's packets).
func open(fam, port int) (int, error) {
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port}
	name := "IPv4"
	if fam == unix.AF_INET6 {
		sa, name = &unix.SockaddrInet6{Port: port}, "IPv6"
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: IPV6_V6ONLY: %w", name, err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: bind to port %d: %w", name, port, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_ENCAP, unix.UDP_ENCAP_ESPINUDP); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: UDP_ENCAP_ESPINUDP: %w", name, err)
	}
	level, opt := unix.IPPROTO_IP, unix.IP_XFRM_POLICY
	if fam == unix.AF_INET6 {
		level, opt = unix.IPPROTO_IPV6, unix.IPV6_XFRM_POLICY
	}
	for _, dir := range []uint8{xfrmPolicyIn, xfrmPolicyOut} {
		if err := unix.SetsockoptString(fd, level, opt, string(bypassPolicy(fam, dir))); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: socket bypass policy: %w", name, err)
		}
	}
	return fd, nil
}

// The directions of struct xfrm_userpolicy_info and its action that
// allows.
const (
	xfrmPolicyIn    = 0
	xfrmPolicyOut   = 1
	xfrmPolicyAllow = 0
)

// bypassPolicy returns a struct xfrm_userpolicy_info (168 bytes on 64-bit
// Linux; the guest is x86-64) for a socket policy of direction dir that allows
// everything: a selector of family fam matching any address, no
// lifetime, action allow.
func bypassPolicy(fam int, dir uint8) []byte {
	b := make([]byte, 168)
	const selFamily, dirOff, actionOff = 40, 160, 161 // offsets in the struct
	binary.NativeEndian.PutUint16(b[selFamily:], uint16(fam))
	b[dirOff], b[actionOff] = dir, xfrmPolicyAllow
	return b
}
