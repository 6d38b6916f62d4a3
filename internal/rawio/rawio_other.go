//go:build !linux

package rawio

import "net"

// Wrap returns c: raw reads and writes are for Linux only.
func Wrap(c net.Conn) net.Conn { return c }
