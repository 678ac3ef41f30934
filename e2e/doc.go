// Package e2e holds espd's end-to-end tests: they build cmd/espd and
// cmd/espctl, run two espd gateways in a line of network namespaces
// (package testbed) and check what crosses the tunnel between them, from
// the outside, as a user would. The package has no code besides its tests.
//
// The tests need root, iproute2, iputils ping and util-linux setpriv; they
// use only 198.18.0.0/15 and 2001:db8::/32 and remove their namespaces
// afterwards.
package e2e
