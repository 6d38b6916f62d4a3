package latency

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// Features of the TTFT model, in the order of its coefficient vector.
const (
	fConst    = iota // 1: fixed overhead (HTTP, scheduling, first decode step)
	fUncached        // this request's uncached prompt tokens, in thousands
	fQueued          // prefill work ahead of it, in thousands of tokens (queuedTokens)
	fRunning         // requests in the endpoint's running batch
	fKV              // KV-cache utilisation in [0, 1]
	fLoRA            // 1 when the request's adapter must be loaded first
	ttftDim
)

// Features of the TPOT model.
const (
	gConst = iota // 1: base decode step time
	gBatch        // running requests including this one
	gKV           // KV-cache utilisation in [0, 1]
	tpotDim
)

// Bounds that keep features and targets finite and the model well
// conditioned whatever the inputs: a request or a queue beyond these is
// treated as this large.
const (
	maxPromptTokens = 1e7
	maxQueuedTokens = 1e9
	maxRunning      = 1e6
	// MaxSeconds is the largest TTFT or TPOT the predictor learns from or
	// predicts; longer observations are clamped to it.
	MaxSeconds = 3600.0
)

// Feature magnitudes for the ridge prior: it is worth Config.PriorSamples
// observations of this size in each direction. For the main, physical
// terms (overhead, prompt and queued tokens) they are typical magnitudes,
// so the data take over after a few observations. The secondary terms
// (running batch, KV utilisation) get eight times their typical magnitude
// (8 and 0.5), a prior 64 times stronger: their effects are small next to
// the token terms and their estimates from a 33-observation memory are
// noisy, which mispredicted short prompts (on the synthetic fleet of the
// tests this cut the ranking mistakes among short requests fivefold).
var (
	ttftScale = [maxDim]float64{fConst: 1, fUncached: 1, fQueued: 4, fRunning: 64, fKV: 4, fLoRA: 1}
	tpotScale = [maxDim]float64{gConst: 1, gBatch: 16, gKV: 0.5}
)

// Config configures a Predictor. The zero Config is usable: every zero
// field takes the default stated on it.
type Config struct {
	// Clock is the time source; nil means signals.SystemClock.
	Clock signals.Clock
	// HalfLife is the age at which a scraped value's confidence halves, as
	// for the signals (signals.Staleness); 0 means scrapes never age.
	HalfLife time.Duration
	// Forgetting is the forgetting factor λ in [0.5, 1] of both models:
	// each observation's weight is multiplied by λ at every new one, so the
	// model remembers about 1/(1−λ) observations and a change of the
	// endpoint's speed is half absorbed after ln 0.5 / ln λ of them.
	// 0 (and NaN) means DefaultForgetting. Values below 0.5, negative ones
	// included, are raised to 0.5 (a memory of about 2 observations); values
	// above 1 are lowered to 1 (no forgetting).
	Forgetting float64
	// PriorSamples is how many typical observations the prior is worth in
	// each direction (the ridge strength). 0 means 0.1.
	PriorSamples float64
	// FullConfidenceSamples is the effective number of observations at
	// which Confidence reaches 1. 0 means 10.
	FullConfidenceSamples float64
	// ConfidenceHalfLife is how fast confidence fades when an endpoint
	// produces no observations: it halves every ConfidenceHalfLife since the
	// last one, so an endpoint that stopped receiving traffic is explored
	// again. 0 means 5 minutes; negative means it never fades.
	ConfidenceHalfLife time.Duration
	// PriorConfidence is the confidence of an endpoint that has a speed
	// label (signals.LabelRelativeSpeed, signals.LabelGPU) and no
	// observations yet. 0 means 0.2; negative means 0.
	PriorConfidence float64
	// PriorThroughput is the prefill throughput, in tokens per second, that
	// the prior assumes at relative speed 1 until some endpoint of the pool
	// has been measured. 0 means 4000 (the order of Llama-2-70B on two
	// A100-80GB in Splitwise's measured performance model at 2k-token
	// prompts: 2048 tokens in 0.69 s is about 3000 tokens/s).
	PriorThroughput float64
	// MaxPending bounds the outstanding dispatches remembered until their
	// completion: when a dispatch would make more than MaxPending of them,
	// the oldest outstanding one is forgotten (its completion then teaches
	// nothing), however recent the others. A completed dispatch no longer
	// counts, so a long request is remembered however many shorter ones
	// come and go meanwhile. Concurrent dispatches can exceed the bound for
	// a moment, by one each. 0 means 65536.
	MaxPending int
	// StateTTL is how long the state of an endpoint that sees no dispatch
	// or completion is kept; 0 means one hour. Use Forget to drop an
	// endpoint at once.
	StateTTL time.Duration
}

