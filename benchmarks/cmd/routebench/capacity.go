package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// capacityOptions configures the -capacity search.
type capacityOptions struct {
	// Scenarios are the scenarios to size (their fleet is the pod pattern
	// repeated to each size, their workload the traffic).
	Scenarios []sim.Scenario
	// Policies are registry names.
	Policies []string
	Registry *policy.Registry
	// Rate is the offered rate in requests per second; 0 means LoadOfFleet
	// times the scenario's default fleet's measured capacity.
	Rate float64
	// LoadOfFleet is the default rate as a fraction of the default fleet's
	// capacity (used when Rate is 0).
	LoadOfFleet float64
	// SLO is the p99 TTFT objective; 0 means the scenario's TTFT SLO.
	SLO time.Duration
	// MaxPods bounds the search; 0 means four times the default fleet.
	MaxPods  int
	Requests int
	Seed     uint64
	// Unlabelled runs the fleets without GPU labels (sim.Config.Unlabelled).
	Unlabelled bool
	// TracesDir is where trace scenarios read their files.
	TracesDir string
	Parallel  int
	Progress  func(done, total int, label string)
}

// capacityRow is the result of one scenario and policy.
type capacityRow struct {
	Scenario string  `json:"scenario"`
	Policy   string  `json:"policy"`
	Rate     float64 `json:"rate"`
	SLO      float64 `json:"slo_ttft_p99_s"`
	// Pods is the fewest pods meeting the SLO, 0 when even MaxPods do not.
	Pods int `json:"pods"`
	// P99 is the p99 TTFT at Pods (at MaxPods when none meets the SLO).
	P99     float64 `json:"ttft_p99_s"`
	MaxPods int     `json:"max_pods"`
	// Fleet describes the pods at Pods.
	Fleet string `json:"fleet"`
}

// resize returns a fleet of n pods with the hardware mix of pods: the
// pattern is first interleaved so that every prefix of it keeps the mix as
// close to proportional as whole pods allow (each next pod is of the type
// furthest below its share, ties to the type listed first), then repeated.
// A plain repetition of "2×H100, 3×A100, 3×L4" would make a 3-pod fleet
// all H100s and A100s, and the pod count would then not measure the same
// hardware mix at every size.
func resize(pods []sim.Pod, n int) []sim.Pod {
	order := interleave(pods)
	out := make([]sim.Pod, n)
	for i := range out {
		out[i] = order[i%len(order)]
		out[i].Name = ""
	}
	return out
}

// interleave orders pods so that each prefix keeps their profile mix.
func interleave(pods []sim.Pod) []sim.Pod {
	type group struct {
		pods  []sim.Pod
		taken int
	}
	var groups []*group
	byName := map[string]*group{}
	for _, p := range pods {
		g, ok := byName[p.Engine.Profile.Name]
		if !ok {
			g = &group{}
			byName[p.Engine.Profile.Name] = g
			groups = append(groups, g)
		}
		g.pods = append(g.pods, p)
	}
	out := make([]sim.Pod, 0, len(pods))
	for k := 1; k <= len(pods); k++ {
		var best *group
		bestDeficit := 0.0
		for _, g := range groups {
			if g.taken == len(g.pods) {
				continue
			}
			// Share owed after k pods minus pods already given.
			deficit := float64(k)*float64(len(g.pods))/float64(len(pods)) - float64(g.taken)
			if best == nil || deficit > bestDeficit {
				best, bestDeficit = g, deficit
			}
		}
		out = append(out, best.pods[best.taken])
		best.taken++
	}
	return out
}

// fleetOf summarises the profiles of pods as "2×h100 + 3×a100".
func fleetOf(pods []sim.Pod) string {
	var order []string
	counts := map[string]int{}
	for _, p := range pods {
		n := p.Engine.Profile.Name
		if counts[n] == 0 {
			order = append(order, n)
		}
		counts[n]++
	}
	parts := make([]string, len(order))
	for i, n := range order {
		parts[i] = fmt.Sprintf("%d×%s", counts[n], n)
	}
	return strings.Join(parts, " + ")
}

