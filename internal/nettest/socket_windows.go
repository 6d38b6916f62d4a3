package nettest

import "syscall"

// tcpSocket opens an IPv4 TCP socket. (A connection to the port it is
// bound to is refused after Windows' SYN retries, about two seconds,
// rather than at once.)
func tcpSocket() (syscall.Handle, error) {
	return syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_TCP)
}

func closeSocket(fd syscall.Handle) error { return syscall.Closesocket(fd) }