// DefaultForgetting is the default forgetting factor: a memory of about 33
// observations; a step change of an endpoint's speed is half absorbed after
// 23 observations (ln 0.5 / ln 0.97) and 90% absorbed after 76.
const DefaultForgetting = 0.97

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = signals.SystemClock{}
	}
	switch {
	case c.Forgetting == 0 || math.IsNaN(c.Forgetting):
		c.Forgetting = DefaultForgetting
	case c.Forgetting < 0.5:
		c.Forgetting = 0.5
	case c.Forgetting > 1:
		c.Forgetting = 1
	}
	if !(c.PriorSamples > 0) || math.IsInf(c.PriorSamples, 0) {
		c.PriorSamples = 0.1
	}
	if !(c.FullConfidenceSamples > 0) || math.IsInf(c.FullConfidenceSamples, 0) {
		c.FullConfidenceSamples = 10
	}
	if c.ConfidenceHalfLife == 0 {
		c.ConfidenceHalfLife = 5 * time.Minute
	}
	switch {
	case c.PriorConfidence == 0 || math.IsNaN(c.PriorConfidence):
		c.PriorConfidence = 0.2
	case c.PriorConfidence < 0:
		c.PriorConfidence = 0
	case c.PriorConfidence > 1:
		c.PriorConfidence = 1
	}
	if !(c.PriorThroughput > 0) || math.IsInf(c.PriorThroughput, 0) {
		c.PriorThroughput = 4000
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 65536
	}
	if c.StateTTL <= 0 {
		c.StateTTL = time.Hour
	}
	return c
}

// Predictor is an online model, per endpoint, of the time to first token
// and the time per output token of a request. It implements
// signals.LatencyEstimator and signals.Observer: the picker feeds it every
// dispatch and every completion, and it learns from them.
//
// A Predictor is safe for concurrent use. Predictions read published
// coefficients without locks and never allocate; updates lock only the
// endpoint concerned. Create one with New; the zero Predictor is not usable.
type Predictor struct {
	cfg     Config
	pending *pending
	// halfLife is Config.HalfLife in nanoseconds, which SetHalfLife
	// changes; cfg.HalfLife is not read.
	halfLife atomic.Int64

	// states maps endpoints to their state. It is copied on write (a new
	// endpoint, Forget, a sweep: rare) so that the pick path reads a plain
	// map without locks.
	states   atomic.Pointer[map[*signals.Endpoint]*epState]
	statesMu sync.Mutex // serialises writers of states

	reg  [maxDim]float64 // ridge strengths, TTFT
	regG [maxDim]float64 // ridge strengths, TPOT

	poolMu   sync.Mutex
	poolTTFT [maxDim]float64 // speed-normalised TTFT coefficients of the pool
	poolTPOT [maxDim]float64
	// The contributions averaged into poolTTFT, poolTPOT and poolPrompt
	// (capped at 50): each mean counts its own, because an endpoint
	// contributes TTFT coefficients long before TPOT ones when some of its
	// responses are buffered, and a prompt size only once it has one.
	poolNT, poolNG, poolNP float64

	poolPubT seqVec
	poolPubG seqVec
	// poolPrompt is the pool's mean uncached prompt size, for endpoints
	// that have not been dispatched to yet.
	poolPrompt atomicFloat

	completions atomic.Uint64
}

// epState is what the predictor knows about one endpoint.
type epState struct {
	speed    float64 // relative speed from labels, 1 without
	labelled bool

	mu         sync.Mutex
	ttft, tpot model            // guarded by mu
	adapters   [8]adapterSeen   // adapters dispatched here, guarded by mu
	nextAd     int              // guarded by mu
	counters   signals.Counters // endpoint counters at the last Dispatched, guarded by mu
	lastU      float64          // uncached tokens attributed at the last Dispatched, guarded by mu
	prompts    float64          // dispatches averaged into avgPrompt (capped at 100), guarded by mu

	pubT, pubG seqVec // published coefficients
	n, nG      atomicFloat
	avgPrompt  atomicFloat  // mean uncached prompt tokens dispatched (see Dispatched)
	lastSample atomic.Int64 // unix ns of the last TTFT observation
	lastActive atomic.Int64 // unix ns of the last dispatch or completion
}

type adapterSeen struct {
	name string
	at   int64
}

// New returns a Predictor configured by cfg (see Config for defaults).
func New(cfg Config) *Predictor {
	cfg = cfg.withDefaults()
	p := &Predictor{cfg: cfg, pending: newPending(cfg.MaxPending)}
	p.SetHalfLife(cfg.HalfLife)
	p.states.Store(&map[*signals.Endpoint]*epState{})
	for i := 0; i < maxDim; i++ {
		p.reg[i] = cfg.PriorSamples * ttftScale[i] * ttftScale[i]
		p.regG[i] = cfg.PriorSamples * tpotScale[i] * tpotScale[i]
	}
	secPerKTok := 1000 / cfg.PriorThroughput
	// Prior coefficients at relative speed 1. The token coefficients follow
	// PriorThroughput. The others are deliberately modest guesses, learned
	// away within a few observations: 50 ms of overhead; 2 ms per running
	// request (each running sequence adds its decode token to every step,
	// taking a share of the step's token budget, as in vLLM's chunked
	// prefill scheduler); no KV term; 300 ms to load a LoRA adapter (vLLM
	// loads adapters from CPU memory or disk on demand). TPOT: a 20 ms decode
	// step plus 0.5 ms per sequence in the batch and 10 ms at a full cache.
	p.poolTTFT = [maxDim]float64{fConst: 0.05, fUncached: secPerKTok, fQueued: secPerKTok, fRunning: 0.002, fKV: 0, fLoRA: 0.3}
	p.poolTPOT = [maxDim]float64{gConst: 0.02, gBatch: 0.0005, gKV: 0.01}
	p.poolPubT.store(&p.poolTTFT)
	p.poolPubG.store(&p.poolTPOT)
	return p
}

