package router

import (
	"net"
	"os"
	"testing"

	"github.com/inferroute/inferroute/internal/rawio"
)

// requireRaw fails unless c reads and writes with raw system calls, as a
// RawListener's connections do on Linux (unless INFERROUTE_RAWIO=0).
func requireRaw(t *testing.T, c net.Conn) {
	t.Helper()
	_, raw := c.(*rawio.Conn)
	if want := os.Getenv("INFERROUTE_RAWIO") != "0"; raw != want {
		t.Fatalf("RawListener accepted a %T (raw %v); want raw %v", c, raw, want)
	}
}
