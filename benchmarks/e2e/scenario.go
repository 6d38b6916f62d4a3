package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/inferroute/inferroute/benchmarks/emulator"
	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/workload"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals/scrape"
)

// HeteroProfiles is routebench's "hetero" fleet (benchmarks/sim
// DefaultScenarios): 2×H100 + 3×A100 + 3×L4 serving Llama-3-8B.
var HeteroProfiles = []string{sim.H100, sim.H100, sim.A100, sim.A100, sim.A100, sim.L4, sim.L4, sim.L4}

// ShortOutputLengths keeps ShareGPT's prompt lengths (sim.ShareGPTLengths)
// but shortens the outputs (p50 64, p90 160, at most 256 tokens): a real
// HTTP run streams one SSE event per token through the pod, the gateway
// and the client, and ShareGPT's 415-token median would make the CPU of
// the test machine, not the routing, the bottleneck. The simulation it is
// compared with replays the same requests, so the comparison is fair.
var ShortOutputLengths = sim.LogNormalLengths{
	PromptP50: 1730, PromptP90: 5696,
	OutputP50: 64, OutputP90: 160,
	MaxPrompt: 7434, MaxOutput: 256,
}

// Fleet returns emulator options for one pod per profile at speed, each
// stopping by itself after lifetime.
func Fleet(profiles []string, speed float64, lifetime time.Duration) []emulator.Options {
	out := make([]emulator.Options, len(profiles))
	for i, p := range profiles {
		out[i] = emulator.Options{Profile: p, Speed: speed, Lifetime: lifetime}
	}
	return out
}

// Workload generates n Poisson requests with lengths (nil means
// ShortOutputLengths) and scales them to load × the capacity of the fleet
// of profiles for those requests (sim.MeasureCapacity: the sum of each
// pod's saturated throughput on its round-robin share). Tenants, when not
// nil, share the traffic. It returns the workload and the fleet's capacity
// in requests per second.
func Workload(profiles []string, n int, load float64, lengths workload.LengthSampler, tenants []workload.Tenant, seed uint64) (*workload.Workload, float64, error) {
	if lengths == nil {
		lengths = ShortOutputLengths
	}
	pods, err := sim.Fleet(0, profiles...)
	if err != nil {
		return nil, 0, err
	}
	w, err := workload.Generate(workload.GenConfig{
		Name: "e2e", Seed: seed, N: n, Arrivals: workload.Poisson{Rate: 1}, Lengths: lengths, Tenants: tenants,
	})
	if err != nil {
		return nil, 0, err
	}
	c, err := sim.MeasureCapacity(pods, w)
	if err != nil {
		return nil, 0, err
	}
	return w.Scale(load * c.Rate), c.Rate, nil
}

// CompareConfig configures Compare.
type CompareConfig struct {
	// Profiles is the fleet; nil means HeteroProfiles.
	Profiles []string
	// Requests is the number of requests; 0 means 400.
	Requests int
	// Load is the offered load as a fraction of capacity; 0 means 0.8.
	Load float64
	// Lengths samples request lengths; nil means ShortOutputLengths.
	Lengths workload.LengthSampler
	// Speed is the emulated pods' speed factor; 0 means 1.
	Speed float64
	// Seed seeds the workload, the pickers and the scrapers; 0 means 1.
	Seed uint64
	// Policies are the policies compared; nil means RoundRobin and
	// Inferroute.
	Policies []string
}

// PolicyResult is one policy's figures over HTTP and in the simulator.
type PolicyResult struct {
	Policy string
	// HTTP summarises the client-side TTFT in the modelled GPU's seconds
	// (wall seconds × Speed).
	HTTP Summary
	// Sim summarises routebench's simulated TTFT of the same requests.
	Sim Summary
	// OK, Lost, Cut, Truncated, TimedOut and Shed count the HTTP
	// outcomes; HTTP summarises the OK ones only, so a run with requests
	// timed out or shed has fewer than it sent.
	OK, Lost, Cut, Truncated, TimedOut, Shed int
	// Wall is the HTTP run's wall time.
	Wall time.Duration
}

// CompareResult is the outcome of Compare.
type CompareResult struct {
	// Rate is the offered request rate in the modelled time, and Capacity
	// the fleet's measured capacity, in requests per second.
	Rate, Capacity float64
	Policies       []PolicyResult
}

