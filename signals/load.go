package signals

import "time"

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
}

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
	inFlight := ep.InFlight()
	local := float64(inFlight)
	*dst = Load{
		HalfLife:       halfLife,
		Waiting:        local,
		Running:        local,
		Requests:       local,
		InFlight:       inFlight,
		InFlightTokens: ep.InFlightTokens(),
	}
	m := ep.metrics.Load()
	if m == nil {
		return
	}
	conf := m.confidence(now.UnixNano(), halfLife)
	dst.Confidence = conf
	since := ep.sinceScrape(m)
	if m.Waiting.Known {
		dst.Waiting = correct(m.Waiting, since, local, conf)
	}
	if m.Running.Known {
		dst.Running = correct(m.Running, since, local, conf)
	}
	if r := requestsReading(m); r.Known {
		dst.Requests = correct(r, since, local, conf)
	}
	if m.KVCacheUtilization.Known {
		dst.KV, dst.KVKnown = ep.kvAt(m, conf), true
	}
}