// SetHalfLife sets the age at which a scraped value's confidence halves
// (Config.HalfLife) for the predictions and observations made after it
// returns: a gateway whose pool's staleness setting is reloaded keeps what
// the predictor has learnt. Negative means 0 (scrapes never age). It is
// safe to call concurrently with every other method.
func (p *Predictor) SetHalfLife(d time.Duration) {
	p.halfLife.Store(int64(max(d, 0)))
}

// HalfLife returns the half-life in force (Config.HalfLife, or the last
// SetHalfLife).
func (p *Predictor) HalfLife() time.Duration { return time.Duration(p.halfLife.Load()) }

// Compile-time guards.
var (
	_ signals.LatencyEstimator = (*Predictor)(nil)
	_ signals.Observer         = (*Predictor)(nil)
)

// state returns the endpoint's state, creating it on first sight (the only
// allocation, once per endpoint).
func (p *Predictor) state(ep *signals.Endpoint) *epState {
	if st, ok := (*p.states.Load())[ep]; ok {
		return st
	}
	p.statesMu.Lock()
	defer p.statesMu.Unlock()
	old := *p.states.Load()
	if st, ok := old[ep]; ok {
		return st
	}
	st := &epState{}
	st.speed, st.labelled = ep.RelativeSpeed()
	st.lastActive.Store(p.cfg.Clock.Now().UnixNano())
	m := make(map[*signals.Endpoint]*epState, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[ep] = st
	p.states.Store(&m)
	return st
}

// lookup returns the endpoint's state if it has one.
func (p *Predictor) lookup(ep *signals.Endpoint) (*epState, bool) {
	st, ok := (*p.states.Load())[ep]
	return st, ok
}

// rewriteStates replaces the state map by the states for which keep
// returns true.
func (p *Predictor) rewriteStates(keep func(*signals.Endpoint, *epState) bool) {
	p.statesMu.Lock()
	defer p.statesMu.Unlock()
	old := *p.states.Load()
	m := make(map[*signals.Endpoint]*epState, len(old))
	for k, v := range old {
		if keep(k, v) {
			m[k] = v
		}
	}
	p.states.Store(&m)
}

// scaleTTFT turns speed-normalised TTFT coefficients into an endpoint's:
// compute-bound terms divide by its speed; the fixed overhead and the LoRA
// load (network, PCIe, disk) do not.
func scaleTTFT(norm *[maxDim]float64, speed float64) [maxDim]float64 {
	out := *norm
	for _, i := range [...]int{fUncached, fQueued, fRunning, fKV} {
		out[i] = norm[i] / speed
	}
	return out
}

// normTTFT is the inverse of scaleTTFT.
func normTTFT(theta *[maxDim]float64, speed float64) [maxDim]float64 {
	out := *theta
	for _, i := range [...]int{fUncached, fQueued, fRunning, fKV} {
		out[i] = theta[i] * speed
	}
	return out
}

// scaleTPOT turns speed-normalised TPOT coefficients into an endpoint's.
func scaleTPOT(norm *[maxDim]float64, speed float64) [maxDim]float64 {
	var out [maxDim]float64
	for i := 0; i < tpotDim; i++ {
		out[i] = norm[i] / speed
	}
	return out
}

// ttftTheta returns the coefficients to predict with: the endpoint's own
// once it has observations, else the pool's prior scaled by its speed.
func (p *Predictor) ttftTheta(st *epState, theta *[maxDim]float64) {
	if st.n.Load() > 0 {
		st.pubT.load(theta)
		return
	}
	var norm [maxDim]float64
	p.poolPubT.load(&norm)
	*theta = scaleTTFT(&norm, st.speed)
}

func (p *Predictor) tpotTheta(st *epState, theta *[maxDim]float64) {
	if st.nG.Load() > 0 {
		st.pubG.load(theta)
		return
	}
	var norm [maxDim]float64
	p.poolPubG.load(&norm)
	*theta = scaleTPOT(&norm, st.speed)
}

// PredictTTFT implements signals.LatencyEstimator: the predicted time to
// first token of req on ep, in seconds, given the fraction of the prompt ep
// holds in its prefix cache. The prediction is always finite and in
// [0, MaxSeconds]; it is known for any non-nil req and ep (before any
// observation it comes from the prior; see Confidence). It does not block
// and does not allocate after the endpoint's first sight.
func (p *Predictor) PredictTTFT(req *signals.Request, ep *signals.Endpoint, cachedFraction float64) (float64, bool) {
	return p.PredictTTFTAt(req, ep, cachedFraction, p.cfg.Clock.Now())
}

// PredictTTFTAt is PredictTTFT at a time the caller already read from the
// predictor's clock: a scorer that predicts for every candidate of a pick
// reads the clock once instead of once per candidate.
func (p *Predictor) PredictTTFTAt(req *signals.Request, ep *signals.Endpoint, cachedFraction float64, now time.Time) (float64, bool) {
	if req == nil || ep == nil {
		return 0, false
	}
	st := p.state(ep)
	u := uncached(req.PromptTokens, cachedFraction)
	var x, theta [maxDim]float64
	p.liveFeatures(&x, req, ep, st, u, now)
	p.ttftTheta(st, &theta)
	return clampSeconds(dot(&theta, &x, ttftDim)), true
}

// PredictTTFTLoad is PredictTTFTAt and ConfidenceAt in one call, for a
// picker that has already read the candidate's load for the pick
// (signals.Endpoint.LoadAt): the endpoint's model state is looked up once,
// and the queue, running batch and KV use come from load instead of being
// read again, when load was corrected with the predictor's own half-life
// (Config.HalfLife; otherwise they are read from ep as PredictTTFTAt does,
// so the result never depends on another component's staleness setting).
// The values are those of the two calls it replaces. It does not block and
// does not allocate after the endpoint's first sight.
func (p *Predictor) PredictTTFTLoad(req *signals.Request, ep *signals.Endpoint, load *signals.Load, cachedFraction float64, now time.Time) (seconds, confidence float64, ok bool) {
	if req == nil || ep == nil {
		return 0, 0, false
	}
	st := p.state(ep)
	u := uncached(req.PromptTokens, cachedFraction)
	var x, theta [maxDim]float64
	if load != nil && load.HalfLife == p.HalfLife() {
		p.loadFeatures(&x, req, ep, st, u, load, now)
	} else {
		p.liveFeatures(&x, req, ep, st, u, now)
	}
	p.ttftTheta(st, &theta)
	return clampSeconds(dot(&theta, &x, ttftDim)), p.confidence(st, now), true
}

// PredictTPOT returns the predicted mean time per output token of req on
// ep, in seconds, with the same guarantees as PredictTTFT.
func (p *Predictor) PredictTPOT(req *signals.Request, ep *signals.Endpoint) (float64, bool) {
	if req == nil || ep == nil {
		return 0, false
	}
	st := p.state(ep)
	now := p.cfg.Clock.Now()
	var z, theta [maxDim]float64
	hl := p.HalfLife()
	z[gConst] = 1
	z[gBatch] = bound(ep.RunningRequests(now, hl), maxRunning) + 1
	z[gKV] = kvUtil(ep, now, hl)
	p.tpotTheta(st, &theta)
	return clampSeconds(dot(&theta, &z, tpotDim)), true
}

// Confidence returns how far the predictions for ep can be trusted, in
// [0, 1]: the effective number of TTFT observations over
// Config.FullConfidenceSamples (capped at 1), halving every
// Config.ConfidenceHalfLife since the last observation, and at least
// Config.PriorConfidence when ep carries a speed label. It is safe for
// concurrent use and does not allocate.
func (p *Predictor) Confidence(ep *signals.Endpoint) float64 {
	return p.ConfidenceAt(ep, p.cfg.Clock.Now())
}

// ConfidenceAt is Confidence at a time the caller already read from the
// predictor's clock.
func (p *Predictor) ConfidenceAt(ep *signals.Endpoint, now time.Time) float64 {
	if ep == nil {
		return 0
	}
	return p.confidence(p.state(ep), now)
}

// confidence is ConfidenceAt for the endpoint state st.
func (p *Predictor) confidence(st *epState, now time.Time) float64 {
	c := min(st.n.Load()/p.cfg.FullConfidenceSamples, 1)
	if c > 0 && p.cfg.ConfidenceHalfLife > 0 {
		age := now.UnixNano() - st.lastSample.Load()
		if age > 0 {
			c = flush(c * math.Exp2(-float64(age)/float64(p.cfg.ConfidenceHalfLife)))
		}
	}
	if st.labelled {
		c = max(c, p.cfg.PriorConfidence)
	}
	return c
}

// meanPrompt returns the mean uncached prompt size to convert queued
// requests into tokens: the endpoint's, else the pool's, else u (assume the
// queue holds requests like this one).
func (p *Predictor) meanPrompt(st *epState, u float64) float64 {
	if v := st.avgPrompt.Load(); v > 0 {
		return v
	}
	if v := p.poolPrompt.Load(); v > 0 {
		return v
	}
	return u
}

// queuedTokens is the prefill work ahead of a request on an endpoint, in
// tokens: the uncached prompt tokens this process sent there that have not
// produced a first token yet (Endpoint.Prefilling: exact and lag-free when
// the caller reports first tokens, and without the requests already
// decoding), plus the waiting requests the scrape shows beyond those
// (other routers' requests, Endpoint.QueueDepth less this process's
// prefilling ones) at avg tokens each. own is the request's own share when
// it is already counted (its uncached tokens; counted says so): Dispatched
// runs after Dispatch and StartPrefill have counted it, a prediction before.
//
// The first term was once InFlightTokens, the prompt tokens of every
// request in flight: decoding requests counted as queued prefill and
// this process's waiting requests twice (there and in the scraped queue),
// so the fitted coefficient of the queued work stayed near 0 and the
// per-token coefficient, whose inverse is the published prefill rate,
// absorbed the queueing: identical pods in routebench's uniform fleet
// published 17–31k tokens/s for thousands of requests while the others
// published 42–45k. Counting prefill work only, the one-step TTFT
// prediction error (mean |log(predicted/observed)| over endpoints with 20
// or more effective observations, routebench, default weights, seeds 1
// and 2) fell from 0.45/0.48 to 0.21/0.21 on the Azure traces, from
// 0.42/0.38 to 0.28/0.27 on the Mooncake trace, from 0.28/0.26 to
// 0.18/0.17 on bursty LoRA traffic and from 0.18/0.20 to 0.16/0.18 on the
// mixed fleet, and rose from 0.16/0.12 to 0.18/0.16 on the uniform one.
func queuedTokens(prefillReqs, prefillTokens int64, waiting, avg, own float64, counted bool) float64 {
	reqs := float64(prefillReqs)
	if counted {
		// The request itself is in the scraped queue's correction (Dispatch)
		// whether or not the caller counted it with StartPrefill.
		reqs = max(reqs, 1)
	}
	ahead := max(float64(prefillTokens)-own, 0)
	others := max(bound(waiting, maxRunning)-reqs, 0)
	return ahead + others*avg
}

// liveFeatures fills x for a prediction at now.
func (p *Predictor) liveFeatures(x *[maxDim]float64, req *signals.Request, ep *signals.Endpoint, st *epState, u float64, now time.Time) {
	avg := p.meanPrompt(st, u)
	pr, pt := ep.Prefilling()
	hl := p.HalfLife()
	q := queuedTokens(pr, pt, ep.QueueDepth(now, hl), avg, 0, false)
	x[fConst] = 1
	x[fUncached] = u / 1000
	x[fQueued] = bound(q, maxQueuedTokens) / 1000
	x[fRunning] = bound(ep.RunningRequests(now, hl), maxRunning)
	x[fKV] = kvUtil(ep, now, hl)
	if req.Adapter != "" && ep.LoRAResidency(req.Adapter, now) < signals.ResidencyWaiting {
		x[fLoRA] = 1
	}
}

// loadFeatures is liveFeatures from a load read with the predictor's
// half-life.
func (p *Predictor) loadFeatures(x *[maxDim]float64, req *signals.Request, ep *signals.Endpoint, st *epState, u float64, l *signals.Load, now time.Time) {
	avg := p.meanPrompt(st, u)
	q := queuedTokens(l.PrefillRequests, l.PrefillTokens, l.Waiting, avg, 0, false)
	x[fConst] = 1
	x[fUncached] = u / 1000
	x[fQueued] = bound(q, maxQueuedTokens) / 1000
	x[fRunning] = bound(l.Running, maxRunning)
	if l.KVKnown {
		x[fKV] = bound(l.KV, 1)
	}
	if req.Adapter != "" && ep.LoRAResidency(req.Adapter, now) < signals.ResidencyWaiting {
		x[fLoRA] = 1
	}
}

// Dispatched implements signals.Observer. It records the request's
// features as they were just before it was sent, to pair them with its
// outcome in Completed. It assumes, as package picker does, that ep has
// already counted the request (ep.Dispatch, ep.NoteAdapter), and removes
// the request's own share from the load it reads. At most Config.MaxPending
// outstanding dispatches are remembered; the oldest is dropped first. Safe
// for concurrent use; it does not block on anything but short mutexes.
func (p *Predictor) Dispatched(req *signals.Request, ep *signals.Endpoint) {
	if req == nil || ep == nil {
		return
	}
	st := p.state(ep)
	now := p.cfg.Clock.Now()
	promptTokens := bound(float64(req.PromptTokens), maxPromptTokens)

	st.mu.Lock()
	// Read under the lock: counters only grow, so successive holders see
	// successive values and the deltas below never go negative.
	c := ep.Counters()
	// The picker dispatched PromptTokens × (1 − match) uncached tokens and
	// does not tell observers the match; the endpoint's counters do. When
	// exactly one dispatch happened since the last one seen here, the token
	// delta is this request's; with concurrent dispatches (or at first sight
	// of an endpoint used before), their mean, which a Dispatched that finds
	// its own dispatch already counted reuses.
	dn := c.Dispatched - st.counters.Dispatched
	dt := float64(c.DispatchedTokens - st.counters.DispatchedTokens)
	u := promptTokens
	switch {
	case dn >= 1:
		u = dt / float64(dn)
		st.lastU = u
	case st.lastU > 0:
		u = st.lastU
	}
	st.counters = c
	u = min(u, promptTokens)
	loraLoad := req.Adapter != "" && !st.adapterRecent(req.Adapter, now) && !adapterListed(ep.Metrics(), req.Adapter)
	st.noteAdapter(req.Adapter, now)
	// The mean uncached prompt size converts scraped queue lengths into
	// tokens: a running mean over the first 100 dispatches, then an
	// exponential one with weight 1/100 (it multiplies the queue, so its
	// noise must stay small).
	avg := st.avgPrompt.Load()
	st.prompts = min(st.prompts+1, 100)
	st.avgPrompt.Store(flush(avg + (u-avg)/st.prompts)) // no subnormal dust: see tiny
	st.mu.Unlock()
	if avg <= 0 {
		if avg = p.poolPrompt.Load(); avg <= 0 {
			avg = u
		}
	}
	st.lastActive.Store(now.UnixNano())

	var e pendingEntry
	x := &e.x
	x[fConst] = 1
	x[fUncached] = u / 1000
	pr, pt := ep.Prefilling()
	hl := p.HalfLife()
	q := queuedTokens(pr, pt, ep.QueueDepth(now, hl), avg, u, true)
	x[fQueued] = bound(q, maxQueuedTokens) / 1000
	running := bound(ep.RunningRequests(now, hl)-1, maxRunning)
	x[fRunning] = running
	kv := kvUtil(ep, now, hl)
	if capTokens := ep.Metrics().CapacityTokens(); capTokens > 0 {
		kv = max(kv-u/float64(capTokens), 0)
	}
	x[fKV] = kv
	if loraLoad {
		x[fLoRA] = 1
	}
	e.z[gConst] = 1
	e.z[gBatch] = running + 1
	e.z[gKV] = kv
	p.pending.put(pendingKey{req, ep}, e)
}

// Completed implements signals.Observer. It pairs the outcome with the
// features recorded by Dispatched and updates ep's models: TTFT from
// out.TTFT, TPOT from (out.Latency − out.TTFT) / (out.CompletionTokens − 1)
// unless out.Buffered (a body that came whole says nothing about the time
// between tokens). Failed requests (out.Err != nil), unknown (zero or
// negative) times, completions without a recorded dispatch and those of
// an endpoint forgotten since its dispatch (Forget, Retain, the idle
// sweep: its state is not brought back) teach nothing. After a TTFT update it publishes the learned prefill throughput
// with ep.SetThroughput. Safe for concurrent use.
func (p *Predictor) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	if req == nil || ep == nil {
		return
	}
	e, ok := p.pending.take(pendingKey{req, ep})
	if !ok || out.Err != nil {
		return
	}
	st, ok := p.lookup(ep)
	if !ok {
		return // forgotten since the dispatch: its state is not brought back
	}
	now := p.cfg.Clock.Now()
	st.lastActive.Store(now.UnixNano())
	if out.PromptTokens > 0 && out.CachedTokens > 0 {
		// The server's usage says what it actually recomputed.
		e.x[fUncached] = bound(float64(out.PromptTokens-out.CachedTokens), maxPromptTokens) / 1000
	}

	ttft := out.TTFT.Seconds()
	var tpot float64
	if n := out.CompletionTokens; n > 1 && !out.Buffered && out.TTFT > 0 && out.Latency > out.TTFT {
		tpot = (out.Latency - out.TTFT).Seconds() / float64(n-1)
	}
	var theta, thetaG [maxDim]float64
	trainedT, trainedG := false, false

	st.mu.Lock()
	if ttft > 0 {
		if st.ttft.n == 0 {
			var norm [maxDim]float64
			p.poolPubT.load(&norm)
			prior := scaleTTFT(&norm, st.speed)
			st.ttft.reset(ttftDim, p.cfg.Forgetting, 1e-3, p.cfg.FullConfidenceSamples, &p.reg, &prior)
		}
		st.ttft.update(&e.x, clampSeconds(ttft))
		st.pubT.store(&st.ttft.theta)
		st.n.Store(st.ttft.n)
		st.lastSample.Store(now.UnixNano())
		theta, trainedT = st.ttft.theta, true
	}
	if tpot > 0 {
		if st.tpot.n == 0 {
			var norm [maxDim]float64
			p.poolPubG.load(&norm)
			prior := scaleTPOT(&norm, st.speed)
			st.tpot.reset(tpotDim, p.cfg.Forgetting, 1e-4, p.cfg.FullConfidenceSamples, &p.regG, &prior)
		}
		st.tpot.update(&e.z, clampSeconds(tpot))
		st.pubG.store(&st.tpot.theta)
		st.nG.Store(st.tpot.n)
		thetaG, trainedG = st.tpot.theta, true
	}
	nT, nG := st.ttft.n, st.tpot.n
	st.mu.Unlock()

	if trainedT {
		if s := p.publishedSecPerKTok(theta[fUncached], nT, st.speed); s > 1e-9 {
			ep.SetThroughput(1000 / s)
		}
	}
	p.updatePool(st.speed, st.avgPrompt.Load(), trainedT && nT >= p.cfg.FullConfidenceSamples/2, &theta,
		trainedG && nG >= p.cfg.FullConfidenceSamples/2, &thetaG)
	if p.completions.Add(1)%4096 == 0 {
		p.sweep(now)
	}
}

