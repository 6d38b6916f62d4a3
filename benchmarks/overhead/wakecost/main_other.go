//go:build !linux

// Command wakecost measures what waking a reader on another CPU costs the
// writer. It needs Linux (thread affinity, /proc/interrupts).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "wakecost: Linux only")
	os.Exit(1)
}
