package signals

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"
)

// EndpointSpec is the identity of a model-server replica: what discovery or
// configuration knows about it before any scrape.
type EndpointSpec struct {
	// Name identifies the endpoint uniquely within a pool (a pod name, or
	// the address when nothing better is known).
	Name string
	// Address is the host:port requests are sent to.
	Address string
	// MetricsURL is the Prometheus metrics page; "" means http://Address/metrics.
	MetricsURL string
	// Engine names the model server ("vllm", "sglang", "tgi",
	// "triton-tensorrt-llm", "trtllm-serve", …); "" means vLLM.
	Engine string
	// Model is the base model the endpoint serves.
	Model string
	// Adapters are the LoRA adapters the endpoint can load. Nil means the
	// endpoint's adapters are not known statically (it may serve any).
	Adapters []string
	// Labels are free-form labels (zone, GPU type, …) for filters and scorers.
	Labels map[string]string
}

// Endpoint is one model-server replica: its identity, the latest scraped
// Metrics snapshot, and live load counters kept by this process.
//
// The spec fields are read-only once the endpoint is created. Everything
// else is updated atomically and read without locks, so an Endpoint is safe
// for concurrent use. An Endpoint must not be copied after first use: its
// counters outlive the endpoint snapshots that the picker swaps, and a copy
// would split them.
type Endpoint struct {
	EndpointSpec

	_ noCopy

	// The fields a pick reads are grouped into two cache lines: the
	// read-mostly line (written by scrapes, health changes and the latency
	// model) and the counter line (written on every dispatch and
	// completion). Padding keeps them apart, so that dispatches on one core
	// do not invalidate what a match or a scorer on another core reads
	// (false sharing), and aligned: Endpoint's size is a multiple of 64
	// bytes, which Go's allocator places at 64-byte boundaries
	// (TestHotFieldsAligned checks both).
	_ [(64 - unsafe.Sizeof(EndpointSpec{})%64) % 64]byte

	metrics        atomic.Pointer[Metrics]
	throughput     atomic.Uint64 // math.Float64bits of tokens per second; 0 = unknown
	invThroughput  atomic.Uint64 // math.Float64bits of 1/throughput; 0 = unknown
	generation     atomic.Uint64
	health         atomic.Uint64 // downs<<1 | 1 while healthy; see HealthMark
	scrapeFailures atomic.Int32
	protocolErrors atomic.Int32 // answers that served nothing in a row, up to ProtocolErrorThreshold; see ReportProtocolError, ReportServerError
	speed          float64      // from the labels, set by NewEndpoint and read-only after; 0 = no label (RelativeSpeed)
	_              [8]byte

	// inFlight and inFlightTokens equal dispatched − completed and
	// dispatchedTokens − completedTokens: Dispatch and Complete change
	// both, and nothing else changes either.
	inFlight       atomic.Int64
	inFlightTokens atomic.Int64
	prefilling     atomic.Int64
	prefillTokens  atomic.Int64
	// burst packs the decayed count of recent dispatches: the high 32 bits
	// are a float32 count as of the time in the low 32 bits (milliseconds,
	// wrapping every 49.7 days; only differences are used, see decayBurst).
	burst      atomic.Uint64
	dispatched atomic.Uint64
	completed  atomic.Uint64
	_          [8]byte

	// Cumulative counters for Counters, and the adapters recently routed
	// here; not read on the pick path.
	dispatchedTokens atomic.Uint64
	completedTokens  atomic.Uint64
	recentNext       atomic.Uint32
	recent           [recentAdapterSlots]recentAdapter

	_ [40]byte // to a multiple of 64 bytes
}

// BurstHalfLife is the half-life of Endpoint.RecentDispatches: about the
// time a current GPU takes to prefill a few thousand tokens, so the count
// says how many requests are probably still in their prefill.
const BurstHalfLife = 100 * time.Millisecond

