//go:build unix

package nettest

import (
	"fmt"
	"syscall"
)

// boundSocket binds a TCP socket to a free loopback port without listening
// on it and returns the port and a function that closes the socket.
func boundSocket() (port int, closeSocket func(), err error) {
	// ForkLock keeps a child started between the two calls from inheriting
	// the descriptor, as package net does where SOCK_CLOEXEC is missing
	// (darwin).
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return 0, nil, fmt.Errorf("socket: %w", err)
	}
	closeSocket = func() { _ = syscall.Close(fd) }
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		closeSocket()
		return 0, nil, fmt.Errorf("bind: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		closeSocket()
		return 0, nil, fmt.Errorf("getsockname: %w", err)
	}
	return sa.(*syscall.SockaddrInet4).Port, closeSocket, nil
}
