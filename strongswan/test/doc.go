// Package strongswantest runs Debian's charon (strongswan-charon,
// strongswan-swanctl) with espd's plugin against espd in network
// namespaces (package testbed): two gateways negotiate IKEv2 with charon
// and carry ESP with espd, and the tests check what crosses, how charon and
// espd agree on SAs and policies, rekeying, lifetimes, NAT traversal, IPv6,
// interoperability with strongSwan's own userspace ESP (kernel-libipsec)
// and espd restarts.
//
// Each charon runs in its gateway's namespace and in its own mount
// namespace with a private /run, from its own strongswan.conf
// (STRONGSWAN_CONF), with its vici socket in the test's directory.
//
// The tests skip, saying why, when the plugin is not installed (run
// strongswan/build.sh as root); with CI=true they fail instead. The package
// has no code besides its tests.
package strongswantest
