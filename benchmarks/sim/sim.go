package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/workload"
	"github.com/inferroute/inferroute/signals"
)

// GPULabel is the endpoint label that carries a pod's GPU type (the
// hardware profile name, which signals.GPURelativeSpeed knows by its
// prefix), for the filters, scorers and predictors that scale by a pod's
// speed.
const GPULabel = signals.LabelGPU

// DefaultModel is the model name every simulated pod serves and every
// simulated request asks for.
const DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"

// Pod configures one simulated model-server replica.
type Pod struct {
	// Name is the endpoint name; "" means "pod-<index>".
	Name string
	// Engine configures the pod's engine model, hardware profile included.
	Engine engine.Config
}

// Config configures a simulation run. Use DefaultConfig and change what a
// scenario needs; the zero values of the duration fields mean "none" (an
// instantaneous scrape, no network delay), except ScrapeInterval.
type Config struct {
	// Pods is the fleet. Required.
	Pods []Pod
	// Model is the model the pods serve; "" means DefaultModel. Requests
	// always ask for it (a workload's own model names are ignored: the
	// simulated fleet serves one model).
	Model string
	// ScrapeInterval is the period of each pod's metrics scrape; 0 means
	// 50 ms, the llm-d inference scheduler's default refresh interval.
	ScrapeInterval time.Duration
	// ScrapeJitter spreads each interval uniformly by ± this fraction, so
	// that pods are not scraped in lockstep.
	ScrapeJitter float64
	// ScrapeLatencyMin and ScrapeLatencyMax bound the time between sending a
	// scrape and publishing its result (uniform in between): the HTTP round
	// trip and the parse. The values describe the moment the scrape was
	// sent, so a published snapshot is always this much older than "now",
	// plus up to one interval by the time it is replaced.
	ScrapeLatencyMin, ScrapeLatencyMax time.Duration
	// NetworkDelay is the time between the routing decision and the
	// request's arrival at the pod's engine.
	NetworkDelay time.Duration
	// SLO is the objective goodput counts against.
	SLO SLO
	// Seed seeds the scrape phases and jitter and the policy. Equal seeds
	// give equal runs.
	Seed uint64
	// Unlabelled leaves the pods' endpoints without the GPU label
	// (GPULabel), as a fleet whose discovery does not know the hardware:
	// the picker then learns each pod's speed from its latencies alone.
	Unlabelled bool
	// MaxVirtualTime stops the run at this virtual time; requests not
	// finished by then count as failed. 0 means the last arrival plus one
	// hour.
	MaxVirtualTime time.Duration
	// Logger receives diagnostics and is handed to the policy; nil means
	// discard.
	Logger *slog.Logger
}

// DefaultConfig returns the simulator's defaults around pods: a 50 ms
// scrape interval with ±10% jitter, a 2–8 ms scrape latency (an HTTP GET of
// a ~50 KB metrics page on the same cluster network plus the parse), a
// 0.5 ms network delay to the pod, and the default SLO.
func DefaultConfig(pods []Pod) Config {
	return Config{
		Pods:             pods,
		ScrapeInterval:   50 * time.Millisecond,
		ScrapeJitter:     0.1,
		ScrapeLatencyMin: 2 * time.Millisecond,
		ScrapeLatencyMax: 8 * time.Millisecond,
		NetworkDelay:     500 * time.Microsecond,
		SLO:              DefaultSLO,
		Seed:             1,
	}
}

// DefaultSLO is the goodput objective of the default suite: first token
// within 2 s and at most 100 ms per output token (10 tokens/s, faster than
// reading speed), the interactive-chat class of objectives used in the
// DistServe evaluation (Zhong et al., OSDI'24, §6).
var DefaultSLO = SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond}

// pod is the simulator's state of one replica.
type pod struct {
	idx       int
	cfg       engine.Config
	eng       *engine.Engine
	ep        *signals.Endpoint
	busy      bool // a step is planned; its evStepEnd is queued
	zeroSteps int  // consecutive steps of zero duration
	inTransit int
	routed    int
	// last scrape's cumulative prefix counters, for the per-interval rate.
	lastHits, lastQueries uint64
}

