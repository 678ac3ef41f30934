package conn

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// portHolder is a process that holds a UDP socket bound to a port.
type portHolder struct {
	pid  int
	comm string // /proc/<pid>/comm
	unit string // its systemd service, from /proc/<pid>/cgroup; "" if none
}

// udpSocket is one line of /proc/net/udp or udp6 for the port.
type udpSocket struct {
	uid   int
	inode uint64
}

// maxProcs bounds the processes whose descriptors udpPortHolders reads.
const maxProcs = 1 << 16

// udpPortHolders says who holds the UDP port in the calling thread's
// network namespace (the sockets of /proc/thread-self/net/udp and udp6,
// matched by inode against /proc/<pid>/fd of every process espd may read)
// and, for IKE's ports or a charon, the likely cause: another charon. It
// is what a bind that failed with EADDRINUSE adds to its error.
func udpPortHolders(port int) string {
	var socks []udpSocket
	for _, f := range []string{"/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"} {
		if fh, err := os.Open(f); err == nil {
			socks = append(socks, parseProcNetUDP(fh, port)...)
			fh.Close()
		}
	}
	inodes := map[uint64]bool{}
	for _, s := range socks {
		inodes[s.inode] = true
	}
	return describeHolders(port, socks, findHolders(inodes))
}

// parseProcNetUDP returns the sockets of a /proc/net/udp(6) table whose
// local port is port.
func parseProcNetUDP(r io.Reader, port int) []udpSocket {
	var out []udpSocket
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[0] == "sl" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if !ok || err != nil || int(p) != port {
			continue
		}
		uid, err1 := strconv.Atoi(f[7])
		inode, err2 := strconv.ParseUint(f[9], 10, 64)
		if err1 == nil && err2 == nil && inode != 0 {
			out = append(out, udpSocket{uid: uid, inode: inode})
		}
	}
	return out
}

// findHolders returns the processes with a descriptor of one of the socket
// inodes, as far as /proc lets this process see them.
func findHolders(inodes map[uint64]bool) []portHolder {
	if len(inodes) == 0 {
		return nil
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []portHolder
	for i, d := range dirs {
		if i >= maxProcs {
			break
		}
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", d.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or another user's
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			s, ok := strings.CutPrefix(link, "socket:[")
			ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
			if ok && err == nil && inodes[ino] {
				out = append(out, portHolder{pid: pid, comm: readComm(pid), unit: serviceOf(pid)})
				break
			}
		}
	}
	return out
}

func readComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// serviceOf returns the systemd service (the last ".service" element of
// the cgroup path) of pid, or "".
func serviceOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	return serviceInCgroup(string(b))
}

func serviceInCgroup(cgroup string) string {
	unit := ""
	for _, line := range strings.Split(cgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, el := range strings.Split(parts[2], "/") {
			if strings.HasSuffix(el, ".service") {
				unit = el
			}
		}
		if unit != "" {
			return unit
		}
	}
	return unit
}

// describeHolders words udpPortHolders' answer.
func describeHolders(port int, socks []udpSocket, holders []portHolder) string {
	var b strings.Builder
	switch {
	case len(holders) > 0:
		b.WriteString("held by ")
		for i, h := range holders {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "pid %d (%s)", h.pid, h.comm)
			if h.unit != "" {
				fmt.Fprintf(&b, " of %s", h.unit)
			}
		}
	case len(socks) > 0:
		fmt.Fprintf(&b, "held by a socket of uid %d in a process espd cannot see (`ss -ulpn sport = :%d` names it)", socks[0].uid, port)
	default:
		fmt.Fprintf(&b, "`ss -ulpn sport = :%d` names its holder", port)
	}
	var units []string
	if len(holders) == 0 {
		units = runningIKEUnits()
	}
	if hint := holderHint(port, holders, units); hint != "" {
		b.WriteString("; ")
		b.WriteString(hint)
	}
	return b.String()
}

// ikeUnits are the units of the IKE daemons that clash with espd's ports,
// strongswan-starter's first; unitsDir is where systemd marks the units it
// runs (an "invocation:UNIT" link each), readable by any user.
var (
	ikeUnits = []string{"strongswan-starter.service", "ipsec.service", "strongswan.service"}
	unitsDir = "/run/systemd/units"
)

// runningIKEUnits returns those of ikeUnits that systemd runs. It is how
// espd names a holder that it cannot see itself: the packaged units run
// it as its own user with ProtectProc=invisible, so root's charon is
// hidden from it.
func runningIKEUnits() []string {
	var out []string
	for _, u := range ikeUnits {
		if _, err := os.Lstat(filepath.Join(unitsDir, "invocation:"+u)); err == nil {
			out = append(out, u)
		}
	}
	return out
}

// holderHint names the likely cause of a clash on port and what to do: a
// second charon, strongswan-starter's (ipsec.conf) or a charon-systemd
// that started before espd or with its own sockets. units are the IKE
// daemons' units that run (runningIKEUnits), for a holder espd cannot see.
func holderHint(port int, holders []portHolder, units []string) string {
	charon := port == DefaultIKEPort || port == DefaultEncapPort
	if charon && len(holders) == 0 && len(units) > 0 {
		h := portHolder{comm: "charon", unit: units[0]}
		if h.unit == "strongswan.service" {
			h.comm = "charon-systemd"
		}
		return h.unit + " runs, likely the holder; " + holderHint(port, []portHolder{h}, nil)
	}
	for _, h := range holders {
		switch {
		case h.unit == "strongswan-starter.service" || h.unit == "ipsec.service" || h.comm == "starter":
			unit := cmp.Or(h.unit, "strongswan-starter.service")
			return "that is strongswan-starter's charon (ipsec.conf), a second IKE daemon: " +
				"systemctl disable --now " + unit + ", then move its ipsec.conf to swanctl.conf (docs/migrate.md)"
		case h.comm == "charon-systemd" || h.unit == "strongswan.service":
			return "that is strongswan.service's charon, started before espd or with socket-default: " +
				"systemctl stop strongswan, start espd, then systemctl start strongswan (ike_handoff = yes, socket-default not loaded)"
		case h.comm == "charon":
			return "that is a charon outside espd's setup (strongswan-starter's?): stop it, " +
				"e.g. systemctl disable --now strongswan-starter.service (docs/migrate.md)"
		}
		charon = false // a process that is not charon
	}
	if !charon {
		return ""
	}
	return "the likely holder is another charon: strongswan-starter's ipsec.service (systemctl disable --now strongswan-starter.service) " +
		"or strongswan.service started before espd (systemctl stop strongswan, start espd, then systemctl start strongswan)"
}
