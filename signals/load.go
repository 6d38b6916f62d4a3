package signals

import (
	"math"
	"time"
	"unsafe"
)

// Load is one endpoint's load as read once, at one instant, with one
// staleness half-life: every corrected count the scorers of a pick need,
// from a single read of the endpoint's Metrics snapshot and counters.
//
// Each field equals what the matching Endpoint method returns for the same
// now and half-life when nothing changes between the calls (LoadAt reads
// the counters once, so within one Load they are mutually consistent, which
// separate calls racing with dispatches are not). A picker reads one Load
// per candidate and hands it to every filter and scorer, instead of each of
// them recomputing the same blend from the same atomics
// (scorer.Input.Load).
type Load struct {
	// HalfLife is the staleness half-life the values were corrected with.
	HalfLife time.Duration
	// Confidence is the scrape's confidence at the instant read, in [0, 1];
	// 0 when the endpoint has never been scraped.
	Confidence float64
	// Waiting is QueueDepth.
	Waiting float64
	// Running is RunningRequests.
	Running float64
	// Requests is Requests: waiting plus running, corrected once.
	Requests float64
	// KV is KVCacheUtilization when KVKnown; 0 otherwise.
	KV float64
	// KVKnown says whether the server publishes KV-cache utilisation.
	KVKnown bool
	// InFlight is InFlight.
	InFlight int64
	// InFlightTokens is InFlightTokens.
	InFlightTokens int64
	// PrefillRequests and PrefillTokens are Prefilling.
	PrefillRequests, PrefillTokens int64
	// Throughput is Throughput in tokens per second; 0 when not measured.
	Throughput float64
	// InvThroughput is 1/Throughput, 0 when not measured: computed when the
	// throughput is published, so that scorers multiply, not divide.
	InvThroughput float64
	// Recent is RecentDispatches at the instant read.
	Recent float64
	// Speed is RelativeSpeed: the speed the endpoint's labels give, 1
	// without one; SpeedLabelled reports whether a label gave it.
	Speed         float64
	SpeedLabelled bool
}

// PrefillRate is Endpoint.PrefillRate: Throughput when measured, else
// DefaultPrefillRate.
func (l *Load) PrefillRate() float64 {
	if l.Throughput > 0 {
		return l.Throughput
	}
	return DefaultPrefillRate
}

// Instant is a moment and a staleness half-life prepared for reading the
// loads of many endpoints at that moment (Endpoint.ReadLoadAt): the
// conversions ReadLoad would repeat for every endpoint are done once.
type Instant struct {
	halfLife time.Duration
	nanos    int64   // now.UnixNano()
	ms       uint32  // now.UnixMilli(), wrapping
	inv      float64 // 1/halfLife in nanoseconds; 0 when values never age
}

// NewInstant returns the Instant of now with the given half-life; a
// non-positive half-life means scraped values never age.
func NewInstant(now time.Time, halfLife time.Duration) Instant {
	return Instant{halfLife: halfLife, nanos: now.UnixNano(), ms: uint32(now.UnixMilli()), inv: invOrZero(float64(halfLife))}
}

// HalfLife returns the instant's staleness half-life.
func (at *Instant) HalfLife() time.Duration { return at.halfLife }

// LoadAt returns the endpoint's Load at now with the given staleness
// half-life. It is lock-free, does not allocate, and is safe for concurrent
// use.
func (ep *Endpoint) LoadAt(now time.Time, halfLife time.Duration) Load {
	var l Load
	ep.ReadLoad(&l, now, halfLife)
	return l
}

// ReadLoad is LoadAt writing into *dst, for callers that keep Loads in a
// slice and want no copy.
func (ep *Endpoint) ReadLoad(dst *Load, now time.Time, halfLife time.Duration) {
	at := NewInstant(now, halfLife)
	ep.ReadLoadAt(dst, &at)
}

// ReadLoadAt is ReadLoad at a prepared instant: what a caller reading the
// loads of many endpoints at one moment should use (or ReadLoadsAt).
func (ep *Endpoint) ReadLoadAt(dst *Load, at *Instant) {
	ReadLoadsAt(unsafe.Slice(dst, 1), unsafe.Slice(&ep, 1), at)
}

// ReadLoadsAt sets dst[i] to eps[i]'s load at the instant at, for every i
// (len(dst) must be at least len(eps)): ReadLoadAt for a whole pool. The
// loop is in here so that a pool costs no call per endpoint.
func ReadLoadsAt(dst []Load, eps []*Endpoint, at *Instant) {
	dst = dst[:len(eps)]
	for i, ep := range eps {
		dst := &dst[i]
		// The endpoint's counter line, its read-mostly line and the summary
		// line of its snapshot: all a Load needs.
		inFlight := ep.inFlight.Load()
		tokens := ep.inFlightTokens.Load()
		local := float64(max(inFlight, 0))
		// Each field is computed into a local and stored once: a composite
		// literal followed by corrections would be built on the stack, copied
		// and partly overwritten.
		waiting, running, requests := local, local, local
		var conf, kv float64
		kvKnown := false
		if m := ep.metrics.Load(); m != nil {
			h := &m.hot
			// Metrics.confidence and kvAt, from the same inlined parts:
			// the compiler does not inline them whole, and a call per
			// endpoint is a tenth of this loop.
			conf = 1
			if x, ok := h.halfLives(at); ok {
				conf = exp2Neg(x)
			}
			since := float64(inFlight - h.baseInFlight)
			if h.waiting == h.waiting {
				waiting = correct(h.waiting, since, local, conf)
			}
			if h.running == h.running {
				running = correct(h.running, since, local, conf)
			}
			if h.requests == h.requests {
				requests = correct(h.requests, since, local, conf)
			}
			if h.kv == h.kv {
				kv, kvKnown = h.kv, true
				if h.invCap > 0 {
					scraped, local := h.kvParts(tokens)
					kv = blend(scraped, local, conf)
				}
			}
		}
		dst.HalfLife = at.halfLife
		dst.Confidence = conf
		dst.Waiting = waiting
		dst.Running = running
		dst.Requests = requests
		dst.KV = kv
		dst.KVKnown = kvKnown
		dst.InFlight = max(inFlight, 0)
		dst.InFlightTokens = max(tokens, 0)
		dst.PrefillRequests = max(ep.prefilling.Load(), 0)
		dst.PrefillTokens = max(ep.prefillTokens.Load(), 0)
		dst.Throughput = math.Float64frombits(ep.throughput.Load())
		dst.InvThroughput = math.Float64frombits(ep.invThroughput.Load())
		dst.Recent = decayBurst(ep.burst.Load(), at.ms)
		dst.Speed, dst.SpeedLabelled = ep.RelativeSpeed()
	}
}
