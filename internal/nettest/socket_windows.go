package nettest

import (
	"fmt"
	"syscall"
)

// boundSocket binds a TCP socket to a free loopback port without listening
// on it and returns the port and a function that closes the socket. (A
// connection to it is refused after Windows' SYN retries, about two
// seconds, rather than at once.)
func boundSocket() (port int, closeSocket func(), err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_TCP)
	if err != nil {
		return 0, nil, fmt.Errorf("socket: %w", err)
	}
	closeSocket = func() { _ = syscall.Closesocket(fd) }
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