// flight is one request in the simulator, from arrival to completion.
// Flights are recycled through a free list; the engine request and the
// signals request live inside it so that a dispatch does not allocate.
type flight struct {
	slot     int32
	ereq     engine.Request
	sreq     signals.Request
	blocks   []uint64 // backing array of sreq.PromptBlocks
	arrival  time.Duration
	first    time.Duration
	gotFirst bool
	cached   int
	pod      int32
	done     func(signals.Outcome)
	firstTok func() // the policy's Choice.FirstToken, may be nil
}

// Sim runs simulations. A Sim is not safe for concurrent use: run several
// simulations in parallel with one Sim each. It reuses its buffers across
// runs.
type Sim struct {
	text *promptText

	// Per-run state, reset by Run.
	cfg     Config
	clock   Clock
	q       eventQueue
	pods    []*pod
	eps     []*signals.Endpoint
	byEP    map[*signals.Endpoint]int32
	pol     policy.Policy
	rng     *rand.Rand
	w       *workload.Workload
	next    int // next arrival index
	slab    []*flight
	free    []int32
	gen     uint64
	pending int // requests arrived and not yet finished or failed
	failed  int
	evbuf   []engine.Event
	col     collector
	pubs    []*signals.Metrics // scrape results awaiting their evPublish
	pubFree []int32            // free indices of pubs
	picking *flight            // the flight being picked, for EngineRequest
	stuck   error              // set when an engine stops advancing virtual time

	// Engines of the last run and their configurations: a run whose pod
	// i has the same configuration resets engines[i] instead of building
	// a new one, keeping its grown buffers.
	engines []*engine.Engine
	engCfgs []engine.Config
}

// maxZeroSteps is how many consecutive zero-duration steps (steps that only
// preempt) a pod may make before the run is declared stuck: virtual time
// would never advance.
const maxZeroSteps = 100_000

// New returns a Sim.
func New() *Sim { return &Sim{} }

var _ policy.Inspector = (*Sim)(nil)

// Pod implements policy.Inspector.
func (s *Sim) Pod(ep *signals.Endpoint) (policy.PodView, bool) {
	i, ok := s.byEP[ep]
	if !ok {
		return policy.PodView{}, false
	}
	p := s.pods[i]
	return policy.PodView{Engine: p.eng, Config: p.cfg, InTransit: p.inTransit}, true
}

// EngineRequest implements policy.Inspector.
func (s *Sim) EngineRequest(req *signals.Request) *engine.Request {
	if s.picking == nil || req != &s.picking.sreq {
		return nil
	}
	return &s.picking.ereq
}

// Endpoints returns the endpoints of the last run, in pod order.
func (s *Sim) Endpoints() []*signals.Endpoint { return s.eps }

// ErrNoPods is returned by Run for a configuration without pods.
var ErrNoPods = errors.New("sim: no pods")

