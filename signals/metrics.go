package signals

import (
	"math"
	"time"
)

// Reading is one scraped value and whether the server reported it.
// The zero Reading is unknown.
type Reading struct {
	Value float64
	Known bool
}

// Known returns a known Reading of v, or an unknown Reading when v is NaN or
// infinite. Negative values are kept: each consumer clamps to its own range.
func Known(v float64) Reading {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return Reading{}
	}
	return Reading{Value: v, Known: true}
}

// Metrics is an immutable snapshot of what one scrape of an endpoint's
// metrics page said, normalised across model servers. A Metrics is published
// with Endpoint.SetMetrics and must not be modified afterwards: readers on the
// pick path hold it without locks.
type Metrics struct {
	// hot is what the pick path reads, filled in by Endpoint.SetMetrics.
	// It comes first and Metrics is padded to a multiple of 64 bytes, so a
	// published snapshot's hot fields share one cache line.
	hot scrapeSummary

	// ScrapedAt is when the scrape request was sent (not when it returned):
	// the server's values describe that moment at the latest.
	ScrapedAt time.Time
	// Baseline is the endpoint's local accounting (Endpoint.Counters) taken
	// when the scrape request was sent. Work dispatched or completed since
	// then is not in the scraped values, and the signals add it back.
	Baseline Counters

	// Running is the number of requests in the running batch.
	Running Reading
	// Waiting is the number of requests queued and not yet scheduled.
	Waiting Reading
	// KVCacheUtilization is the fraction of KV-cache blocks in use, in [0, 1].
	KVCacheUtilization Reading
	// PrefixCacheHitRate is the server-side prefix-cache hit rate over the
	// last scrape interval, in [0, 1].
	PrefixCacheHitRate Reading

	// LoRAKnown reports whether the server published LoRA adapter state
	// (vLLM's lora_requests_info). When false the adapter fields are empty.
	LoRAKnown bool
	// RunningAdapters and WaitingAdapters are the adapters the server has in
	// its running batch and in its queue.
	RunningAdapters []string
	WaitingAdapters []string
	// MaxLoRA is the number of adapter slots per batch, 0 if unknown.
	MaxLoRA int

	// BlockSize is the KV-cache block size in tokens, 0 if unknown.
	BlockSize int
	// NumBlocks is the number of GPU KV-cache blocks, 0 if unknown.
	NumBlocks int

	// Padding to a multiple of 64 bytes: Go's allocator places objects of
	// such a size class at 64-byte boundaries, which puts hot on one cache
	// line (TestHotFieldsAligned checks it).
	_ [56]byte
}

// scrapeSummary is a snapshot's values in the form the pick path uses,
// computed once per scrape instead of once per pick: 64 bytes, one cache
// line. Unknown readings are NaN.
type scrapeSummary struct {
	scrapedNanos int64   // ScrapedAt.UnixNano(): ages in integer nanoseconds
	waiting      float64 // Waiting clamped to ≥ 0
	running      float64 // Running clamped to ≥ 0
	requests     float64 // the sum of those known (requestsReading)
	kv           float64 // KVCacheUtilization clamped to [0, 1]
	invCap       float64 // 1 / CapacityTokens(), 0 when unknown
	// baseInFlight and baseInFlightTokens are Baseline's dispatched minus
	// completed requests and tokens: the in-flight counts when the scrape
	// was sent. Endpoint keeps its in-flight counters equal to the same
	// differences of its cumulative ones, so the work since the scrape is
	// one subtraction.
	baseInFlight       int64
	baseInFlightTokens int64
}

// invOrZero returns 1/v, or 0 when v is not positive.
func invOrZero(v float64) float64 {
	if v > 0 {
		return 1 / v
	}
	return 0
}

