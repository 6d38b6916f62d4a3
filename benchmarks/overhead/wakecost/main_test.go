//go:build linux

package main

import (
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two CPUs that the test may use: the first and the last of its affinity
// mask, the same CPU when there is only one (the round trips then measure
// nothing but still run).
func testCPUs(t *testing.T) (writer, reader int) {
	t.Helper()
	cpus := schedGetaffinity(t)
	require.NotEmpty(t, cpus)
	return cpus[len(cpus)-1], cpus[0]
}

func TestMeasureBothModes(t *testing.T) {
	writer, reader := testCPUs(t)
	for _, poll := range []bool{false, true} {
		r, err := measure(writer, reader, 2000, poll)
		require.NoError(t, err, "poll %v", poll)
		assert.Equal(t, 2000, r.roundTrips)
		assert.Positive(t, r.inWrite, "poll %v", poll)
		assert.Greater(t, r.elapsed, r.inWrite, "a round trip is a write and a read")
		assert.Contains(t, r.String(), "2000 round trips")
	}
}

func TestMeasureBadCPU(t *testing.T) {
	_, err := measure(0, 5000, 10, false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CPU 5000")
}

func TestParseInterrupts(t *testing.T) {
	// The layout of /proc/interrupts on the benchmark's guest, shortened.
	page := `           CPU0       CPU1       
  0:         35          0   IO-APIC    2-edge      timer
LOC:   81237621   95126632   Local timer interrupts
RES:          7         12   Rescheduling interrupts
CAL:   23112990     104851   Function call interrupts
TLB:          0          0   TLB shootdowns
`
	cal, res, err := parseInterrupts(strings.NewReader(page), 1)
	require.NoError(t, err)
	assert.Equal(t, int64(104851), cal)
	assert.Equal(t, int64(12), res)

	_, _, err = parseInterrupts(strings.NewReader(page), 2)
	assert.ErrorContains(t, err, "no count for CPU 2")
	_, _, err = parseInterrupts(strings.NewReader("CPU0 CPU1\nLOC: 1 2 Local\n"), 0)
	assert.ErrorContains(t, err, "no CAL and RES rows")
	_, _, err = parseInterrupts(strings.NewReader("CPU0 CPU1\nCAL: x 2 Function\nRES: 1 2 Resched\n"), 0)
	assert.ErrorContains(t, err, "CAL: for CPU 0")
	_, _, err = parseInterrupts(strings.NewReader(""), 0)
	assert.ErrorContains(t, err, "empty")
}

// schedGetaffinity returns the CPUs the calling thread may run on.
func schedGetaffinity(t *testing.T) []int {
	t.Helper()
	var mask cpuMask
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	require.Zero(t, e, "sched_getaffinity: %v", e)
	var cpus []int
	for i, w := range mask {
		for b := 0; b < 64; b++ {
			if w&(1<<b) != 0 {
				cpus = append(cpus, i*64+b)
			}
		}
	}
	return cpus
}