// Run simulates w on a fresh fleet built from cfg with the policy that f
// builds, and returns the run's metrics. The policy is built after the
// fleet, so its Env holds the run's endpoints, clock and seed, and the Sim
// as its Inspector. Run checks ctx between events every few thousand events
// and returns ctx's error if it is cancelled. w is not modified.
func (s *Sim) Run(ctx context.Context, cfg Config, w *workload.Workload, f policy.Factory) (Metrics, error) {
	if len(cfg.Pods) == 0 {
		return Metrics{}, ErrNoPods
	}
	if err := ctx.Err(); err != nil {
		return Metrics{}, err
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxVirtualTime <= 0 {
		last := time.Duration(0)
		if n := len(w.Requests); n > 0 {
			last = w.Requests[n-1].Arrival
		}
		cfg.MaxVirtualTime = last + time.Hour
	}
	if s.text == nil {
		s.text = newPromptText()
	}
	s.reset(cfg, w)

	pol, err := f(policy.Env{
		Endpoints: s.eps,
		Clock:     &s.clock,
		Seed:      cfg.Seed,
		Logger:    cfg.Logger,
		Inspector: s,
	})
	if err != nil {
		return Metrics{}, err
	}
	s.pol = pol

	if len(w.Requests) > 0 {
		s.q.push(event{at: w.Requests[0].Arrival, kind: evArrival})
	}
	for _, p := range s.pods {
		phase := time.Duration(s.rng.Int64N(int64(cfg.ScrapeInterval)))
		s.q.push(event{at: phase, kind: evScrape, pod: int32(p.idx)})
	}

	n := 0
	for s.q.len() > 0 && (s.next < len(w.Requests) || s.pending > 0) {
		ev := s.q.pop()
		if ev.at > cfg.MaxVirtualTime {
			break
		}
		s.clock.Set(ev.at)
		switch ev.kind {
		case evArrival:
			s.arrive(ctx)
		case evDeliver:
			s.deliver(s.slab[ev.arg])
		case evStepEnd:
			s.stepEnd(s.pods[ev.pod])
		case evScrape:
			s.scrape(s.pods[ev.pod])
		case evPublish:
			m := s.pubs[ev.arg]
			s.pubs[ev.arg] = nil
			s.pubFree = append(s.pubFree, ev.arg)
			s.pods[ev.pod].ep.SetMetrics(m)
		}
		if n++; n&0xfff == 0 {
			if err := ctx.Err(); err != nil {
				return Metrics{}, err
			}
			if s.stuck != nil {
				return Metrics{}, s.stuck
			}
		}
	}
	return s.metrics(), nil
}

func (s *Sim) reset(cfg Config, w *workload.Workload) {
	s.cfg = cfg
	s.clock.Set(0)
	s.q.reset()
	s.w = w
	s.next = 0
	s.pending = 0
	s.failed = 0
	s.picking = nil
	s.stuck = nil
	clear(s.pubs)
	s.pubs = s.pubs[:0]
	s.pubFree = s.pubFree[:0]
	s.free = s.free[:0]
	for i := len(s.slab) - 1; i >= 0; i-- {
		s.free = append(s.free, int32(i))
	}
	s.rng = rand.New(rand.NewPCG(cfg.Seed, 0x51_3c_2a_7e))
	s.pods = make([]*pod, len(cfg.Pods))
	s.eps = make([]*signals.Endpoint, len(cfg.Pods))
	s.byEP = make(map[*signals.Endpoint]int32, len(cfg.Pods))
	for i, pc := range cfg.Pods {
		name := pc.Name
		if name == "" {
			name = "pod-" + strconv.Itoa(i)
		}
		var eng *engine.Engine
		if i < len(s.engines) && s.engCfgs[i] == pc.Engine {
			eng = s.engines[i]
			eng.Reset() // behaves as engine.New(pc.Engine)
		} else {
			eng = engine.New(pc.Engine)
			if i < len(s.engines) {
				s.engines[i], s.engCfgs[i] = eng, pc.Engine
			} else {
				s.engines = append(s.engines, eng)
				s.engCfgs = append(s.engCfgs, pc.Engine)
			}
		}
		var labels map[string]string
		if !cfg.Unlabelled {
			labels = map[string]string{GPULabel: pc.Engine.Profile.Name}
		}
		ep := signals.NewEndpoint(signals.EndpointSpec{
			Name:    name,
			Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1),
			Engine:  "vllm",
			Model:   cfg.Model,
			Labels:  labels,
		})
		s.pods[i] = &pod{idx: i, cfg: eng.Config(), eng: eng, ep: ep}
		s.eps[i] = ep
		s.byEP[ep] = int32(i)
	}
	s.col.reset(len(w.Requests), cfg.SLO)
}

// getFlight returns a recycled or new flight.
func (s *Sim) getFlight() *flight {
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return s.slab[slot]
	}
	fl := &flight{slot: int32(len(s.slab))}
	s.slab = append(s.slab, fl)
	return fl
}

func (s *Sim) putFlight(fl *flight) {
	fl.ereq = engine.Request{}
	blocks := fl.blocks[:0]
	fl.sreq = signals.Request{}
	fl.blocks = blocks
	fl.done, fl.firstTok = nil, nil
	s.free = append(s.free, fl.slot)
}

// flightOf maps an engine request back to its flight: the engine request's
// ID carries the slot in its low 32 bits.
func (s *Sim) flightOf(r *engine.Request) *flight {
	return s.slab[int32(r.ID&0xffffffff)]
}

