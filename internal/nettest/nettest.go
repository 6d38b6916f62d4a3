// Package nettest has network helpers shared by the tests of the root and
// examples modules.
package nettest

import (
	"fmt"
	"net"
	"strconv"
	"syscall"
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
	fd, err := tcpSocket()
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { _ = closeSocket(fd) })
	port, err := bindLoopback(fd, syscall.Bind, syscall.Getsockname)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// bindLoopback binds fd to a free port of 127.0.0.1 and returns the port.
// The descriptor's type is the platform's (an int, or a Windows Handle),
// and so are the syscall package's functions passed for it.
func bindLoopback[FD any](fd FD, bind func(FD, syscall.Sockaddr) error, name func(FD) (syscall.Sockaddr, error)) (int, error) {
	if err := bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return 0, fmt.Errorf("bind: %w", err)
	}
	sa, err := name(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		return 0, fmt.Errorf("getsockname: %T, not an IPv4 address", sa)
	}
	return in4.Port, nil
}
