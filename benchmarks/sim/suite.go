package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// Sizes of the suites: requests per run.
const (
	// DefaultRequests is the number of requests per run of the default
	// suite.
	DefaultRequests = 6000
	// QuickRequests is the number of requests per run of the quick suite:
	// enough that a p99 rests on 25 samples rather than 8, which is what
	// lets the CI gate compare p99s (at 800 the p99 of two equally good
	// policies differed by up to 20% from seed noise alone).
	QuickRequests = 2500
)

// CapacityRequests is the size of the workload the suite measures each
// scenario's capacity on (MeasureCapacity), whatever the number of requests
// per run.
const CapacityRequests = 4000

// DefaultLoads are the loads of the suite, as fractions of capacity.
var DefaultLoads = []float64{0.5, 0.7, 0.9}

// Options configures RunSuite. The zero value runs the default suite with
// the baseline policies.
type Options struct {
	// Quick runs the scaled-down suite (QuickRequests per run).
	Quick bool
	// Scenarios selects scenarios by name; nil means all of the suite.
	Scenarios []string
	// Policies selects policies by registry name; nil means
	// policy.Baselines().
	Policies []string
	// Loads are the loads as fractions of capacity, each positive and
	// finite; nil means DefaultLoads.
	Loads []float64
	// Seed seeds workloads, scrapes and policies; 0 means 1.
	Seed uint64
	// Requests overrides the number of requests per run when > 0.
	Requests int
	// TracesDir is the folder of the trace files the trace scenarios
	// replay; "" means ../shared/traces.
	TracesDir string
	// TraceFile, when set, replaces the suite with one scenario replaying
	// this file (Mooncake .jsonl or Azure .csv) on the uniform fleet.
	TraceFile string
	// Pods, when > 0, resizes every scenario's fleet to this many pods by
	// repeating its pod list.
	Pods int
	// Profiles, when set, replaces every scenario's hardware with these
	// profiles, repeated over the pods.
	Profiles []string
	// Registry resolves policy names; nil means policy.Default().
	Registry *policy.Registry
	// Parallel is the number of runs simulated at once; 0 means
	// runtime.GOMAXPROCS(0). Each run is single-threaded and deterministic,
	// so results do not depend on it.
	Parallel int
	// Progress, if not nil, is called after each finished run with the
	// number of finished and total runs and the run's label. It is called
	// from one goroutine at a time.
	Progress func(done, total int, label string)
	// Logger receives diagnostics; nil means discard.
	Logger *slog.Logger
	// Sim configures the simulator; nil means DefaultConfig. Its Pods, SLO
	// and Seed are set per scenario.
	Sim *Config
}

// Report is the outcome of a suite.
type Report struct {
	// Seed is the seed the suite ran with.
	Seed uint64 `json:"seed"`
	// Quick reports whether this was the quick suite.
	Quick bool `json:"quick"`
	// Scenarios has one entry per scenario and load, in suite order.
	Scenarios []ScenarioResult `json:"scenarios"`
	// Skipped lists the scenarios that could not run, with the reason.
	Skipped []string `json:"skipped,omitempty"`
}

// ScenarioResult is one scenario at one load.
type ScenarioResult struct {
	// Name is the scenario's name.
	Name string `json:"name"`
	// Description says what the scenario tests.
	Description string `json:"description"`
	// Load is the offered load as a fraction of Capacity.
	Load float64 `json:"load"`
	// Rate is the offered mean arrival rate in requests per second.
	Rate float64 `json:"rate"`
	// Capacity is the fleet's measured capacity for the workload, in
	// requests per second (MeasureCapacity).
	Capacity float64 `json:"capacity"`
	// Pods lists the fleet's hardware profiles, in pod order.
	Pods []string `json:"pods"`
	// Requests is the number of requests per run.
	Requests int `json:"requests"`
	// SLO is the goodput objective.
	SLO SLO `json:"slo"`
	// Workload summarises the traffic.
	Workload WorkloadSummary `json:"workload"`
	// Policies has one entry per policy, in the order asked for.
	Policies []Metrics `json:"policies"`
	// Reduction compares inferroute with round-robin when both ran.
	Reduction *Reduction `json:"inferroute_vs_round_robin,omitempty"`
}

