//go:build linux

// Command wakecost measures what a write costs the writer when it must wake
// a reader that sleeps on another CPU: the cost a proxy pays inside its
// write of an answer whenever the client (in the overhead benchmark, wrk on
// the load generators' CPU) has gone idle waiting for it.
//
// Two threads, each pinned to its own CPU, pass one byte back and forth
// through two pipes. The writer times each of its write calls. It does so
// twice: with the reader sleeping in a blocking read, so that every write
// has to wake it, and with the reader polling with non-blocking reads, so
// that no write has to. The difference between the two mean write times is
// what one wake-up costs the writer. The function-call and rescheduling
// interrupts the reader's CPU received, from /proc/interrupts, show how the
// kernel delivered the wake-ups (on Linux, a task woken on an idle CPU is
// queued on that CPU's wake list and the CPU is sent a function-call
// interrupt; see ttwu_queue_cond in kernel/sched/core.c).
//
// On the overhead benchmark's second guest (Firecracker, Linux 6.18, 2
// vCPUs; ../HISTORY.md, session 24) a write that woke the reader took
// 8.7–17.5 µs with the reader's CPU idle (median 9.9 µs in ten runs, a
// function-call interrupt per wake-up) and 11.6 µs in a run with that CPU
// running an idle-priority task (a rescheduling interrupt), against
// 0.7–1.1 µs for a write that woke nobody. There, sending the interrupt to
// the other CPU was the expensive part, whichever kind it was.
//
// Usage:
//
//	wakecost [-writer 1] [-reader 0] [-n 200000]
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// result is one mode's measurement.
type result struct {
	roundTrips int
	elapsed    time.Duration // all round trips, as the writer saw them
	inWrite    time.Duration // the writer's write calls alone
	// fnCall and resched are the function-call and rescheduling
	// interrupts the reader's CPU received, or -1 when /proc/interrupts
	// could not be read.
	fnCall, resched int64
}

func (r result) perTrip(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / float64(r.roundTrips) / 1000
}

func (r result) String() string {
	s := fmt.Sprintf("%d round trips, %.2f µs each; the writer's write %.2f µs per call",
		r.roundTrips, r.perTrip(r.elapsed), r.perTrip(r.inWrite))
	if r.fnCall >= 0 {
		s += fmt.Sprintf("; the reader's CPU received %.2f function-call and %.2f rescheduling interrupts per round trip",
			float64(r.fnCall)/float64(r.roundTrips), float64(r.resched)/float64(r.roundTrips))
	}
	return s
}

// cpuMask is a CPU set as sched_setaffinity takes it: 1024 CPUs, the
// kernel's usual cpumask size.
type cpuMask [16]uint64

// pin binds the calling OS thread to cpu.
func pin(cpu int) error {
	var mask cpuMask
	if cpu < 0 || cpu >= len(mask)*64 {
		return fmt.Errorf("CPU %d out of range", cpu)
	}
	mask[cpu/64] |= 1 << (cpu % 64)
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	if e != 0 {
		return fmt.Errorf("pinning a thread to CPU %d: %w", cpu, e)
	}
	return nil
}

// interrupts returns the function-call (CAL) and rescheduling (RES)
// interrupts cpu has received since boot.
func interrupts(cpu int) (fnCall, resched int64, err error) {
	f, err := os.Open("/proc/interrupts")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return parseInterrupts(f, cpu)
}