// NoteDispatch records a dispatch at now in the decayed count read by
// RecentDispatches. The picker calls it on every pick; it is lock-free.
func (ep *Endpoint) NoteDispatch(now time.Time) {
	ms := uint32(now.UnixMilli())
	for {
		old := ep.burst.Load()
		v := decayBurst(old, ms) + 1
		if ep.burst.CompareAndSwap(old, uint64(math.Float32bits(float32(v)))<<32|uint64(ms)) {
			return
		}
	}
}

// RecentDispatches returns the number of requests dispatched to the
// endpoint by this process, each weighted by 2^(-age/BurstHalfLife): an
// estimate of how many are still in prefill. Unlike the scraped counts it
// never lags and is not reset by a scrape, so a burst arriving within one
// scrape interval, or just after one, spreads instead of colliding.
//
// A count older than 1022 half-lives (about 102 s) reads as 0, however
// old, and so does one noted more than that after now (a clock stepped
// back); a clock behind by less reads the count undecayed. The time of the
// last dispatch is kept modulo 2^32 ms (about 49.7 days), so only an age
// within 102 s of a multiple of that period is misread, as the age modulo
// the period.
func (ep *Endpoint) RecentDispatches(now time.Time) float64 {
	return decayBurst(ep.burst.Load(), uint32(now.UnixMilli()))
}

// burstHalfLifeMs is BurstHalfLife in milliseconds.
const burstHalfLifeMs = int32(BurstHalfLife / time.Millisecond)

// burstDecay[r] is 2^(-r/burstHalfLifeMs): with ages in whole milliseconds
// the decay is a table lookup and a power of two: as accurate as
// math.Exp2 (the polynomial exp2Neg is within 1e-4), with no float
// conversion on the pick path.
var burstDecay = func() (t [burstHalfLifeMs]float64) {
	for r := range t {
		t[r] = math.Exp2(-float64(r) / float64(burstHalfLifeMs))
	}
	return t
}()

// burstZeroMs is the age, in milliseconds, from which a burst count reads
// as fully decayed: 1022 half-lives, past which 2^(-age/BurstHalfLife) is
// below the smallest normal float64.
const burstZeroMs = 1022 * uint32(burstHalfLifeMs)

// decayBurst returns the count packed in packed, decayed to nowMs. The
// packed time is kept modulo 2^32 ms, so the age nowMs − time is only known
// modulo 2^32 ms (about 49.7 days): an age within burstZeroMs below a
// multiple of it is read as a clock slightly behind the last dispatch
// (concurrent callers read the clock in any order) and returns the count
// undecayed; every other age of burstZeroMs or more, however large,
// returns 0.
func decayBurst(packed uint64, nowMs uint32) float64 {
	v := float64(math.Float32frombits(uint32(packed >> 32)))
	if v == 0 {
		return 0
	}
	age := nowMs - uint32(packed) // wrap-safe difference, modulo 2^32
	if age >= burstZeroMs {
		if age > math.MaxUint32-burstZeroMs {
			return v // now is at most burstZeroMs behind the last dispatch
		}
		return 0
	}
	if age == 0 {
		return v
	}
	q, r := age/uint32(burstHalfLifeMs), age%uint32(burstHalfLifeMs)
	return v * burstDecay[r] * math.Float64frombits(uint64(1023-q)<<52)
}

// recentAdapterSlots bounds how many recently routed adapters are remembered
// per endpoint. vLLM's default --max-loras is 1 and deployments rarely go past
// 8, so 8 covers the adapters that can be resident at once.
const recentAdapterSlots = 8

type recentAdapter struct {
	hash atomic.Uint64
	at   atomic.Int64 // unix nanoseconds of the last dispatch
}

// noCopy makes go vet's copylocks check flag copies of an Endpoint.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// NewEndpoint returns a healthy endpoint with no metrics yet. It reads the
// speed labels once (RelativeSpeed); spec must not change afterwards.
func NewEndpoint(spec EndpointSpec) *Endpoint {
	if spec.Name == "" {
		spec.Name = spec.Address
	}
	ep := &Endpoint{EndpointSpec: spec, speed: labelSpeed(spec.Labels)}
	ep.health.Store(1)
	return ep
}