// Compare runs the same workload through a real gateway on emulated pods
// and through routebench's simulator, once per policy, and returns both
// TTFT summaries per policy. Every policy gets a fresh fleet (cold caches).
func Compare(ctx context.Context, cfg CompareConfig) (*CompareResult, error) {
	if cfg.Profiles == nil {
		cfg.Profiles = HeteroProfiles
	}
	if cfg.Requests <= 0 {
		cfg.Requests = 400
	}
	if cfg.Load <= 0 {
		cfg.Load = 0.8
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Policies == nil {
		cfg.Policies = []string{RoundRobin, Inferroute}
	}
	w, capacity, err := Workload(cfg.Profiles, cfg.Requests, cfg.Load, cfg.Lengths, nil, cfg.Seed)
	if err != nil {
		return nil, err
	}
	out := &CompareResult{Rate: cfg.Load * capacity, Capacity: capacity}
	pods, err := sim.Fleet(0, cfg.Profiles...)
	if err != nil {
		return nil, err
	}
	for _, pol := range cfg.Policies {
		pr := PolicyResult{Policy: pol}
		var factory policy.Factory
		switch pol {
		case RoundRobin:
			factory = policy.NewRoundRobin
		case Inferroute:
			factory = func(env policy.Env) (policy.Policy, error) {
				return policy.NewPicker(Inferroute, picker.DefaultConfig(), env, picker.WithRegistry(scorer.NewRegistry()))
			}
		default:
			return nil, fmt.Errorf("e2e: unknown policy %q", pol)
		}
		simCfg := sim.DefaultConfig(pods)
		simCfg.Seed = cfg.Seed
		m, err := sim.New().Run(ctx, simCfg, w, factory)
		if err != nil {
			return nil, fmt.Errorf("e2e: simulating %s: %w", pol, err)
		}
		simTTFT := slices.Clone(m.TTFTs)
		slices.Sort(simTTFT)
		pr.Sim = Summarize(simTTFT)

		res, err := runHTTP(ctx, cfg.Profiles, cfg.Speed, GatewayConfig{Policy: pol, Seed: cfg.Seed,
			ScrapeInterval: time.Duration(float64(50*time.Millisecond) / cfg.Speed)}, w, nil)
		if err != nil {
			return nil, fmt.Errorf("e2e: %s over HTTP: %w", pol, err)
		}
		pr.HTTP = Summarize(res.Load.TTFTs(cfg.Speed))
		pr.OK, pr.Lost, pr.Cut, pr.Truncated = res.Load.Count(OK), res.Load.Count(Lost), res.Load.Count(Cut), res.Load.Count(Truncated)
		pr.TimedOut, pr.Shed = res.Load.Count(TimedOut), res.Load.Count(Shed)
		pr.Wall = res.Load.Elapsed
		out.Policies = append(out.Policies, pr)
	}
	return out, nil
}

// httpRun is the outcome of one run over HTTP.
type httpRun struct {
	Load        *Result
	Attempts    []Attempt
	Completions []Completion
	Fleet       *emulator.Fleet
	Gateway     *Gateway
}

// runHTTP starts a fleet and a gateway, runs the workload, calls during
// (if not nil) concurrently with the load, and tears everything down.
func runHTTP(ctx context.Context, profiles []string, speed float64, gcfg GatewayConfig, w *workload.Workload,
	during func(ctx context.Context, f *emulator.Fleet, g *Gateway)) (*httpRun, error) {
	span := time.Duration(float64(w.Requests[len(w.Requests)-1].Arrival) / speed)
	lifetime := span + 5*time.Minute
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()
	fleet, err := emulator.StartFleet(ctx, Fleet(profiles, speed, lifetime))
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	g, err := StartGateway(ctx, fleet, gcfg)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	// One scrape round before traffic, as a gateway that has been up, at
	// the interval StartGateway used (a zero one means the scraper's
	// default).
	interval := gcfg.ScrapeInterval
	if interval <= 0 {
		interval = scrape.DefaultInterval
	}
	time.Sleep(2 * interval)
	var wg sync.WaitGroup
	dctx, dcancel := context.WithCancel(ctx)
	if during != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			during(dctx, fleet, g)
		}()
	}
	res, err := RunLoad(ctx, LoadConfig{URL: g.URL(), Model: fleet.Pods[0].Model(), Workload: w, Speed: speed})
	dcancel()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return &httpRun{Load: res, Attempts: g.Attempts(), Completions: g.Completions(), Fleet: fleet, Gateway: g}, nil
}