// summarize fills in m.hot from m's exported fields.
func (m *Metrics) summarize() {
	nan := math.NaN()
	h := scrapeSummary{
		scrapedNanos:       m.ScrapedAt.UnixNano(),
		waiting:            nan,
		running:            nan,
		requests:           nan,
		kv:                 nan,
		invCap:             invOrZero(float64(m.CapacityTokens())),
		baseInFlight:       int64(m.Baseline.Dispatched - m.Baseline.Completed),
		baseInFlightTokens: int64(m.Baseline.DispatchedTokens - m.Baseline.CompletedTokens),
	}
	if m.Waiting.Known {
		h.waiting = clampNonNeg(m.Waiting.Value)
	}
	if m.Running.Known {
		h.running = clampNonNeg(m.Running.Value)
	}
	if r := requestsReading(m); r.Known {
		h.requests = r.Value
	}
	if m.KVCacheUtilization.Known {
		h.kv = clamp01(m.KVCacheUtilization.Value)
	}
	m.hot = h
}

// confidence is Confidence for a published snapshot at the instant at.
func (m *Metrics) confidence(at *Instant) float64 {
	if x, ok := m.hot.halfLives(at); ok {
		return exp2Neg(x)
	}
	return 1
}

// halfLives returns the scrape's age at the instant at in half-lives, and
// whether it ages at all: false when the instant has no half-life or is
// not after the scrape (confidence 1). Small enough to be inlined, so that
// ReadLoadsAt's loop makes no call for it.
func (h *scrapeSummary) halfLives(at *Instant) (float64, bool) {
	age := at.nanos - h.scrapedNanos
	return float64(age) * at.inv, at.inv > 0 && age > 0
}

// CapacityTokens returns the KV-cache capacity in tokens, or 0 when the
// server did not publish its cache configuration.
func (m *Metrics) CapacityTokens() int {
	if m == nil || m.BlockSize <= 0 || m.NumBlocks <= 0 {
		return 0
	}
	return m.BlockSize * m.NumBlocks
}

// Counters is the local accounting of one endpoint: what this process
// dispatched to it and saw complete. The counts are cumulative and only grow.
type Counters struct {
	Dispatched       uint64
	Completed        uint64
	DispatchedTokens uint64
	CompletedTokens  uint64
}

// Confidence returns how much a value scraped at scrapedAt is still to be
// trusted at now: 1 when fresh, halving every halfLife, never a cliff.
// A non-positive halfLife means scraped values never age.
func Confidence(scrapedAt, now time.Time, halfLife time.Duration) float64 {
	if halfLife <= 0 {
		return 1
	}
	age := now.Sub(scrapedAt)
	if age <= 0 {
		return 1
	}
	return exp2Neg(float64(age) / float64(halfLife))
}

// exp2Neg returns 2^-x for x ≥ 0 to within 4e-6 relative error, several
// times faster than math.Exp2: it runs once per candidate on the pick
// path, where a confidence needs a few digits, not fifteen. It is exact at
// whole numbers of half-lives.
//
// Its latency, not its throughput, is what a pick waits for (the
// candidate's corrected counts need it), so it avoids the float↔integer
// conversions, several cycles each: adding 1.5·2^52 to x leaves k, x
// rounded to the nearest integer, in the low bits of the sum, which go
// into the result's exponent, and subtracting 1.5·2^52 again gives k as a
// float. 2^-r for the rest, r = x − k in [−½, ½], is a quartic fit
// (least squares on relative error at 400 Chebyshev nodes, constant term
// 1), evaluated in Estrin's form: short independent chains rather than
// one long one.
func exp2Neg(x float64) float64 {
	if !(x < 1022) { // also NaN
		return 0
	}
	const shifter = 0x1.8p52
	kd := x + shifter
	k := uint64(uint32(math.Float64bits(kd))) // round(x), 0 ≤ k ≤ 1022
	r := x - (kd - shifter)                   // in [−½, ½]
	r2 := r * r
	p := (1 - 0.6931219948398278*r) + r2*(0.2402371846310855-0.05591689382501889*r) +
		r2*r2*0.009600395516879948
	return p * math.Float64frombits((1023-k)<<52)
}
