package router

import (
	"net"

	"github.com/inferroute/inferroute/internal/rawio"
)

// RawListener returns ln with every connection it accepts read and written
// through raw system calls on Linux, as the Proxy's own upstream
// connections are: serve the Proxy (or any handler) on it so that a server
// that goes idle between requests does not wake the Go runtime's sysmon
// thread into polling and retaking the P each time work resumes, which at
// a moderate load cost the example gateway about 15% of its CPU and
// pushed its p99 past 5 ms in more rounds (benchmarks/overhead, session
// 57; golang/go#58492).
//
// The connections keep every net.Conn contract: they wait in the
// runtime's network poller, deadlines and Close work, and errors are
// *net.OpError values. Wrap ln before adding TLS (tls.NewListener) so
// that the raw calls carry the encrypted bytes. Connections that are not
// TCP, every connection outside Linux, and every connection when the
// environment variable INFERROUTE_RAWIO is "0", are returned as accepted.
func RawListener(ln net.Listener) net.Listener {
	return rawio.Listener{Listener: ln}
}
