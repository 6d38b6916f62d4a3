// Package rawio gives TCP connections whose reads and writes are raw
// system calls, which the Go runtime does not see as system calls, so that
// a server that goes idle between requests does not wake the runtime's
// monitor thread each time it starts work again.
//
// Why: the runtime's sysmon thread sleeps deeply while every P is idle and
// is woken by the first system call made through the syscall package
// after that (entersyscall in runtime/proc.go). Woken that way it polls
// every 20 µs for a millisecond or more, and retakes the P from any system
// call still running at its next tick, handing it to another thread. A
// proxy at a moderate, steady load is idle for short gaps between most of
// its requests, so it pays that churn on most of them: on one CPU shared
// with two backends, at 1900 requests/s of 220 KB bodies, the overhead
// benchmark's gateway switched threads three times per request and spent
// about 20% more CPU relative to its backends than with the raw calls
// here, and its p99 went over 5 ms in more of its rounds
// (benchmarks/overhead). golang/go#58492 describes the churn.
//
// The connections stay in the runtime's network poller: a read or write
// that finds the socket not ready waits for it there (syscall.RawConn), and
// deadlines and Close work as on any net.Conn. The calls never block (the
// sockets are non-blocking), so not telling the runtime about them costs
// nothing but the P they hold while the kernel copies the data.
//
// Setting the environment variable INFERROUTE_RAWIO=0 turns it off: Wrap
// then returns the connection it is given. Outside Linux, Wrap always does.
package rawio