// WorkloadSummary describes a scenario's traffic (workload.Stats).
type WorkloadSummary struct {
	// PromptMean and OutputMean are the mean prompt and output lengths in
	// tokens.
	PromptMean float64 `json:"prompt_mean_tokens"`
	OutputMean float64 `json:"output_mean_tokens"`
	// InterArrivalCV is the coefficient of variation of the inter-arrival
	// times (1 for Poisson; rate scaling keeps it).
	InterArrivalCV float64 `json:"interarrival_cv"`
	// SharedPrefix is the fraction of prompt tokens in a prefix an earlier
	// request already had: the hit rate of one infinite cache for the whole
	// fleet, an upper bound for the servers' prefix hit rate.
	SharedPrefix float64 `json:"shared_prefix"`
	// AdapterFraction is the fraction of requests that use a LoRA adapter.
	AdapterFraction float64 `json:"adapter_fraction"`
}

// Reduction is inferroute's reduction of TTFT relative to round-robin, in
// percent: 100 × (round-robin − inferroute) / round-robin. Negative means
// inferroute is worse.
type Reduction struct {
	// TTFTMean is the reduction of the mean TTFT, in percent.
	TTFTMean float64 `json:"ttft_mean_pct"`
	// TTFTP99 is the reduction of the p99 TTFT, in percent.
	TTFTP99 float64 `json:"ttft_p99_pct"`
}

// Policy returns the metrics of the named policy and whether it ran.
func (r *ScenarioResult) Policy(name string) (Metrics, bool) {
	for _, m := range r.Policies {
		if m.Policy == name {
			return m, true
		}
	}
	return Metrics{}, false
}

// DefaultTracesDir is where the suite looks for the trace files by default:
// the shared folder beside the repository, seen from the repository root.
const DefaultTracesDir = "../shared/traces"

// prepared is one scenario ready to run: its workload and capacity.
type prepared struct {
	sc  Scenario
	w   *workload.Workload
	cap Capacity
	sum WorkloadSummary
}

