//go:build !unix

package sim

import "time"

// cpuTime cannot read the CPU time on this system.
func cpuTime() (time.Duration, bool) { return 0, false }
