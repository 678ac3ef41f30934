// Package scalebench holds BenchmarkManyStates: 10,000 states and 10,000
// policies installed in two running espd daemons through their control
// sockets (control.Client), how long that takes, and the TCP throughput
// of a tunnel between them with those installed against the same tunnel
// alone. It needs root and network namespaces (testbed) and builds
// ./cmd/espd; run it with
//
//	go test -run XXX -bench ManyStates -benchtime 1x ./bench/scalebench
//
// It is a separate package so that `go test ./dataplane` stays quick.
package scalebench