// MetricsAddress returns the endpoint's metrics page address.
func (ep *Endpoint) MetricsAddress() string {
	if ep.MetricsURL != "" {
		return ep.MetricsURL
	}
	return "http://" + ep.Address + "/metrics"
}

// Metrics returns the latest published snapshot, or nil before the first
// successful scrape. The snapshot must not be modified.
func (ep *Endpoint) Metrics() *Metrics { return ep.metrics.Load() }

// SetMetrics publishes a new snapshot atomically. It takes ownership of m,
// which must not be modified afterwards. A nil m clears the snapshot.
func (ep *Endpoint) SetMetrics(m *Metrics) {
	if m != nil {
		m.summarize()
	}
	ep.metrics.Store(m)
}

// Counters returns the endpoint's cumulative local accounting. A scraper
// takes it just before sending a scrape request and stores it in
// Metrics.Baseline.
func (ep *Endpoint) Counters() Counters {
	return Counters{
		Dispatched:       ep.dispatched.Load(),
		Completed:        ep.completed.Load(),
		DispatchedTokens: ep.dispatchedTokens.Load(),
		CompletedTokens:  ep.completedTokens.Load(),
	}
}

// Dispatch records that a request with the given number of uncached prompt
// tokens was sent to the endpoint. Every Dispatch must be matched by exactly
// one Complete with the same token count; the picker does both.
func (ep *Endpoint) Dispatch(tokens int) {
	t := max(tokens, 0)
	ep.inFlight.Add(1)
	ep.inFlightTokens.Add(int64(t))
	ep.dispatchedTokens.Add(uint64(t))
	ep.dispatched.Add(1)
}

// Complete records that a request dispatched with Dispatch(tokens) finished,
// successfully or not.
func (ep *Endpoint) Complete(tokens int) {
	t := max(tokens, 0)
	ep.inFlight.Add(-1)
	ep.inFlightTokens.Add(-int64(t))
	ep.completedTokens.Add(uint64(t))
	ep.completed.Add(1)
}

// StartPrefill records that a request with tokens uncached prompt tokens
// was sent to the endpoint and has not produced its first token yet. The
// picker calls it on every pick and EndPrefill once for it: when the caller
// reports the first response byte (picker.Result.FirstToken), else at Done.
func (ep *Endpoint) StartPrefill(tokens int) {
	ep.prefilling.Add(1)
	ep.prefillTokens.Add(int64(max(tokens, 0)))
}

// EndPrefill records that a request counted by StartPrefill(tokens)
// produced its first token, or ended without one.
func (ep *Endpoint) EndPrefill(tokens int) {
	ep.prefilling.Add(-1)
	ep.prefillTokens.Add(-int64(max(tokens, 0)))
}

// Prefilling returns the requests this process sent to the endpoint that
// have not produced a first token yet, and their uncached prompt tokens:
// the endpoint's prefill queue as far as this process knows. Unlike the
// scraped queue it has no lag, and unlike InFlight it does not count
// requests that are already decoding, as long as the caller reports first
// tokens. Never negative.
func (ep *Endpoint) Prefilling() (requests, tokens int64) {
	return max(ep.prefilling.Load(), 0), max(ep.prefillTokens.Load(), 0)
}

// DefaultPrefillRate is the prefill throughput, in tokens per second,
// assumed for an endpoint whose throughput has not been measured yet
// (Throughput): an estimate for an 8B-parameter model on one A100-80GB,
// scaled from Splitwise's measured performance model (Llama-2-70B on two
// A100-80GB prefills a 2048-token prompt in 0.69 s, about 3000 tokens/s;
// an 8B model needs about a ninth of the compute per token, on half the
// GPUs: about 13,500 tokens/s), rounded down. The latency predictor
// replaces it with a measurement after a few requests.
const DefaultPrefillRate = 10000.0

// PrefillRate returns the endpoint's prefill throughput in tokens per
// second: Throughput when measured, else DefaultPrefillRate.
func (ep *Endpoint) PrefillRate() float64 {
	if tp, ok := ep.Throughput(); ok {
		return tp
	}
	return DefaultPrefillRate
}