// RunSuite runs the selected scenarios at every load with every policy and
// returns the report. Scenarios whose trace files are missing are skipped
// and listed in Report.Skipped; any other error stops the suite. Runs are
// simulated in parallel (Options.Parallel), each deterministic, so the
// report depends only on the options.
func RunSuite(ctx context.Context, o Options) (*Report, error) {
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Policies == nil {
		o.Policies = policy.Baselines()
	}
	if o.Loads == nil {
		o.Loads = DefaultLoads
	}
	if o.TracesDir == "" {
		o.TracesDir = DefaultTracesDir
	}
	if o.Registry == nil {
		o.Registry = policy.Default()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	n := o.Requests
	if n <= 0 {
		n = DefaultRequests
		if o.Quick {
			n = QuickRequests
		}
	}
	for _, l := range o.Loads {
		if !(l > 0) || math.IsInf(l, 0) {
			return nil, fmt.Errorf("sim: load %v is not a positive finite fraction of capacity", l)
		}
	}
	for _, name := range o.Policies {
		if _, ok := o.Registry.Lookup(name); !ok {
			return nil, fmt.Errorf("sim: unknown policy %q (known: %s)", name, strings.Join(o.Registry.Names(), ", "))
		}
	}
	scs, err := selectScenarios(o)
	if err != nil {
		return nil, err
	}

	rep := &Report{Seed: o.Seed, Quick: o.Quick}
	var preps []prepared
	for _, sc := range scs {
		w, err := sc.Build(BuildEnv{N: n, Seed: o.Seed, TracesDir: o.TracesDir})
		if errors.Is(err, ErrTraceMissing) {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: %v", sc.Name, err))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sim: scenario %s: %w", sc.Name, err)
		}
		if len(w.Requests) == 0 {
			rep.Skipped = append(rep.Skipped, sc.Name+": empty workload")
			continue
		}
		// Capacity is measured on a workload of a fixed size, so that the
		// quick and the default suite offer the same rates.
		cw := w
		if n != CapacityRequests {
			if cw, err = sc.Build(BuildEnv{N: CapacityRequests, Seed: o.Seed, TracesDir: o.TracesDir}); err != nil {
				return nil, fmt.Errorf("sim: scenario %s: %w", sc.Name, err)
			}
		}
		c, err := MeasureCapacity(sc.Pods, cw)
		if err != nil {
			return nil, fmt.Errorf("sim: scenario %s: %w", sc.Name, err)
		}
		st := w.Stats()
		preps = append(preps, prepared{sc: sc, w: w, cap: c, sum: WorkloadSummary{
			PromptMean: st.PromptMean, OutputMean: st.OutputMean, InterArrivalCV: st.InterArrivalCV,
			SharedPrefix: st.SharedPrefixFraction, AdapterFraction: st.AdapterFraction,
		}})
	}

	// One result slot per (scenario, load); one job per policy in it.
	type job struct {
		res    *ScenarioResult
		pol    int
		w      *workload.Workload
		cfg    Config
		policy string
	}
	var jobs []job
	for _, p := range preps {
		slo := p.sc.SLO
		if slo == (SLO{}) {
			slo = DefaultSLO
		}
		profiles := make([]string, len(p.sc.Pods))
		for i, pod := range p.sc.Pods {
			profiles[i] = pod.Engine.Profile.Name
		}
		for _, load := range o.Loads {
			rate := load * p.cap.Rate
			rep.Scenarios = append(rep.Scenarios, ScenarioResult{
				Name: p.sc.Name, Description: p.sc.Description,
				Load: load, Rate: rate, Capacity: p.cap.Rate,
				Pods: profiles, Requests: len(p.w.Requests), SLO: slo, Workload: p.sum,
				Policies: make([]Metrics, len(o.Policies)),
			})
			scaled := p.w.Scale(rate)
			cfg := DefaultConfig(p.sc.Pods)
			if o.Sim != nil {
				cfg = *o.Sim
				cfg.Pods = p.sc.Pods
			}
			cfg.SLO, cfg.Seed, cfg.Logger = slo, o.Seed, o.Logger
			for i, name := range o.Policies {
				jobs = append(jobs, job{pol: i, w: scaled, cfg: cfg, policy: name})
			}
		}
	}
	// Point the jobs at the report's slots now that the slice is final.
	for i, k := 0, 0; i < len(rep.Scenarios); i++ {
		for range o.Policies {
			jobs[k].res = &rep.Scenarios[i]
			k++
		}
	}

	par := o.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		mu       sync.Mutex
		done     int
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(par, max(len(jobs), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := New()
			for k := range next {
				j := jobs[k]
				f, _ := o.Registry.Lookup(j.policy)
				m, err := s.Run(ctx, j.cfg, j.w, f)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("sim: %s at %.0f%% with %s: %w", j.res.Name, 100*j.res.Load, j.policy, err)
					cancel()
				}
				m.Policy = j.policy
				j.res.Policies[j.pol] = m
				done++
				if o.Progress != nil {
					o.Progress(done, len(jobs), fmt.Sprintf("%s %.0f%% %s", j.res.Name, 100*j.res.Load, j.policy))
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for k := range jobs {
		select {
		case next <- k:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i := range rep.Scenarios {
		rep.Scenarios[i].Reduction = reduction(&rep.Scenarios[i])
	}
	return rep, nil
}

func reduction(r *ScenarioResult) *Reduction {
	rr, ok1 := r.Policy(policy.RoundRobin)
	ir, ok2 := r.Policy(policy.Inferroute)
	if !ok1 || !ok2 {
		return nil
	}
	pct := func(base, v float64) float64 {
		if base == 0 {
			return 0
		}
		return 100 * (base - v) / base
	}
	return &Reduction{TTFTMean: pct(rr.TTFTMean, ir.TTFTMean), TTFTP99: pct(rr.TTFTP99, ir.TTFTP99)}
}

// selectScenarios applies the scenario, trace, fleet-size and profile
// options to the default suite.
func selectScenarios(o Options) ([]Scenario, error) {
	all := DefaultScenarios()
	var scs []Scenario
	switch {
	case o.TraceFile != "":
		scs = []Scenario{TraceScenario(o.TraceFile, all[0].Pods)}
	case o.Scenarios == nil:
		scs = all
	default:
		for _, name := range o.Scenarios {
			i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
			if i < 0 {
				names := make([]string, len(all))
				for k, s := range all {
					names[k] = s.Name
				}
				return nil, fmt.Errorf("sim: unknown scenario %q (known: %s)", name, strings.Join(names, ", "))
			}
			scs = append(scs, all[i])
		}
	}
	for i := range scs {
		pods := scs[i].Pods
		if len(o.Profiles) > 0 {
			k := len(pods)
			if o.Pods > 0 {
				k = o.Pods
			}
			maxLoRAs := pods[0].Engine.MaxLoRAs
			profiles := make([]string, k)
			for j := range profiles {
				profiles[j] = o.Profiles[j%len(o.Profiles)]
			}
			var err error
			if pods, err = Fleet(maxLoRAs, profiles...); err != nil {
				return nil, err
			}
		} else if o.Pods > 0 && o.Pods != len(pods) {
			resized := make([]Pod, o.Pods)
			for j := range resized {
				resized[j] = pods[j%len(pods)]
				resized[j].Name = fmt.Sprintf("%s-%d", shortName(resized[j].Engine.Profile.Name), j)
			}
			pods = resized
		}
		scs[i].Pods = pods
	}
	return scs, nil
}
