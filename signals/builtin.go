package signals

import "time"

// Staleness says how the signals read time and how fast scraped values age.
// The zero value reads the system clock and never ages scraped values.
type Staleness struct {
	// Clock is the time source; nil means SystemClock.
	Clock Clock
	// HalfLife is the age at which a scraped value's confidence halves;
	// 0 means scraped values never age.
	HalfLife time.Duration
}

// Now returns the current time from the configured clock.
func (s Staleness) Now() time.Time {
	if s.Clock == nil {
		return time.Now()
	}
	return s.Clock.Now()
}

// The six signals. Each is a small value type; compile-time guards below.
var (
	_ Signal = KVCacheUtilization{}
	_ Signal = QueueDepth{}
	_ Signal = RunningRequests{}
	_ Signal = LoRAAffinity{}
	_ Signal = PrefixCacheHit{}
	_ Signal = PredictedLatency{}
)

// KVCacheUtilization is the fraction of the endpoint's KV cache in use, in
// [0, 1], corrected for work dispatched since the scrape (see
// Endpoint.KVCacheUtilization). Unknown when the server does not publish it.
type KVCacheUtilization struct{ Staleness }

// Value implements Signal.
func (s KVCacheUtilization) Value(_ *Request, ep *Endpoint) (float64, bool) {
	return ep.KVCacheUtilization(s.Now(), s.HalfLife)
}

// QueueDepth is the number of requests waiting on the endpoint (see
// Endpoint.QueueDepth). Always known: without a scrape it is the local
// in-flight count.
type QueueDepth struct{ Staleness }

// Value implements Signal.
func (s QueueDepth) Value(_ *Request, ep *Endpoint) (float64, bool) {
	return ep.QueueDepth(s.Now(), s.HalfLife), true
}

// RunningRequests is the size of the endpoint's running batch (see
// Endpoint.RunningRequests). Always known, like QueueDepth.
type RunningRequests struct{ Staleness }

// Value implements Signal.
func (s RunningRequests) Value(_ *Request, ep *Endpoint) (float64, bool) {
	return ep.RunningRequests(s.Now(), s.HalfLife), true
}

// LoRAAffinity is the endpoint's readiness to serve the request's adapter as
// a Residency level (0 unknown … 4 running). Unknown when the server
// publishes no adapter state and the adapter was not routed there recently.
type LoRAAffinity struct{ Staleness }

// Value implements Signal.
func (s LoRAAffinity) Value(req *Request, ep *Endpoint) (float64, bool) {
	r := ep.LoRAResidency(req.Adapter, s.Now())
	return float64(r), r != ResidencyUnknown
}

// PrefixCacheHit is the fraction of the request's prompt that the endpoint is
// expected to hold in its prefix cache, in [0, 1], from Matcher. A nil
// Matcher matches nothing. Always known (an empty index is a known zero).
type PrefixCacheHit struct {
	Matcher PrefixMatcher
}

// Value implements Signal.
func (s PrefixCacheHit) Value(req *Request, ep *Endpoint) (float64, bool) {
	return prefixFraction(s.Matcher, req, ep), true
}

func prefixFraction(m PrefixMatcher, req *Request, ep *Endpoint) float64 {
	if m == nil || len(req.PromptBlocks) == 0 {
		return 0
	}
	eps := [1]*Endpoint{ep}
	var out [1]float64
	m.Match(req, eps[:], out[:])
	return clamp01(out[0])
}

// PredictedLatency is the predicted time to first token of the request on
// the endpoint, in seconds, from Estimator given the prefix Matcher's match.
// Unknown when the estimator has no prediction; a nil Estimator never has one.
type PredictedLatency struct {
	Matcher   PrefixMatcher
	Estimator LatencyEstimator
}

// Value implements Signal.
func (s PredictedLatency) Value(req *Request, ep *Endpoint) (float64, bool) {
	if s.Estimator == nil {
		return 0, false
	}
	v, ok := s.Estimator.PredictTTFT(req, ep, prefixFraction(s.Matcher, req, ep))
	if !ok || v != v || v < 0 {
		return 0, false
	}
	return v, true
}