// InFlight returns the number of requests this process has dispatched to the
// endpoint and not yet seen complete.
func (ep *Endpoint) InFlight() int64 { return max(ep.inFlight.Load(), 0) }

// InFlightTokens returns the uncached prompt tokens of the requests in flight.
func (ep *Endpoint) InFlightTokens() int64 { return max(ep.inFlightTokens.Load(), 0) }

// blend mixes a scrape-based value with the local accounting by the
// scrape's confidence, so an ageing scrape fades into local knowledge
// instead of falling off a cliff. At confidence 0 or 1 it is exactly one of
// them, so that an infinite reading at no confidence is not 0 × Inf = NaN.
func blend(scraped, local, conf float64) float64 {
	switch {
	case conf <= 0:
		return local
	case conf >= 1:
		return scraped
	}
	return conf*scraped + (1-conf)*local
}

// QueueDepth returns the number of requests waiting on the endpoint: the
// scraped queue plus what this process dispatched since minus what completed
// since (never below zero), faded by the scrape's age toward the local
// in-flight count. Before any scrape it is the local in-flight count.
func (ep *Endpoint) QueueDepth(now time.Time, halfLife time.Duration) float64 {
	return ep.corrected(func(h *scrapeSummary) float64 { return h.waiting }, now, halfLife)
}

// RunningRequests returns the number of requests in the endpoint's running
// batch, corrected by the local accounting like QueueDepth.
func (ep *Endpoint) RunningRequests(now time.Time, halfLife time.Duration) float64 {
	return ep.corrected(func(h *scrapeSummary) float64 { return h.running }, now, halfLife)
}

// Requests returns the requests on the endpoint, waiting plus running, with
// the same correction as QueueDepth applied once to the sum (not once to
// each count). It is what "how loaded is this pod in requests" means to a
// scorer that does not care where in the server the requests sit.
func (ep *Endpoint) Requests(now time.Time, halfLife time.Duration) float64 {
	return ep.corrected(func(h *scrapeSummary) float64 { return h.requests }, now, halfLife)
}

// requestsReading is waiting plus running, known when either is.
func requestsReading(m *Metrics) Reading {
	if !m.Waiting.Known && !m.Running.Known {
		return Reading{}
	}
	var v float64
	if m.Waiting.Known {
		v += clampNonNeg(m.Waiting.Value)
	}
	if m.Running.Known {
		v += clampNonNeg(m.Running.Value)
	}
	// Two huge readings must not add up to +Inf, which no scorer expects.
	return Reading{Value: min(v, math.MaxFloat64), Known: true}
}

// corrected is a scraped count, chosen from the snapshot's summary by
// field (NaN when unknown), corrected for the work since the scrape and
// faded toward the local in-flight count (correct).
func (ep *Endpoint) corrected(field func(*scrapeSummary) float64, now time.Time, halfLife time.Duration) float64 {
	inFlight := ep.inFlight.Load()
	local := float64(max(inFlight, 0))
	m := ep.metrics.Load()
	if m == nil {
		return local
	}
	v := field(&m.hot)
	if v != v {
		return local
	}
	at := NewInstant(now, halfLife)
	return correct(v, float64(inFlight-m.hot.baseInFlight), local, m.confidence(&at))
}

// correct is a scraped count v (known, not negative) plus since, the
// requests dispatched minus completed since the scrape (the sum never below
// zero), blended toward the local in-flight count by the scrape's
// confidence.
func correct(v, since, local, conf float64) float64 {
	return blend(max(v+since, 0), local, conf)
}

// KVCacheUtilization returns the fraction of the endpoint's KV cache in use,
// in [0, 1]. When the server publishes its cache size, the tokens dispatched
// and completed since the scrape are added back, and an ageing scrape fades
// toward the local in-flight tokens over the capacity. It is unknown when the
// server does not publish utilisation.
func (ep *Endpoint) KVCacheUtilization(now time.Time, halfLife time.Duration) (float64, bool) {
	tokens := ep.inFlightTokens.Load()
	m := ep.metrics.Load()
	if m == nil || !m.KVCacheUtilization.Known {
		return 0, false
	}
	at := NewInstant(now, halfLife)
	return kvAt(&m.hot, tokens, m.confidence(&at)), true
}