// publishedSecPerKTok is the seconds per thousand prompt tokens that
// Completed publishes as the endpoint's prefill throughput (1000 / it):
// learned, the coefficient after n effective observations, blended
// with the pool's prior for the endpoint's speed in proportion to the
// sample confidence min(n / FullConfidenceSamples, 1), as Confidence ramps.
//
// The blend is there because the prefill scorer divides by the published
// rate at face value, with no confidence of its own, and the first few
// observations cannot separate the uncached-token coefficient from the
// constant and the queued-work one. In routebench's uniform fleet (eight
// identical H100 pods, about 45 000 tokens/s each) at seed 34 and 90%
// load, one pod's first observations put it at 745 000 tokens/s; the
// prefill scorer then preferred it for 280 picks, it held 21 of the 26
// slowest first tokens of the run (up to 732 ms), and the p99 was 1.23
// times round-robin's. A negative learned coefficient counts as zero:
// blended as it was, it overshot the pool's (at seed 73, 90% load, −3.6
// times the pool's value after two observations made a pod publish
// 490 000 tokens/s, and it held 22 of the 26 slowest first tokens). Over
// seeds 1–100 of the quick uniform suite the gate's rule (mean and p99
// within 5% of round-robin's) failed in 5 of 300 runs before the blend
// (the worst 2.04× at seed 81) and fails in 1 with it and the queued-work
// count of queuedTokens (1.09×, seed 25 at 70% load).
func (p *Predictor) publishedSecPerKTok(learned, n, speed float64) float64 {
	c := min(n/p.cfg.FullConfidenceSamples, 1)
	if c >= 1 {
		return learned
	}
	var norm [maxDim]float64
	p.poolPubT.load(&norm)
	prior := scaleTTFT(&norm, speed)[fUncached]
	// A negative coefficient (seconds per token below zero, which the
	// first observations can give) counts as 0: blended as it was, it
	// pulled the rate toward the pool's only to overshoot it.
	return c*max(learned, 0) + (1-c)*prior
}

