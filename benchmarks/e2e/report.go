package e2e

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteCompare prints a Compare result as a table: per policy, the
// client-side TTFT over HTTP and the simulated TTFT, mean and p99, and the
// default picker's reduction against round-robin in both.
func WriteCompare(w io.Writer, r *CompareResult) error {
	fmt.Fprintf(w, "offered %.2f req/s (fleet capacity %.2f req/s)\n", r.Rate, r.Capacity)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tHTTP n\tHTTP TTFT mean\tHTTP TTFT p99\tsim TTFT mean\tsim TTFT p99\tlost\tcut\ttruncated\ttimed out\tshed\twall\t")
	for _, p := range r.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t\n", p.Policy, p.HTTP.N, ms(p.HTTP.Mean), ms(p.HTTP.P99),
			ms(p.Sim.Mean), ms(p.Sim.P99), p.Lost, p.Cut, p.Truncated, p.TimedOut, p.Shed, p.Wall.Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rr, ir, ok := r.pair(); ok {
		fmt.Fprintf(w, "inferroute vs round-robin: HTTP mean %s, p99 %s; sim mean %s, p99 %s\n",
			pct(ir.HTTP.Mean, rr.HTTP.Mean), pct(ir.HTTP.P99, rr.HTTP.P99), pct(ir.Sim.Mean, rr.Sim.Mean), pct(ir.Sim.P99, rr.Sim.P99))
	}
	return nil
}

// pair returns the round-robin and inferroute results.
func (r *CompareResult) pair() (rr, ir PolicyResult, ok bool) {
	var okR, okI bool
	for _, p := range r.Policies {
		switch p.Policy {
		case RoundRobin:
			rr, okR = p, true
		case Inferroute:
			ir, okI = p, true
		}
	}
	return rr, ir, okR && okI
}

// Reduction returns the default picker's relative TTFT change against
// round-robin (negative is better): HTTP and simulated, mean and p99.
func (r *CompareResult) Reduction() (httpMean, httpP99, simMean, simP99 float64, ok bool) {
	rr, ir, ok := r.pair()
	if !ok {
		return 0, 0, 0, 0, false
	}
	rel := func(a, b float64) float64 { return (a - b) / b }
	return rel(ir.HTTP.Mean, rr.HTTP.Mean), rel(ir.HTTP.P99, rr.HTTP.P99), rel(ir.Sim.Mean, rr.Sim.Mean), rel(ir.Sim.P99, rr.Sim.P99), true
}

func ms(sec float64) string { return fmt.Sprintf("%.0f ms", sec*1000) }

func pct(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.0f%%", (a-b)/b*100)
}

// WriteChaos prints a Chaos result: the outcome counts and each kill.
func WriteChaos(w io.Writer, r *ChaosResult) error {
	l := r.Load
	fmt.Fprintf(w, "requests %d: ok %d, lost before first byte %d, cut mid-stream %d (reported to the client), silently truncated %d, timed out in a queue %d; wall %s\n",
		len(l.Outcomes), l.Count(OK), l.Count(Lost), l.Count(Cut), l.Count(Truncated), l.Count(TimedOut), l.Elapsed.Round(time.Millisecond))
	for _, o := range l.Outcomes {
		if o.Status == Lost || o.Status == Truncated {
			fmt.Fprintf(w, "  request %d %s: %v\n", o.Index, o.Status, o.Err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pod\tkilled at\tdown for\tattempts while dead\tfirst connect error after kill\tmarked down after it\ttraffic after first connect error\tpicks begun after mark-down\tlast one after it\tretries after it\tlate successes\tscrape interval")
	var start time.Time
	for _, o := range l.Outcomes {
		if !o.Sent.IsZero() && (start.IsZero() || o.Sent.Before(start)) {
			start = o.Sent
		}
	}
	for _, k := range r.Kills {
		firstErr, marked := "none", "never"
		if !k.FirstConnectError.IsZero() {
			firstErr = k.FirstConnectError.Sub(k.At).Round(time.Microsecond).String()
		}
		if !k.MarkedDown.IsZero() && !k.FirstConnectError.IsZero() {
			marked = k.MarkedDown.Sub(k.FirstConnectError).Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\n", k.Pod, k.At.Sub(start).Round(time.Millisecond),
			k.RestartAt.Sub(k.At).Round(time.Millisecond), k.Attempts, firstErr, marked, k.OutOfRotation().Round(time.Microsecond),
			k.Picks, k.PickOutOfRotation().Round(time.Microsecond), k.Retries, k.LateSuccesses, r.ScrapeInterval)
	}
	return tw.Flush()
}

// WriteOverload prints an Overload result: outcomes by priority and the
// runtime samples' peaks.
func WriteOverload(w io.Writer, r *OverloadResult) error {
	fmt.Fprintf(w, "offered %.2f req/s = %.1f× capacity %.2f req/s\n", r.Rate, r.Rate/r.Capacity, r.Capacity)
	for _, prio := range []int{1, -1} {
		counts := map[Status]int{}
		retryAfter := 0
		n := 0
		for _, o := range r.Load.Outcomes {
			if o.Priority != prio {
				continue
			}
			n++
			counts[o.Status]++
			if o.Status == Shed && o.RetryAfter != "" {
				retryAfter++
			}
		}
		fmt.Fprintf(w, "priority %+d: %d requests, ok %d, shed (429) %d (with Retry-After %d), lost %d, cut %d, truncated %d\n",
			prio, n, counts[OK], counts[Shed], retryAfter, counts[Lost], counts[Cut], counts[Truncated])
	}
	g, h := r.Peaks()
	fmt.Fprintf(w, "peak goroutines %d, peak heap in use %.1f MiB over %d samples\n", g, float64(h)/(1<<20), len(r.Samples))
	// Peaks per 5-second window show whether they level off.
	fmt.Fprint(w, "per 5 s window, peak goroutines / heap MiB:")
	for from := time.Duration(0); len(r.Samples) > 0 && from <= r.Samples[len(r.Samples)-1].At; from += 5 * time.Second {
		g, h := 0, uint64(0)
		for _, s := range r.Samples {
			if s.At >= from && s.At < from+5*time.Second {
				g, h = max(g, s.Goroutines), max(h, s.HeapInuse)
			}
		}
		fmt.Fprintf(w, " %d/%.0f", g, float64(h)/(1<<20))
	}
	fmt.Fprintln(w)
	return nil
}

// Peaks returns the largest goroutine count and heap in use sampled.
func (r *OverloadResult) Peaks() (goroutines int, heapInuse uint64) {
	for _, s := range r.Samples {
		goroutines = max(goroutines, s.Goroutines)
		heapInuse = max(heapInuse, s.HeapInuse)
	}
	return goroutines, heapInuse
}