// kvAt is KVCacheUtilization for a snapshot summary h whose utilisation is
// known, with tokens uncached prompt tokens in flight (the raw counter), at
// scrape confidence conf.
func kvAt(h *scrapeSummary, tokens int64, conf float64) float64 {
	if h.invCap <= 0 {
		return h.kv
	}
	scraped, local := h.kvParts(tokens)
	return blend(scraped, local, conf)
}

// kvParts returns, for a summary that knows the cache's capacity, the
// scraped utilisation corrected by the tokens dispatched and completed
// since, and the utilisation of the tokens in flight alone, both clamped
// to [0, 1]: what kvAt blends. Small enough to be inlined, so that
// ReadLoadsAt's loop makes no call for it.
func (h *scrapeSummary) kvParts(tokens int64) (scraped, local float64) {
	return clamp01(h.kv + float64(tokens-h.baseInFlightTokens)*h.invCap), clamp01(float64(max(tokens, 0)) * h.invCap)
}

// Residency says how ready an endpoint is to serve a LoRA adapter.
// Higher is better.
type Residency int

// Residency levels, from worst to best.
const (
	// ResidencyUnknown: the server publishes no adapter state.
	ResidencyUnknown Residency = iota
	// ResidencyEvict: every slot is taken by other adapters; serving this one
	// means waiting for a slot and loading.
	ResidencyEvict
	// ResidencyFreeSlot: not resident, but a slot is free to load it.
	ResidencyFreeSlot
	// ResidencyWaiting: requests for it are queued, so it will be loaded.
	ResidencyWaiting
	// ResidencyRunning: it is in the running batch, or was routed here within
	// the recency window.
	ResidencyRunning
)

// AdapterRecency is how long an adapter routed to an endpoint counts as
// resident there even before a scrape confirms it.
const AdapterRecency = 10 * time.Second

// LoRAResidency returns how ready the endpoint is to serve adapter at now,
// from the scraped running and waiting adapter lists and slot count plus the
// adapters this process routed to it within AdapterRecency.
// The empty adapter (the base model) is always ResidencyRunning.
func (ep *Endpoint) LoRAResidency(adapter string, now time.Time) Residency {
	if adapter == "" {
		return ResidencyRunning
	}
	if ep.routedRecently(adapter, now) {
		return ResidencyRunning
	}
	m := ep.metrics.Load()
	if m == nil || !m.LoRAKnown {
		return ResidencyUnknown
	}
	for _, a := range m.RunningAdapters {
		if a == adapter {
			return ResidencyRunning
		}
	}
	for _, a := range m.WaitingAdapters {
		if a == adapter {
			return ResidencyWaiting
		}
	}
	if m.MaxLoRA <= 0 {
		// Slots unknown: an adapter that is not resident may still fit.
		return ResidencyFreeSlot
	}
	used := len(m.RunningAdapters) + ep.recentOthers(m, now)
	if used < m.MaxLoRA {
		return ResidencyFreeSlot
	}
	return ResidencyEvict
}

// recentOthers counts adapters routed here recently that the scrape does not
// list as running yet; they occupy slots too.
func (ep *Endpoint) recentOthers(m *Metrics, now time.Time) int {
	n := 0
	cutoff := now.Add(-AdapterRecency).UnixNano()
	for i := range ep.recent {
		r := &ep.recent[i]
		if r.at.Load() < cutoff || r.at.Load() == 0 {
			continue
		}
		h := r.hash.Load()
		listed := false
		for _, a := range m.RunningAdapters {
			if hashString(a) == h {
				listed = true
				break
			}
		}
		if !listed {
			n++
		}
	}
	return n
}