// ChaosConfig configures Chaos.
type ChaosConfig struct {
	// Profiles is the fleet; nil means HeteroProfiles (8 pods).
	Profiles []string
	// Duration is the span of the arrivals; 0 means 60 s.
	Duration time.Duration
	// Kills is the number of distinct pods killed and restarted; 0 means 3.
	Kills int
	// Load is the offered load as a fraction of capacity; 0 means 0.6.
	Load float64
	// DownMin and DownMax bound how long a killed pod stays down; 0 means
	// 5% and 15% of Duration.
	DownMin, DownMax time.Duration
	// ScrapeInterval is the gateway's scrape interval; 0 means 50 ms.
	ScrapeInterval time.Duration
	// Seed seeds the workload, the kill schedule, the picker and the
	// scraper; 0 means 1.
	Seed uint64
}

// Kill is one kill and restart of a pod during a chaos run.
type Kill struct {
	Pod     string
	Address string
	// At is when the kill began: connections fail from a moment after.
	At time.Time
	// RestartAt is when the restart began: the end of the pod's downtime
	// for every count below.
	RestartAt time.Time
	// FirstConnectError is when the gateway saw its first connect error
	// from the dead pod (the end of the first failed attempt, which may
	// have been sent before the kill); zero if it saw none.
	FirstConnectError time.Time
	// MarkedDown is when the outcome of the first failed attempt was
	// reported through the picker's Done, which marks the endpoint down
	// before it reports it: from then on the picker's health filter drops
	// the pod. It follows FirstConnectError by the time the proxy's
	// goroutine took to get from the transport to Done, microseconds of
	// work that a loaded machine can stretch to tens of milliseconds.
	// Zero if no connect error was reported.
	MarkedDown time.Time
	// LastAttempt is when the gateway last sent an attempt to the dead pod
	// (sent after the kill, before the restart); zero if none.
	LastAttempt time.Time
	// Attempts is the number of attempts sent to the dead pod while it was
	// down.
	Attempts int
	// Picks counts the picks that chose the dead pod and began after
	// MarkedDown (before the health filter ran), and LastPick is when the
	// last of them began. Picks that began earlier saw the pod healthy.
	Picks    int
	LastPick time.Time
	// Retries counts the retries sent to the dead pod after MarkedDown on
	// fallbacks ranked by earlier picks: the proxy skips fallbacks marked
	// down, but one it checked just before the mark is still sent.
	Retries int
	// LateSuccesses counts successful outcomes reported for the pod
	// through the picker's Done after MarkedDown and before its restart:
	// requests that finished before the kill but reported after. They
	// were picked before the failure, so they do not mark the dead
	// endpoint healthy again (signals.Endpoint.HealthMark).
	LateSuccesses int
}

// OutOfRotation is the time from the first connect error to the last
// attempt sent to the dead pod: how long the gateway kept sending it
// traffic after it learnt it was dead. Zero when it sent nothing after.
func (k Kill) OutOfRotation() time.Duration {
	if k.FirstConnectError.IsZero() || k.LastAttempt.IsZero() {
		return 0
	}
	return max(k.LastAttempt.Sub(k.FirstConnectError), 0)
}

// PickOutOfRotation is the time from the mark-down to the start of the
// last pick that chose the dead pod: how long the pod stayed in the
// picker's rotation once the picker could know it was dead. Zero when no
// pick that began after the mark-down chose it. Retries on fallbacks
// ranked earlier are not picks (see Retries and OutOfRotation).
func (k Kill) PickOutOfRotation() time.Duration {
	if k.MarkedDown.IsZero() || k.LastPick.IsZero() {
		return 0
	}
	return max(k.LastPick.Sub(k.MarkedDown), 0)
}

// ChaosResult is the outcome of Chaos.
type ChaosResult struct {
	Load  *Result
	Kills []Kill
	// Attempts are the gateway's upstream attempts, in order.
	Attempts []Attempt
	// Completions are the picks, retries and outcomes the gateway's picker
	// accounted, in order.
	Completions []Completion
	// ScrapeInterval is the gateway's scrape interval.
	ScrapeInterval time.Duration
}

