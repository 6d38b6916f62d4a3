//go:build linux && race

package rawio

import (
	"runtime"
	"syscall"
	"unsafe"
)

// The race detector learns that a write to a socket happens before the
// read of what it wrote from annotations in syscall.Write and syscall.Read
// (a release and an acquire of one variable; syscall/syscall_unix.go),
// which raw system calls skip. Without them, goroutines that meet through
// a socket, a test's server and its client, look racy to it. With -race,
// every raw write is therefore preceded by a zero-length syscall.Write and
// every raw read followed by a zero-length syscall.Read, of /dev/null, for
// their annotations alone, and the buffers are marked as read and written
// as syscall marks them.
var devNull = func() int {
	fd, err := syscall.Open("/dev/null", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		panic("rawio: opening /dev/null for the race detector's annotations: " + err.Error())
	}
	return fd
}()

// raceWrite is called before a raw write of p.
func raceWrite(p []byte) {
	_, _ = syscall.Write(devNull, nil)
	if len(p) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
	}
}

// raceRead is called after a raw read filled p.
func raceRead(p []byte) {
	if len(p) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), len(p))
	}
	_, _ = syscall.Read(devNull, nil)
}