// NoteAdapter records that a request for adapter was routed to the endpoint
// at now. The picker calls it on dispatch.
func (ep *Endpoint) NoteAdapter(adapter string, now time.Time) {
	if adapter == "" {
		return
	}
	h := hashString(adapter)
	for i := range ep.recent {
		if ep.recent[i].hash.Load() == h {
			ep.recent[i].at.Store(now.UnixNano())
			return
		}
	}
	i := ep.recentNext.Add(1) % recentAdapterSlots
	ep.recent[i].at.Store(0)
	ep.recent[i].hash.Store(h)
	ep.recent[i].at.Store(now.UnixNano())
}

func (ep *Endpoint) routedRecently(adapter string, now time.Time) bool {
	h := hashString(adapter)
	cutoff := now.Add(-AdapterRecency).UnixNano()
	for i := range ep.recent {
		r := &ep.recent[i]
		if r.hash.Load() == h {
			at := r.at.Load()
			return at != 0 && at >= cutoff
		}
	}
	return false
}

// hashString is 64-bit FNV-1a: deterministic across processes and free of
// allocation, for short names such as adapters.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Healthy reports whether the endpoint may receive traffic.
func (ep *Endpoint) Healthy() bool { return ep.health.Load()&1 != 0 }

// HealthMark returns a token that orders the evidence about the endpoint's
// health: it changes whenever the endpoint is marked down. Read it just
// before sending a probe (a scrape, a request) and hand it back with the
// probe's success (ReportScrape, ReportSuccess): a success whose probe was
// sent before a later failure is older evidence than the failure and does
// not bring the endpoint back. Without the mark, a scrape answered just
// before a pod died but processed after the router's first connect error
// to it would put the dead pod back in rotation until the next failure.
func (ep *Endpoint) HealthMark() uint64 { return ep.health.Load() >> 1 }

// ReportScrape records the result of one scrape, sent when HealthMark
// returned mark: after threshold consecutive failures the endpoint is
// marked unhealthy; a success marks it healthy again unless the endpoint
// was marked down after the scrape was sent. A threshold below 1 is
// treated as 1.
func (ep *Endpoint) ReportScrape(mark uint64, err error, threshold int) {
	if err == nil {
		ep.scrapeFailures.Store(0)
		ep.markUp(mark)
		return
	}
	if int(ep.scrapeFailures.Add(1)) >= max(threshold, 1) {
		ep.MarkDown()
	}
}

// ReportConnectError marks the endpoint unhealthy at once: a refused or reset
// connection is proof, not a hint. The next successful scrape or request
// sent after it brings the endpoint back.
func (ep *Endpoint) ReportConnectError() { ep.MarkDown() }

// ProtocolErrorThreshold is how many answers in a row that served
// nothing, malformed responses (ReportProtocolError) and 5xx statuses
// (ReportServerError) alike, mark an endpoint down.
const ProtocolErrorThreshold = 3

// ReportProtocolError records that the endpoint answered a request with a
// response that is not valid HTTP (a malformed status line or header,
// conflicting Content-Length values, headers over the limit). A pod that
// answers is not proven gone, as one that refuses a connection is, and
// marking it down would also start a new generation and forget its cache:
// one bad answer leaves it in rotation. After ProtocolErrorThreshold of
// them with no successful request in between (ReportSuccess resets the
// count; a successful scrape does not, as a pod can serve /metrics while
// its API answers garbage, or an address can name the wrong service) it
// is marked down, and while the count stands every further one marks it
// down again at once, so a persistently broken pod gets one request per
// scrape that brings it back.
func (ep *Endpoint) ReportProtocolError() { ep.reportFailedAnswer() }

// ReportServerError records that the endpoint answered a request with a
// 5xx status: it is up, but did not serve. A pod whose engine died behind
// a live HTTP server answers every request so, at once, and holds none:
// to a picker that prefers the least loaded it looks the best of all, and
// would draw traffic it can only fail. It counts with ReportProtocolError's
// answers towards ProtocolErrorThreshold in a row, with the same effect:
// marked down, then one request per scrape that brings it back.
func (ep *Endpoint) ReportServerError() { ep.reportFailedAnswer() }

