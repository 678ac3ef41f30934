package routing

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Defaults for Config.
const (
	// DefaultTable is the routing table espd's routes go into.
	DefaultTable = 0xe5d0
	// DefaultMark is the fwmark (SO_MARK) of espd's outer packets.
	DefaultMark = 0xe5d0
	// DefaultPriority is the preference of espd's source rules: before
	// the main table (32766), after the local table (0).
	DefaultPriority = 0xe5d
	// Protocol tags every route and rule espd installs (rtnetlink
	// protocol field), so that "ip route show proto 229" lists them and
	// New and Cleanup find those of a previous instance.
	Protocol = 229
	// HoldMetric is the metric of the blackhole route that holds a
	// prefix routed into the TUN: higher than the TUN route's (0 for
	// IPv4, 1024 for IPv6), so it only matters once the TUN route is gone.
	HoldMetric = 0xe5d0
)

// Kind is what a prefix's route in the table does.
type Kind uint8

const (
	// Tunnel routes the prefix into the TUN: protect and drop policies.
	// The prefix is also held by a blackhole route (see the package doc).
	Tunnel Kind = iota + 1
	// Throw ends the lookup in the table so the main table decides:
	// bypass policies.
	Throw
	// Transport is Tunnel for a transport-mode policy: held and ruled
	// alike (a Transport reference counts as a Tunnel one everywhere),
	// its TUN route also carries a locked MTU (Config.TransportMTU), so
	// that the host hands espd whole datagrams, which transport mode
	// needs (espd fragments the ESP packet itself), and an advertised
	// MSS that keeps TCP segments within the path (Config.MTU).
	Transport
)

// String names the kind as ip-route does.
func (k Kind) String() string {
	switch k {
	case Tunnel:
		return "tunnel"
	case Throw:
		return "throw"
	case Transport:
		return "transport"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Config says where the routes and rules go.
type Config struct {
	// LinkIndex and LinkName identify the TUN device. Cleanup ignores
	// them.
	LinkIndex int
	LinkName  string
	// MTU is the TUN's MTU; a Transport route advertises it less the IP
	// and TCP headers as its MSS. 0: 1400.
	MTU int
	// TransportMTU is the locked MTU of a Transport route: the largest
	// datagram the host hands espd whole. 0: 65535.
	TransportMTU int
	// Table is the routing table for espd's routes; 0 means DefaultTable.
	Table int
	// Mark and Mask: packets with mark&Mask == Mark skip the table.
	// Mark 0 means DefaultMark; Mask 0 means 0xffffffff.
	Mark, Mask uint32
	// Priority of the source rules (the mark rules take Priority-1 and
	// Priority+1); 0 means DefaultPriority.
	Priority int
	// NoIPv6 leaves the IPv6 rules alone and refuses IPv6 prefixes.
	NoIPv6 bool
	// HoldFile, if set, is where the held prefixes and the sources of the
	// rules are recorded (see holdfile.go): New holds every prefix it
	// lists and keeps its sources' rules while such a hold is unclaimed,
	// the set is written there shortly after each change and by Close,
	// RestoreHolds puts the holds and rules back at boot, and Cleanup
	// removes it.
	HoldFile string
	// HoldFileError, if set, is told when a write of HoldFile after New
	// fails (the holds in the kernel are unaffected; the next boot would
	// miss the changes since the last good write). New writes it once
	// before it returns, and a failure there is New's error.
	HoldFileError func(error)
}

// setDefaults fills in the defaults and checks what the caller gave.
func (cfg *Config) setDefaults() error {
	if cfg.Table == 0 {
		cfg.Table = DefaultTable
	}
	if cfg.Table == unix.RT_TABLE_MAIN || cfg.Table == unix.RT_TABLE_LOCAL || cfg.Table == unix.RT_TABLE_DEFAULT || cfg.Table < 0 {
		return fmt.Errorf("routing: table %d is reserved", cfg.Table)
	}
	if cfg.Mark == 0 {
		cfg.Mark = DefaultMark
	}
	if cfg.Mask == 0 {
		cfg.Mask = 0xffffffff
	}
	if cfg.Mark&cfg.Mask != cfg.Mark {
		return fmt.Errorf("routing: mark %#x has bits outside mask %#x", cfg.Mark, cfg.Mask)
	}
	if cfg.Priority == 0 {
		cfg.Priority = DefaultPriority
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1400
	}
	if cfg.TransportMTU == 0 {
		cfg.TransportMTU = 65535
	}
	if cfg.MTU < 576 || cfg.TransportMTU < cfg.MTU || cfg.TransportMTU > 65535 {
		return fmt.Errorf("routing: MTU %d and transport MTU %d: want 576 <= MTU <= transport MTU <= 65535", cfg.MTU, cfg.TransportMTU)
	}
	return nil
}

func (cfg *Config) families() []int {
	if cfg.NoIPv6 {
		return []int{unix.AF_INET}
	}
	return []int{unix.AF_INET, unix.AF_INET6}
}
