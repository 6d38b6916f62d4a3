//go:build unix

package sim

import (
	"syscall"
	"time"
)

// cpuTime returns the process's user plus system CPU time, and false where
// it cannot be read.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
