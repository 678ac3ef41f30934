// Package routing installs, and removes again, what espd puts into the
// kernel's routing: routes that steer the traffic of outbound policies into
// the TUN device, and the policy-routing rules that send to those routes
// the packets a policy can apply to, and keep espd's own outer packets
// out of them.
//
// The routes live in a dedicated table (Config.Table). For a protect or
// drop policy the table gets a route to the policy's destination prefix
// through the TUN; for a bypass policy it gets a throw route, which ends
// the lookup in this table so that the kernel continues with the next rule
// (usually the main table).
//
// # Rules
//
// The kernel's XFRM applies a policy only to packets from its selector's
// source, so only those are looked up in the table: each source prefix of
// a protect or drop policy has a rule, shared by the policies of that
// source and removed with the last of them (RemoveRoute),
//
//	pref <Priority> from <source> lookup <Table>
//
// and a policy with no source (or 0.0.0.0/0, ::/0) has its family's
//
//	pref <Priority> not fwmark <Mark>/<Mask> lookup <Table>
//
// A full tunnel for a LAN (local 198.18.1.0/24, remote 0.0.0.0/0) thus
// takes the LAN's packets and nothing else: not the gateway's own traffic
// and management access, not what it decrypts and forwards to the LAN.
// Bypass policies take no rule: their throw routes matter only to the
// packets a protect or drop policy's source rule sends to the table
// (strongSwan's bypass-lan, a pass policy LAN to LAN, keeps the LAN's
// packets to the LAN out of the TUN).
//
// espd marks its outer sockets with SO_MARK Mark, so that its ESP packets
// are routed by the main table even when a policy covers their destination
// (the peer) and their source, and never loop back into the TUN. The rule
// of the /0 source leaves them out itself. A narrower source's rule cannot
// ("not" inverts a rule's whole selector, source included), so while any
// is in place its family also has the two mark rules
//
//	pref <Priority-1> fwmark <Mark>/<Mask> goto <Priority+1>
//	pref <Priority+1> nop
//
// which take marked packets past the source rules to whatever rules
// follow, as the /0 source's rule does. The mark rules go in before the
// first narrow source rule and come out after the last; every rule espd
// adds carries protocol Protocol.
//
// Rules select on the source prefix, routes on the destination prefix. A
// policy that also narrows the protocol or ports, or whose source shares
// the table with another policy's destination, routes more into the TUN
// than it covers; the data plane applies the full selector and drops (and
// counts) what no protect policy covers.
//
// A packet the host itself sends from a socket neither bound to an address
// nor connected (UDP sendto, raw) is routed before the kernel picks its
// source, with no source for the rules to match; the kernel then gives it
// the address of its outgoing interface. A source that holds one of the
// host's own addresses on an interface reaching beyond that source
// therefore takes its family's /0 rule rather than a narrow one
// (ruleSourceFor): such packets meet the table too.
//
// # Failing closed
//
// A route through the TUN dies with the TUN, and the TUN dies with the
// process. So that a crashed, killed or restarting espd never lets a
// protected prefix fall through to the main table, every prefix routed
// into the TUN is also held: the table gets a blackhole route to the same
// prefix with metric HoldMetric, added before the TUN route and removed
// after it. While the TUN route exists its lower metric wins; when it
// goes, the blackhole drops the traffic. Blackhole and throw routes are
// bound to no device, so they outlive the TUN and the process, and so do
// the rules. A source's rule goes in before its route and hold, and comes
// out after them.
//
// Only the owner of a policy removing it (RemoveRoute of the last
// reference) removes its hold. Close, the path of an orderly stop, removes
// the TUN routes but keeps the holds, the throw routes and every rule
// while any hold remains, and removes everything when none does. New
// installs no rule by itself: it adopts the holds and throw routes a
// previous instance left, each of which stays until an AddRoute of its
// kind claims it and then goes with that reference's RemoveRoute, and the
// rules it left (duplicates removed, one always stays), each of which
// stays while any adopted hold is unclaimed (it may be what keeps that
// hold's traffic closed) or a Tunnel reference of its source claims it.
// Cleanup removes everything, for taking espd out of a machine for good.
//
// The kernel forgets the holds and rules at a reboot. With
// Config.HoldFile the held prefixes and the sources of the rules are also
// recorded on disk; RestoreHolds puts them back early in the next boot,
// before the network is up, and New holds them again, so that a prefix
// stays closed from power-on until its policy is installed again (or, if
// none is, an administrator installs and removes a policy for it).
package routing