// findCapacity finds, per scenario and policy, the fewest pods meeting the
// p99 TTFT objective at the offered rate, by bisection over the pod count
// (p99 TTFT falls as pods are added: more pods serve the same rate at a
// lower load). A size meets the objective when every request completed and
// the p99 TTFT is at most the SLO.
func findCapacity(ctx context.Context, o capacityOptions) ([]capacityRow, error) {
	type job struct {
		sc   sim.Scenario
		w    *workload.Workload
		rate float64
		slo  time.Duration
		max  int
		pol  string
		row  *capacityRow
	}
	var jobs []*job
	rows := make([]capacityRow, 0, len(o.Scenarios)*len(o.Policies))
	for _, sc := range o.Scenarios {
		w, err := sc.Build(sim.BuildEnv{N: o.Requests, Seed: o.Seed, TracesDir: o.TracesDir})
		if err != nil {
			return nil, fmt.Errorf("capacity: scenario %s: %w", sc.Name, err)
		}
		rate := o.Rate
		if rate <= 0 {
			cw, err := sc.Build(sim.BuildEnv{N: sim.CapacityRequests, Seed: o.Seed, TracesDir: o.TracesDir})
			if err != nil {
				return nil, fmt.Errorf("capacity: scenario %s: %w", sc.Name, err)
			}
			c, err := sim.MeasureCapacity(sc.Pods, cw)
			if err != nil {
				return nil, fmt.Errorf("capacity: scenario %s: %w", sc.Name, err)
			}
			rate = o.LoadOfFleet * c.Rate
		}
		slo := o.SLO
		if slo <= 0 {
			slo = sc.SLO.TTFT
			if slo <= 0 {
				slo = sim.DefaultSLO.TTFT
			}
		}
		maxPods := o.MaxPods
		if maxPods <= 0 {
			maxPods = 4 * len(sc.Pods)
		}
		for _, p := range o.Policies {
			rows = append(rows, capacityRow{Scenario: sc.Name, Policy: p, Rate: rate, SLO: slo.Seconds(), MaxPods: maxPods})
			jobs = append(jobs, &job{sc: sc, w: w.Scale(rate), rate: rate, slo: slo, max: maxPods, pol: p})
		}
	}
	for i := range jobs {
		jobs[i].row = &rows[i]
	}

	par := o.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	var (
		mu       sync.Mutex
		done     int
		firstErr error
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan *job)
	for range min(par, max(len(jobs), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := sim.New()
			for j := range next {
				f, ok := o.Registry.Lookup(j.pol)
				var err error
				if !ok {
					err = fmt.Errorf("unknown policy %q", j.pol)
				} else {
					err = bisectPods(ctx, s, j.sc, j.w, j.slo, j.max, o.Seed, o.Unlabelled, f, j.row)
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("capacity: %s with %s: %w", j.sc.Name, j.pol, err)
					cancel()
				}
				done++
				if o.Progress != nil {
					o.Progress(done, len(jobs), "capacity "+j.sc.Name+" "+j.pol)
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, j := range jobs {
		select {
		case next <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return rows, ctx.Err()
}

// bisectPods fills row with the fewest pods in [1, maxPods] meeting slo.
func bisectPods(ctx context.Context, s *sim.Sim, sc sim.Scenario, w *workload.Workload, slo time.Duration, maxPods int, seed uint64, unlabelled bool, f policy.Factory, row *capacityRow) error {
	p99 := map[int]float64{}
	meets := func(n int) (bool, error) {
		cfg := sim.DefaultConfig(resize(sc.Pods, n))
		cfg.Seed, cfg.Unlabelled = seed, unlabelled
		if sc.SLO != (sim.SLO{}) {
			cfg.SLO = sc.SLO
		}
		m, err := s.Run(ctx, cfg, w, f)
		if err != nil {
			return false, err
		}
		p99[n] = m.TTFTP99
		return m.Failed == 0 && m.TTFTP99 <= slo.Seconds(), nil
	}
	ok, err := meets(maxPods)
	if err != nil {
		return err
	}
	if !ok {
		row.Pods, row.P99, row.Fleet = 0, p99[maxPods], fleetOf(resize(sc.Pods, maxPods))
		return nil
	}
	lo, hi := 0, maxPods // lo fails (0 pods serve nothing), hi meets
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := meets(mid)
		if err != nil {
			return err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	row.Pods, row.P99, row.Fleet = hi, p99[hi], fleetOf(resize(sc.Pods, hi))
	return nil
}

// writeCapacityTable prints the rows, one table per scenario, with each
// policy's pods relative to round-robin's when it ran.
func writeCapacityTable(w io.Writer, rows []capacityRow) error {
	var b strings.Builder
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].Scenario == rows[i].Scenario {
			j++
		}
		r0 := rows[i]
		fmt.Fprintf(&b, "== capacity of %s: fewest pods with p99 TTFT ≤ %s at %.2f req/s (searched 1..%d)\n",
			r0.Scenario, time.Duration(r0.SLO*float64(time.Second)), r0.Rate, r0.MaxPods)
		rr := 0
		for _, r := range rows[i:j] {
			if r.Policy == policy.RoundRobin {
				rr = r.Pods
			}
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tpods\tp99 TTFT ms\tvs round-robin\tfleet\t")
		for _, r := range rows[i:j] {
			pods := fmt.Sprint(r.Pods)
			if r.Pods == 0 {
				pods = fmt.Sprintf(">%d", r.MaxPods)
			}
			vs := "-"
			if rr > 0 && r.Pods > 0 {
				vs = fmt.Sprintf("%+.0f%%", 100*float64(r.Pods-rr)/float64(rr))
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t\n", r.Policy, pods, 1000*r.P99, vs, r.Fleet)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		b.WriteByte('\n')
		i = j
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// runCapacity is the -capacity mode.
func (x *extraFlags) runCapacity(ctx context.Context, o sim.Options, stdout, stderr io.Writer, progress func(done, total int, label string)) error {
	scs, err := scenariosFor(o, stderr)
	if err != nil {
		return err
	}
	reg := o.Registry
	if reg == nil {
		reg = policy.Default()
	}
	for _, p := range o.Policies {
		if _, ok := reg.Lookup(p); !ok {
			return fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(reg.Names(), ", "))
		}
	}
	n := o.Requests
	if n <= 0 {
		n = 2000
		if o.Quick {
			n = sim.QuickRequests
		}
	}
	if *x.maxPods < 0 || !(*x.rate >= 0) || math.IsInf(*x.rate, 0) || *x.slo < 0 {
		return errors.New("-capacity: -rate, -slo and -max-pods must not be negative, and -rate must be finite")
	}
	rows, err := findCapacity(ctx, capacityOptions{
		Scenarios: scs, Policies: o.Policies, Registry: reg,
		Rate: *x.rate, LoadOfFleet: 0.7, SLO: *x.slo, MaxPods: *x.maxPods,
		Requests: n, Seed: o.Seed, TracesDir: o.TracesDir, Parallel: o.Parallel, Progress: progress,
		Unlabelled: o.Sim != nil && o.Sim.Unlabelled,
	})
	if err != nil {
		return err
	}
	return writeCapacityTable(stdout, rows)
}