// arrive routes the next workload request and schedules the one after.
func (s *Sim) arrive(ctx context.Context) {
	now := s.clock.Elapsed()
	wr := &s.w.Requests[s.next]
	s.next++
	if s.next < len(s.w.Requests) {
		s.q.push(event{at: s.w.Requests[s.next].Arrival, kind: evArrival})
	}
	s.col.arrival(now)
	s.pending++

	fl := s.getFlight()
	s.gen++
	fl.ereq = engine.Request{
		ID:           s.gen<<32 | uint64(uint32(fl.slot)),
		Blocks:       wr.Blocks,
		BlockTokens:  wr.BlockTokens,
		PromptTokens: wr.PromptTokens,
		OutputTokens: wr.OutputTokens,
		Adapter:      wr.Adapter,
	}
	fl.blocks = s.text.hash(fl.blocks[:0], s.cfg.Model, wr.Adapter, wr.Blocks, wr.BlockTokens, wr.PromptTokens)
	// The engine keys its prefix cache by the same hashes when its block
	// size matches (the gateway's hashes and vLLM's both identify a
	// prefix), and hashes the prompt itself otherwise.
	fl.ereq.PromptHashes, fl.ereq.HashTokens = fl.blocks, hashTokens
	fl.sreq = signals.Request{
		Model:           s.cfg.Model,
		Adapter:         wr.Adapter,
		PromptBlocks:    fl.blocks,
		PromptTokens:    wr.PromptTokens,
		MaxOutputTokens: maxTokens(wr.OutputTokens),
		Priority:        wr.Priority,
		SessionKey:      wr.Session,
	}
	fl.arrival = now
	fl.gotFirst = false
	fl.cached = 0

	s.picking = fl
	ch, err := s.pol.Pick(ctx, &fl.sreq, s.eps)
	s.picking = nil
	if err != nil {
		s.fail(fl, nil)
		return
	}
	i, ok := s.byEP[ch.Endpoint]
	if !ok {
		// A policy that returns a foreign endpoint is a bug in the policy.
		s.fail(fl, ch.Done)
		return
	}
	fl.pod = i
	fl.done, fl.firstTok = ch.Done, ch.FirstToken
	p := s.pods[i]
	p.routed++
	p.inTransit++
	s.q.push(event{at: now + s.cfg.NetworkDelay, kind: evDeliver, pod: i, arg: fl.slot})
}

// maxTokens is the max_tokens a simulated client sends for a request that
// will generate n tokens: n rounded up to a power of two, at least 256. It
// bounds the output within a factor of two, as a client's limit does,
// without handing any policy the exact length an oracle would know.
func maxTokens(n int) int {
	m := 256
	for m < n {
		m *= 2
	}
	return m
}

// errRejected is the outcome error of a request its pod's engine refused
// (a prompt larger than the whole KV cache).
var errRejected = errors.New("sim: request rejected by the engine")

// fail ends a request that will not complete.
func (s *Sim) fail(fl *flight, done func(signals.Outcome)) {
	if done != nil {
		done(signals.Outcome{Err: errRejected})
	}
	s.failed++
	s.pending--
	s.putFlight(fl)
}

func (s *Sim) deliver(fl *flight) {
	p := s.pods[fl.pod]
	p.inTransit--
	if err := p.eng.Add(s.clock.Elapsed(), &fl.ereq); err != nil {
		s.cfg.Logger.Debug("engine rejected request", "pod", p.ep.Name, "err", err)
		s.fail(fl, fl.done)
		return
	}
	if !p.busy {
		s.startStep(p)
	}
}

func (s *Sim) startStep(p *pod) {
	now := s.clock.Elapsed()
	d, ok := p.eng.StartStep(now)
	if !ok {
		return
	}
	if d > 0 {
		p.zeroSteps = 0
	} else if p.zeroSteps++; p.zeroSteps > maxZeroSteps && s.stuck == nil {
		s.stuck = fmt.Errorf("sim: pod %s made %d steps of zero duration at %v: the engine is not progressing", p.ep.Name, p.zeroSteps, now)
	}
	p.busy = true
	s.q.push(event{at: now + d, kind: evStepEnd, pod: int32(p.idx)})
}

