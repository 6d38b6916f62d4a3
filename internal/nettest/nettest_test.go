package nettest

import (
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestRefusedAddrRefuses checks the contract: a connection to the address
// is refused, not accepted and not left hanging, and each call holds a
// port of its own.
func TestRefusedAddrRefuses(t *testing.T) {
	a, b := RefusedAddr(t), RefusedAddr(t)
	if a == b {
		t.Fatalf("two calls returned the same address %s", a)
	}
	for _, addr := range []string{a, b} {
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err == nil {
			conn.Close()
			t.Fatalf("dialing %s connected; want a refusal", addr)
		}
		if runtime.GOOS != "windows" && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dialing %s: %v; want ECONNREFUSED", addr, err)
		}
	}
}