// Chaos runs the default picker's gateway over an emulated fleet under
// Poisson load and kills and restarts cfg.Kills distinct pods at random
// moments (uniform in 10%–70% of the run), each down for a random time in
// [DownMin, DownMax]. It reports what the clients saw and, per kill, how
// the gateway's traffic to the dead pod ended.
func Chaos(ctx context.Context, cfg ChaosConfig) (*ChaosResult, error) {
	if cfg.Profiles == nil {
		cfg.Profiles = HeteroProfiles
	}
	if cfg.Duration <= 0 {
		cfg.Duration = time.Minute
	}
	if cfg.Kills <= 0 {
		cfg.Kills = 3
	}
	cfg.Kills = min(cfg.Kills, len(cfg.Profiles))
	if cfg.Load <= 0 {
		cfg.Load = 0.6
	}
	if cfg.DownMin <= 0 {
		cfg.DownMin = cfg.Duration / 20
	}
	if cfg.DownMax < cfg.DownMin {
		cfg.DownMax = max(cfg.Duration*3/20, cfg.DownMin)
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = 50 * time.Millisecond
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	// Requests for the duration at the load: estimate with a pilot of 200.
	_, capacity, err := Workload(cfg.Profiles, 200, cfg.Load, nil, nil, cfg.Seed)
	if err != nil {
		return nil, err
	}
	n := max(int(cfg.Load*capacity*cfg.Duration.Seconds()), 20)
	w, _, err := Workload(cfg.Profiles, n, cfg.Load, nil, nil, cfg.Seed)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6368616f73))
	victims := rng.Perm(len(cfg.Profiles))[:cfg.Kills]
	type plan struct {
		pod        int
		at, downed time.Duration
	}
	plans := make([]plan, len(victims))
	for i, v := range victims {
		at := time.Duration((0.1 + 0.6*rng.Float64()) * float64(cfg.Duration))
		down := cfg.DownMin + time.Duration(rng.Float64()*float64(cfg.DownMax-cfg.DownMin))
		plans[i] = plan{pod: v, at: at, downed: down}
	}
	var mu sync.Mutex
	kills := make([]Kill, len(plans))
	during := func(ctx context.Context, f *emulator.Fleet, _ *Gateway) {
		start := time.Now()
		var wg sync.WaitGroup
		for i, pl := range plans {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := f.Pods[pl.pod]
				if !sleepUntil(ctx, start.Add(pl.at)) {
					return
				}
				mu.Lock()
				kills[i] = Kill{Pod: p.Name(), Address: p.Addr(), At: time.Now()}
				mu.Unlock()
				p.Kill()
				// Restart even when the run ends first, so the pod's
				// numbers are complete; a closed pod refuses.
				sleepUntil(ctx, time.Now().Add(pl.downed))
				mu.Lock()
				kills[i].RestartAt = time.Now()
				mu.Unlock()
				_ = p.Restart()
			}()
		}
		wg.Wait()
	}
	run, err := runHTTP(ctx, cfg.Profiles, 1, GatewayConfig{Policy: Inferroute, Seed: cfg.Seed, ScrapeInterval: cfg.ScrapeInterval}, w, during)
	if err != nil {
		return nil, err
	}
	for i := range kills {
		k := &kills[i]
		if k.At.IsZero() {
			continue
		}
		end := k.RestartAt
		if end.IsZero() {
			end = time.Now()
		}
		for _, a := range run.Attempts {
			if a.Address != k.Address {
				continue
			}
			// The first connect error the gateway saw: possibly a request
			// sent before the kill and cut by it.
			if a.ConnectError && !a.End.Before(k.At) && (k.FirstConnectError.IsZero() || a.End.Before(k.FirstConnectError)) {
				k.FirstConnectError = a.End
			}
			if a.At.Before(k.At) || !a.At.Before(end) {
				continue
			}
			k.Attempts++
			if a.At.After(k.LastAttempt) {
				k.LastAttempt = a.At
			}
		}
		// The mark-down: the first connect error reported through Done.
		// It is not bounded by the restart: a report of an attempt that
		// failed while the pod was dead can reach Done after the restart
		// when the proxy's goroutine is descheduled between the two (on
		// a loaded CI machine none had arrived 147 ms after the attempt
		// failed, when the pod restarted). Each victim is killed once,
		// so no later kill can claim the report.
		for _, c := range run.Completions {
			if c.Address == k.Address && c.ConnectError && !c.At.Before(k.At) &&
				(k.MarkedDown.IsZero() || c.At.Before(k.MarkedDown)) {
				k.MarkedDown = c.At
			}
		}
		if k.MarkedDown.IsZero() {
			continue
		}
		for _, c := range run.Completions {
			if c.Address != k.Address || !c.At.After(k.MarkedDown) || !c.At.Before(end) {
				continue
			}
			switch {
			case c.Dispatch:
				k.Picks++
				if c.At.After(k.LastPick) {
					k.LastPick = c.At
				}
			case c.Retry:
				k.Retries++
			case c.OK:
				k.LateSuccesses++
			}
		}
	}
	return &ChaosResult{Load: run.Load, Kills: kills, Attempts: run.Attempts, Completions: run.Completions, ScrapeInterval: cfg.ScrapeInterval}, nil
}