// updatePool moves the pool's speed-normalised prior toward an endpoint's
// learned coefficients: each of the TTFT coefficients, the TPOT
// coefficients and the mean prompt size is a running mean over its first
// 50 contributions, then an exponential mean with weight 1/50, so the
// prior of a new endpoint is what the pool has recently been.
func (p *Predictor) updatePool(speed, prompt float64, useT bool, theta *[maxDim]float64, useG bool, thetaG *[maxDim]float64) {
	if !useT && !useG {
		return
	}
	p.poolMu.Lock()
	defer p.poolMu.Unlock()
	if prompt > 0 {
		p.poolNP = min(p.poolNP+1, 50)
		pp := p.poolPrompt.Load()
		p.poolPrompt.Store(flush(pp + (prompt-pp)/p.poolNP))
	}
	if useT {
		p.poolNT = min(p.poolNT+1, 50)
		w := 1 / p.poolNT
		norm := normTTFT(theta, speed)
		for i := 0; i < ttftDim; i++ {
			p.poolTTFT[i] = flush(p.poolTTFT[i] + w*(norm[i]-p.poolTTFT[i]))
		}
		p.poolPubT.store(&p.poolTTFT)
	}
	if useG {
		p.poolNG = min(p.poolNG+1, 50)
		w := 1 / p.poolNG
		for i := 0; i < tpotDim; i++ {
			p.poolTPOT[i] = flush(p.poolTPOT[i] + w*(thetaG[i]*speed-p.poolTPOT[i]))
		}
		p.poolPubG.store(&p.poolTPOT)
	}
}

