//go:build !linux

package router

import (
	"net"
	"testing"
)

// requireRaw fails unless c is the *net.TCPConn it was accepted as: raw
// system calls are Linux-only, elsewhere RawListener changes nothing.
func requireRaw(t *testing.T, c net.Conn) {
	t.Helper()
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("RawListener accepted a %T; want the *net.TCPConn itself outside Linux", c)
	}
}