// parseInterrupts reads the CAL and RES rows of a /proc/interrupts page
// for cpu. The page's first line names the CPUs (CPU0 CPU1 ...); each row
// is a label, one count per CPU, then a description.
func parseInterrupts(r io.Reader, cpu int) (fnCall, resched int64, err error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return 0, 0, errors.New("/proc/interrupts: empty")
	}
	ncpu := 0
	for _, f := range strings.Fields(sc.Text()) {
		if strings.HasPrefix(f, "CPU") {
			ncpu++
		}
	}
	if cpu < 0 || cpu >= ncpu {
		return 0, 0, fmt.Errorf("/proc/interrupts: no count for CPU %d (the page lists %d CPUs)", cpu, ncpu)
	}
	found := 0
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) <= cpu+1 || (fields[0] != "CAL:" && fields[0] != "RES:") {
			continue
		}
		n, err := strconv.ParseInt(fields[cpu+1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/interrupts: %s for CPU %d: %w", fields[0], cpu, err)
		}
		if fields[0] == "CAL:" {
			fnCall = n
		} else {
			resched = n
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found != 2 {
		return 0, 0, errors.New("/proc/interrupts: no CAL and RES rows")
	}
	return fnCall, resched, nil
}

// measure runs n round trips between a writer on CPU writer and a reader
// on CPU reader, which polls when poll is set and sleeps in read otherwise.
// Each side runs on a thread of its own, locked and pinned, which exits
// with it: no thread of the process is left with a changed affinity.
func measure(writer, reader, n int, poll bool) (result, error) {
	var toReader, toWriter [2]int
	if err := syscall.Pipe2(toReader[:], syscall.O_CLOEXEC); err != nil {
		return result{}, err
	}
	if err := syscall.Pipe2(toWriter[:], syscall.O_CLOEXEC); err != nil {
		syscall.Close(toReader[0])
		syscall.Close(toReader[1])
		return result{}, err
	}
	if poll {
		if err := syscall.SetNonblock(toReader[0], true); err != nil {
			for _, fd := range append(toReader[:], toWriter[:]...) {
				syscall.Close(fd)
			}
			return result{}, err
		}
	}

	// The reader echoes every byte until the writer closes its end.
	readerErr := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		defer syscall.Close(toReader[0])
		defer syscall.Close(toWriter[1])
		readerErr <- echo(reader, toReader[0], toWriter[1])
	}()

	type outcome struct {
		r   result
		err error
	}
	writerDone := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread() // as above
		defer syscall.Close(toWriter[0])
		// Closing its end makes the reader see end of file and return.
		defer syscall.Close(toReader[1])
		r, err := send(writer, reader, n, toReader[1], toWriter[0])
		writerDone <- outcome{r, err}
	}()
	w := <-writerDone
	if rerr := <-readerErr; rerr != nil {
		// The reader's failure is the cause of the writer's (a closed pipe).
		return w.r, fmt.Errorf("reader: %w", rerr)
	}
	return w.r, w.err
}

// echo pins the calling thread to cpu and writes back every byte read from
// in to out, until in reaches end of file.
func echo(cpu, in, out int) error {
	if err := pin(cpu); err != nil {
		return err
	}
	b := []byte{0}
	for {
		k, err := syscall.Read(in, b)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			continue // polling, or a signal
		case err != nil:
			return err
		case k == 0:
			return nil
		}
		if err := retry(func() (int, error) { return syscall.Write(out, b) }); err != nil {
			return err
		}
	}
}

// send pins the calling thread to cpu and runs n round trips, timing its
// writes, with the interrupts readerCPU received meanwhile.
func send(cpu, readerCPU, n, out, in int) (result, error) {
	r := result{roundTrips: n, fnCall: -1, resched: -1}
	if err := pin(cpu); err != nil {
		return r, err
	}
	cal0, res0, ierr := interrupts(readerCPU)
	b := []byte{1}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		w0 := time.Now()
		err := retry(func() (int, error) { return syscall.Write(out, b) })
		r.inWrite += time.Since(w0)
		if err != nil {
			return r, err
		}
		if err := retry(func() (int, error) { return syscall.Read(in, b) }); err != nil {
			return r, err
		}
	}
	r.elapsed = time.Since(t0)
	if cal1, res1, err := interrupts(readerCPU); ierr == nil && err == nil {
		r.fnCall, r.resched = cal1-cal0, res1-res0
	}
	return r, nil
}

// retry calls f again while it fails with EINTR, and turns a call that
// moved no byte into io.ErrUnexpectedEOF.
func retry(f func() (int, error)) error {
	for {
		k, err := f()
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return err
		case k == 0:
			return io.ErrUnexpectedEOF
		}
		return nil
	}
}

func main() {
	writer := flag.Int("writer", 1, "the writer's CPU (run.sh's servers are on CPU 1)")
	reader := flag.Int("reader", 0, "the reader's CPU (run.sh's load generators are on CPU 0)")
	n := flag.Int("n", 200000, "round trips per mode")
	flag.Parse()
	if *writer == *reader {
		fmt.Fprintln(os.Stderr, "wakecost: the writer and the reader need different CPUs")
		os.Exit(2)
	}
	if *n <= 0 {
		fmt.Fprintln(os.Stderr, "wakecost: -n must be positive")
		os.Exit(2)
	}
	var perWrite [2]float64 // the writer's mean write, reader sleeping then polling
	for i, name := range []string{"reader sleeping", "reader polling"} {
		r, err := measure(*writer, *reader, *n, i == 1)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wakecost: %s: %v\n", name, err)
			os.Exit(1)
		}
		perWrite[i] = r.perTrip(r.inWrite)
		fmt.Printf("%-16s %v\n", name+":", r)
	}
	fmt.Printf("a wake-up of the reader on CPU %d costs the writer on CPU %d about %.2f µs per write\n",
		*reader, *writer, perWrite[0]-perWrite[1])
}