// sleepUntil waits until t or ctx's end; it reports whether t was reached.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// OverloadConfig configures Overload.
type OverloadConfig struct {
	// Profiles is the fleet; nil means one H100 and one L4.
	Profiles []string
	// Duration is the span of the arrivals; 0 means 20 s.
	Duration time.Duration
	// Load is the offered load as a fraction of capacity; 0 means 2.
	Load float64
	// Critical is the fraction of critical requests (priority 1); the rest
	// are sheddable (priority -1). 0 means 0.3.
	Critical float64
	// Seed seeds the workload, the picker and the scraper; 0 means 1.
	Seed uint64
}

// OverloadResult is the outcome of Overload.
type OverloadResult struct {
	Load *Result
	// Capacity is the fleet's measured capacity in requests per second and
	// Rate the offered rate.
	Capacity, Rate float64
	// Samples are the process's goroutine count and heap in use, sampled
	// every 100 ms during the run.
	Samples []RuntimeSample
}

// RuntimeSample is one reading of the process's runtime state.
type RuntimeSample struct {
	At         time.Duration
	Goroutines int
	HeapInuse  uint64
}

// Overload offers cfg.Load × capacity of mixed critical and sheddable
// requests to the default picker's gateway with SaturationAdmitter on, and
// samples the process's goroutines and heap while it runs.
func Overload(ctx context.Context, cfg OverloadConfig) (*OverloadResult, error) {
	if cfg.Profiles == nil {
		cfg.Profiles = []string{sim.H100, sim.L4}
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 20 * time.Second
	}
	if cfg.Load <= 0 {
		cfg.Load = 2
	}
	if cfg.Critical <= 0 {
		cfg.Critical = 0.3
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	tenants := []workload.Tenant{
		{Name: "critical", Weight: cfg.Critical, Priority: 1},
		{Name: "batch", Weight: 1 - cfg.Critical, Priority: -1},
	}
	_, capacity, err := Workload(cfg.Profiles, 200, cfg.Load, nil, tenants, cfg.Seed)
	if err != nil {
		return nil, err
	}
	n := max(int(cfg.Load*capacity*cfg.Duration.Seconds()), 20)
	w, capacity, err := Workload(cfg.Profiles, n, cfg.Load, nil, tenants, cfg.Seed)
	if err != nil {
		return nil, err
	}
	out := &OverloadResult{Capacity: capacity, Rate: cfg.Load * capacity}
	var mu sync.Mutex
	during := func(ctx context.Context, _ *emulator.Fleet, _ *Gateway) {
		start := time.Now()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			runtime.ReadMemStats(&ms)
			mu.Lock()
			out.Samples = append(out.Samples, RuntimeSample{At: time.Since(start), Goroutines: runtime.NumGoroutine(), HeapInuse: ms.HeapInuse})
			mu.Unlock()
		}
	}
	run, err := runHTTP(ctx, cfg.Profiles, 1, GatewayConfig{Policy: Inferroute, Seed: cfg.Seed, Shed: ShedSaturation}, w, during)
	if err != nil {
		return nil, err
	}
	out.Load = run.Load
	return out, nil
}