func (s *Sim) stepEnd(p *pod) {
	now := s.clock.Elapsed()
	p.busy = false
	s.evbuf = p.eng.FinishStep(now, s.evbuf[:0])
	for i := range s.evbuf {
		ev := &s.evbuf[i]
		switch ev.Kind {
		case engine.FirstToken:
			fl := s.flightOf(ev.Req)
			if !fl.gotFirst {
				fl.gotFirst, fl.first, fl.cached = true, ev.At, ev.CachedTokens
				if fl.firstTok != nil {
					fl.firstTok()
				}
			}
		case engine.Finished:
			s.finish(s.flightOf(ev.Req), ev)
		}
	}
	clear(s.evbuf)
	s.startStep(p)
}

func (s *Sim) finish(fl *flight, ev *engine.Event) {
	if !fl.gotFirst {
		fl.gotFirst, fl.first = true, ev.At
	}
	cached := max(fl.cached, ev.CachedTokens)
	s.col.complete(fl.arrival, fl.first, ev.At, fl.ereq.OutputTokens)
	fl.done(signals.Outcome{
		TTFT:             fl.first - fl.arrival,
		Latency:          ev.At - fl.arrival,
		PromptTokens:     fl.ereq.PromptTokens,
		CachedTokens:     cached,
		CompletionTokens: fl.ereq.OutputTokens,
	})
	s.pending--
	s.putFlight(fl)
}

// scrape samples a pod's engine as a metrics scrape sent now would, and
// schedules its publication after the scrape latency and the next scrape.
func (s *Sim) scrape(p *pod) {
	now := s.clock.Elapsed()
	st := p.eng.Stats()
	m := &signals.Metrics{
		ScrapedAt:          s.clock.Now(),
		Baseline:           p.ep.Counters(),
		Running:            signals.Known(float64(st.Running)),
		Waiting:            signals.Known(float64(st.Waiting)),
		KVCacheUtilization: signals.Known(st.KVCacheUsage),
		LoRAKnown:          true,
		RunningAdapters:    st.RunningAdapters,
		WaitingAdapters:    st.WaitingAdapters,
		MaxLoRA:            st.MaxLoRA,
		BlockSize:          st.BlockSize,
		NumBlocks:          st.NumBlocks,
	}
	if dq := st.PrefixQueries - p.lastQueries; dq > 0 {
		m.PrefixCacheHitRate = signals.Known(float64(st.PrefixHits-p.lastHits) / float64(dq))
	}
	p.lastHits, p.lastQueries = st.PrefixHits, st.PrefixQueries
	lat := s.cfg.ScrapeLatencyMin
	if span := s.cfg.ScrapeLatencyMax - s.cfg.ScrapeLatencyMin; span > 0 {
		lat += time.Duration(s.rng.Int64N(int64(span) + 1))
	}
	var slot int32
	if n := len(s.pubFree); n > 0 {
		slot = s.pubFree[n-1]
		s.pubFree = s.pubFree[:n-1]
		s.pubs[slot] = m
	} else {
		slot = int32(len(s.pubs))
		s.pubs = append(s.pubs, m)
	}
	s.q.push(event{at: now + lat, kind: evPublish, pod: int32(p.idx), arg: slot})
	next := s.cfg.ScrapeInterval
	if j := s.cfg.ScrapeJitter; j > 0 {
		next = time.Duration(float64(next) * (1 + j*(2*s.rng.Float64()-1)))
	}
	s.q.push(event{at: now + max(next, time.Millisecond), kind: evScrape, pod: int32(p.idx)})
}

// metrics assembles the run's figures.
func (s *Sim) metrics() Metrics {
	m := Metrics{Policy: s.pol.Name(), Requests: len(s.w.Requests)}
	s.col.fill(&m)
	m.Failed = m.Requests - m.Completed
	m.PerPod = make([]int, len(s.pods))
	var hits, queries uint64
	for i, p := range s.pods {
		m.PerPod[i] = p.routed
		st := p.eng.Stats()
		hits += st.PrefixHits
		queries += st.PrefixQueries
		m.Preemptions += st.Preemptions
	}
	if queries > 0 {
		m.PrefixHitRate = float64(hits) / float64(queries)
	}
	m.Imbalance = imbalance(m.PerPod)
	return m
}