func (ep *Endpoint) reportFailedAnswer() {
	n := ep.protocolErrors.Load()
	if n < ProtocolErrorThreshold {
		n = ep.protocolErrors.Add(1)
	}
	if n >= ProtocolErrorThreshold {
		ep.MarkDown()
	}
}

// ReportSuccess marks the endpoint healthy after it served a request sent
// when HealthMark returned mark, unless it was marked down after that. It
// resets the count of ReportProtocolError and ReportServerError.
func (ep *Endpoint) ReportSuccess(mark uint64) {
	if ep.protocolErrors.Load() != 0 {
		ep.protocolErrors.Store(0)
	}
	ep.markUp(mark)
}

// MarkDown marks the endpoint unhealthy and advances its HealthMark. A
// transition from healthy starts a new generation: whatever was cached
// there may be gone.
func (ep *Endpoint) MarkDown() {
	for {
		h := ep.health.Load()
		if ep.health.CompareAndSwap(h, (h>>1+1)<<1) {
			if h&1 != 0 {
				ep.newGeneration()
			}
			return
		}
	}
}

// markUp marks the endpoint healthy if it has not been marked down since
// HealthMark returned mark.
func (ep *Endpoint) markUp(mark uint64) {
	for {
		h := ep.health.Load()
		if h>>1 != mark || h&1 != 0 || ep.health.CompareAndSwap(h, h|1) {
			return
		}
	}
}

// MarkRestarted starts a new generation without changing health: the scraper
// calls it when the server's counters reset, a sign that the process
// restarted and lost its caches.
func (ep *Endpoint) MarkRestarted() { ep.newGeneration() }

// newGeneration starts a new generation of ep and advances the process-wide
// restart epoch after it, so that a reader who sees the new epoch also sees
// the new generation.
func (ep *Endpoint) newGeneration() {
	ep.generation.Add(1)
	restartEpoch.Add(1)
}

// restartEpoch counts generation changes of every endpoint in the process.
var restartEpoch atomic.Uint64

// RestartEpoch returns a counter that advances whenever any endpoint in the
// process starts a new generation (it went down or restarted). State keyed
// to many endpoints' generations, such as the prefix index, can check it
// once: while it is unchanged, no endpoint's Generation has changed, so
// there is no need to read each of them. It only ever increases.
func RestartEpoch() uint64 { return restartEpoch.Load() }

// Generation counts the times the endpoint went down or restarted. State
// keyed to an endpoint's caches (the prefix index) is stale when the
// generation it was recorded at differs from the current one.
func (ep *Endpoint) Generation() uint64 { return ep.generation.Load() }

// Throughput returns the endpoint's measured prefill throughput in tokens per
// second and whether one has been measured.
func (ep *Endpoint) Throughput() (float64, bool) {
	v := math.Float64frombits(ep.throughput.Load())
	return v, v > 0
}

// SetThroughput publishes a throughput measurement in tokens per second.
// Non-finite or non-positive values clear it, and so do values below
// 1/math.MaxFloat64, whose reciprocal (the seconds per token that scorers
// multiply by) would overflow.
func (ep *Endpoint) SetThroughput(tokensPerSecond float64) {
	if math.IsNaN(tokensPerSecond) || math.IsInf(tokensPerSecond, 0) || tokensPerSecond <= 0 || 1/tokensPerSecond > math.MaxFloat64 {
		ep.throughput.Store(0)
		ep.invThroughput.Store(0)
		return
	}
	// Two stores: a reader may pair one value with the other's previous
	// one, for one pick, until both are published.
	ep.throughput.Store(math.Float64bits(tokensPerSecond))
	ep.invThroughput.Store(math.Float64bits(1 / tokensPerSecond))
}

func clampNonNeg(v float64) float64 {
	if v < 0 || math.IsNaN(v) {
		return 0
	}
	return v
}

func clamp01(v float64) float64 {
	if v < 0 || v != v { // negative or NaN
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}
