//go:build unix

package nettest

import "syscall"

// tcpSocket opens an IPv4 TCP socket that a child process does not inherit.
func tcpSocket() (int, error) {
	// ForkLock keeps a child started between the two calls from inheriting
	// the descriptor, as package net does where SOCK_CLOEXEC is missing
	// (darwin).
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	return fd, err
}

func closeSocket(fd int) error { return syscall.Close(fd) }