// Forget drops everything the predictor knows about ep. Call it when an
// endpoint leaves the pool for good; otherwise its state is dropped after
// Config.StateTTL without activity. Safe for concurrent use.
func (p *Predictor) Forget(ep *signals.Endpoint) {
	if _, ok := p.lookup(ep); !ok {
		return
	}
	p.rewriteStates(func(k *signals.Endpoint, _ *epState) bool { return k != ep })
}

// Retain drops what the predictor knows about every endpoint not in keep,
// as Forget does for one: package picker calls it from SetEndpoints, so
// the state of endpoints that left the pool is freed at once rather than
// after Config.StateTTL. The pool-wide prior keeps what they taught it.
// Safe for concurrent use.
func (p *Predictor) Retain(keep []*signals.Endpoint) {
	set := make(map[*signals.Endpoint]struct{}, len(keep))
	for _, ep := range keep {
		set[ep] = struct{}{}
	}
	for k := range *p.states.Load() {
		if _, ok := set[k]; !ok {
			p.rewriteStates(func(k *signals.Endpoint, _ *epState) bool {
				_, ok := set[k]
				return ok
			})
			return
		}
	}
}

// sweep drops the state of endpoints idle for longer than StateTTL.
func (p *Predictor) sweep(now time.Time) {
	cutoff := now.Add(-p.cfg.StateTTL).UnixNano()
	stale := false
	for _, st := range *p.states.Load() {
		if st.lastActive.Load() < cutoff {
			stale = true
			break
		}
	}
	if stale {
		p.rewriteStates(func(_ *signals.Endpoint, st *epState) bool { return st.lastActive.Load() >= cutoff })
	}
}

