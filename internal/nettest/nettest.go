// Package nettest has network helpers shared by the tests of the root and
// examples modules.
package nettest

import (
	"net"
	"strconv"
	"testing"
)

// RefusedAddr returns a loopback address that refuses connections until
// the test ends, for an endpoint that is down: a socket bound to it, never
// listening, holds the port. A port freed by closing a listener can be
// handed to the next server a test starts, a proxy's own front included,
// which would then forward to itself until it ran out of file descriptors
// (CI once saw it).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	port, closeSocket, err := boundSocket()
	if err != nil {
		t.Fatalf("holding a loopback port: %v", err)
	}
	t.Cleanup(closeSocket)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
