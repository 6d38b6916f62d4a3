package rawio

import (
	"net"
	"os"
)

// enabled is false when INFERROUTE_RAWIO=0 turns raw connections off; Wrap
// reads it on Linux (elsewhere they are always off).
var enabled = os.Getenv("INFERROUTE_RAWIO") != "0"

// Listener is a net.Listener whose accepted connections are wrapped with
// Wrap.
type Listener struct{ net.Listener }

// Accept waits for and returns the next connection, wrapped.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}
