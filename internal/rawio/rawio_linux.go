//go:build linux

package rawio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Conn is a TCP connection whose reads and writes are raw system calls on
// its non-blocking socket, waiting for readiness in the runtime's network
// poller as net's own do.
//
// The functions given to the descriptor's RawConn are bound once, in Wrap,
// and take their arguments and results through the Conn's fields, under a
// mutex per direction: a closure made per call would escape to the heap
// with the variables it captures, three allocations a read.
type Conn struct {
	tc *net.TCPConn
	rc syscall.RawConn

	rmu    sync.Mutex
	rbuf   []byte
	rn     int
	rerrno syscall.Errno
	readFn func(uintptr) bool

	wmu      sync.Mutex
	one      [1][]byte   // Write's buffer, as single's backing array
	single   net.Buffers // Write's one buffer, for writev
	wbufs    *net.Buffers
	wn       int64
	werrno   syscall.Errno
	writevFn func(uintptr) bool
	iov      [8]syscall.Iovec
}

// Wrap returns c with raw reads and writes when it is a *net.TCPConn whose
// descriptor it can reach, and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok || !enabled {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	rw := &Conn{tc: tc, rc: rc}
	rw.readFn, rw.writevFn = rw.read, rw.writev
	return rw
}

// Read reads into p as net.Conn's Read does: at most len(p) bytes, io.EOF
// at the end of the stream, a *net.OpError otherwise.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	c.rbuf, c.rn, c.rerrno = p, 0, 0
	err := c.rc.Read(c.readFn)
	n, errno := c.rn, c.rerrno
	c.rbuf = nil
	c.rmu.Unlock()
	if err := c.failed("read", "read", err, errno); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// read is Read's RawConn function: done unless the socket had nothing.
func (c *Conn) read(fd uintptr) bool {
	p := c.rbuf
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			c.rn = int(r)
			raceRead(p[:r])
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.rerrno = e
			return true
		}
	}
}

// Write writes all of p, waiting for room in the socket's buffer as
// needed, and returns how much was written and a *net.OpError when not all.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	c.one[0] = p
	c.single = c.one[:]
	n, err := c.writeLocked(&c.single, "write")
	c.one[0] = nil
	c.wmu.Unlock()
	return int(n), err
}

// WriteBuffers writes all of bufs with one writev where the socket takes
// it, consuming what it wrote as net.Buffers.WriteTo does.
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(bufs, "writev")
}

// writeLocked writes bufs through writev; call names the system call in
// an error. c.wmu must be held.
func (c *Conn) writeLocked(bufs *net.Buffers, call string) (int64, error) {
	c.wbufs, c.wn, c.werrno = bufs, 0, 0
	err := c.rc.Write(c.writevFn)
	n, errno := c.wn, c.werrno
	c.wbufs = nil
	c.iov = [8]syscall.Iovec{}
	return n, c.failed("write", call, err, errno)
}

// writev is WriteBuffers' RawConn function.
func (c *Conn) writev(fd uintptr) bool {
	bufs := c.wbufs
	for {
		k := 0
		for _, b := range *bufs {
			if k == len(c.iov) {
				break
			}
			if len(b) == 0 {
				continue
			}
			raceWrite(b)
			c.iov[k].Base = &b[0]
			c.iov[k].SetLen(len(b))
			k++
		}
		if k == 0 {
			consume(bufs, 0) // drop the empty buffers
			return true
		}
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&c.iov[0])), uintptr(k))
		switch e {
		case 0:
			c.wn += int64(r)
			consume(bufs, int64(r))
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werrno = e
			return true
		}
	}
}

// consume drops the first n bytes of bufs.
func consume(bufs *net.Buffers, n int64) {
	for len(*bufs) > 0 {
		l := int64(len((*bufs)[0]))
		if l > n {
			(*bufs)[0] = (*bufs)[0][n:]
			return
		}
		n -= l
		(*bufs)[0] = nil
		*bufs = (*bufs)[1:]
	}
}

// failed returns the error of an operation op (as net.OpError names it)
// whose RawConn call returned err and whose system call, the syscall name
// call, failed with errno, or nil when neither failed: a *net.OpError as
// net's own connections return.
func (c *Conn) failed(op, call string, err error, errno syscall.Errno) error {
	if err == nil && errno == 0 {
		return nil
	}
	if err == nil {
		err = os.NewSyscallError(call, errno)
	} else if oe, ok := err.(*net.OpError); ok {
		// RawConn's own errors (a deadline, a closed descriptor) come as
		// a *net.OpError of its "raw-read" or "raw-write": say the
		// operation the caller made instead.
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.tc.LocalAddr(), Addr: c.tc.RemoteAddr(), Err: err}
}

// Close closes the connection.
func (c *Conn) Close() error { return c.tc.Close() }

// CloseWrite shuts down the writing side of the connection.
func (c *Conn) CloseWrite() error { return c.tc.CloseWrite() }

// LocalAddr returns the local network address.
func (c *Conn) LocalAddr() net.Addr { return c.tc.LocalAddr() }

// RemoteAddr returns the remote network address.
func (c *Conn) RemoteAddr() net.Addr { return c.tc.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return c.tc.SetDeadline(t) }

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.tc.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.tc.SetWriteDeadline(t) }