// adapterRecent reports whether adapter was dispatched to the endpoint
// within signals.AdapterRecency before now: the same rule the endpoint uses
// for LoRAResidency, kept here because by the time Dispatched runs the
// endpoint has already noted this request's adapter. Caller holds st.mu.
func (st *epState) adapterRecent(adapter string, now time.Time) bool {
	cutoff := now.Add(-signals.AdapterRecency).UnixNano()
	for _, a := range st.adapters {
		if a.name == adapter {
			return a.at >= cutoff
		}
	}
	return false
}

// noteAdapter records a dispatch of adapter at now. Caller holds st.mu.
func (st *epState) noteAdapter(adapter string, now time.Time) {
	if adapter == "" {
		return
	}
	for i := range st.adapters {
		if st.adapters[i].name == adapter {
			st.adapters[i].at = now.UnixNano()
			return
		}
	}
	st.adapters[st.nextAd] = adapterSeen{name: adapter, at: now.UnixNano()}
	st.nextAd = (st.nextAd + 1) % len(st.adapters)
}

// adapterListed reports whether the scrape lists adapter as running or
// waiting (so it is loaded or being loaded).
func adapterListed(m *signals.Metrics, adapter string) bool {
	if m == nil || !m.LoRAKnown {
		return false
	}
	for _, a := range m.RunningAdapters {
		if a == adapter {
			return true
		}
	}
	for _, a := range m.WaitingAdapters {
		if a == adapter {
			return true
		}
	}
	return false
}

// Explanation is the state of one endpoint's models in physical units, for
// debugging and dashboards.
type Explanation struct {
	// Samples is the effective (exponentially weighted) number of TTFT
	// observations; TPOTSamples likewise for TPOT.
	Samples, TPOTSamples float64
	// Confidence is Predictor.Confidence.
	Confidence float64
	// RelativeSpeed is the speed from the endpoint's labels (1 without).
	RelativeSpeed float64
	// The TTFT coefficients, in seconds: fixed overhead; per thousand
	// uncached prompt tokens of the request; per thousand tokens of prefill
	// work ahead; per running request; at a full KV cache; to load a LoRA
	// adapter.
	Overhead, PerKiloToken, PerKiloQueuedToken, PerRunning, AtFullKVCache, LoRALoad float64
	// The TPOT coefficients, in seconds per output token: base; per
	// sequence in the batch; at a full KV cache.
	TPOTBase, TPOTPerSequence, TPOTAtFullKVCache float64
}

// Explain returns the current coefficients for ep (the prior's when it has
// no observations). Safe for concurrent use.
func (p *Predictor) Explain(ep *signals.Endpoint) Explanation {
	if ep == nil {
		return Explanation{}
	}
	st := p.state(ep)
	var t, g [maxDim]float64
	p.ttftTheta(st, &t)
	p.tpotTheta(st, &g)
	return Explanation{
		Samples: st.n.Load(), TPOTSamples: st.nG.Load(),
		Confidence: p.Confidence(ep), RelativeSpeed: st.speed,
		Overhead: t[fConst], PerKiloToken: t[fUncached], PerKiloQueuedToken: t[fQueued],
		PerRunning: t[fRunning], AtFullKVCache: t[fKV], LoRALoad: t[fLoRA],
		TPOTBase: g[gConst], TPOTPerSequence: g[gBatch], TPOTAtFullKVCache: g[gKV],
	}
}

// uncached returns the prompt tokens not covered by the prefix cache.
func uncached(promptTokens int, cachedFraction float64) float64 {
	f := cachedFraction
	switch {
	case math.IsNaN(f) || f < 0:
		f = 0
	case f > 1:
		f = 1
	}
	return bound(float64(promptTokens), maxPromptTokens) * (1 - f)
}

// kvUtil returns the endpoint's KV utilisation, 0 when unknown.
func kvUtil(ep *signals.Endpoint, now time.Time, halfLife time.Duration) float64 {
	v, ok := ep.KVCacheUtilization(now, halfLife)
	if !ok {
		return 0
	}
	return bound(v, 1)
}

// bound maps v into [0, hi]; NaN becomes 0.
func bound(v, hi float64) float64 {
	switch {
	case v > hi:
		return hi
	case v >= 0:
		return v
	}
	return 0
}

// clampSeconds maps a predicted or observed time into [0, MaxSeconds].
func clampSeconds(v float64) float64 { return bound(v, MaxSeconds) }
