package signals

import (
	"net/http"
	"time"
)

// Signal reads one live value for a (request, endpoint) pair.
//
// Value reports the value and whether it is known. An unknown value is never
// reported as zero: a server that does not export a metric, a scrape that
// failed, or a model that has not been trained yet all answer ok == false, and
// scorers decide what unknown means for them.
//
// Implementations must be safe for concurrent use and must not block or
// allocate: they run on the pick path, once per candidate endpoint.
type Signal interface {
	Value(req *Request, ep *Endpoint) (v float64, ok bool)
}

// Request is what the picker knows about one inference request.
//
// The router fills it from the HTTP request; the simulator fills it from a
// trace. All fields are optional: a zero Request is a request for the default
// pool with no prompt information. The picker reads a Request and never
// modifies or retains it after Done.
type Request struct {
	// ID identifies the request in logs and traces. Optional.
	ID string
	// Model is the model name the client asked for (after any rewrite).
	Model string
	// Adapter is the LoRA adapter the request needs, or "" for the base model.
	Adapter string
	// PromptBlocks are the chained hashes of the prompt's fixed-size blocks:
	// PromptBlocks[i] covers blocks 0..i, so two prompts share a prefix of k
	// blocks exactly when their first k hashes are equal.
	PromptBlocks []uint64
	// PromptTokens estimates the prompt length in tokens.
	PromptTokens int
	// MaxOutputTokens is the client's output limit (max_tokens), 0 if unset.
	MaxOutputTokens int
	// Priority orders requests under overload: negative is sheddable,
	// 0 is the default, positive is critical.
	Priority int
	// SessionKey groups the turns of one conversation or one user; optional.
	SessionKey string
	// SLO holds the client's latency objectives; the zero value means none.
	SLO SLO
	// Headers are the request's HTTP headers, for filters and scorers that
	// read hints such as a subset of endpoints or a zone. May be nil.
	Headers http.Header
}

// SLO holds per-request latency objectives. A zero field means no objective.
type SLO struct {
	// TTFT is the time-to-first-token objective.
	TTFT time.Duration
	// TPOT is the time-per-output-token objective.
	TPOT time.Duration
}

// Outcome is what happened to a request sent to an endpoint, reported once
// through the picker's Done callback.
type Outcome struct {
	// Err is non-nil when the request failed. ConnectError marks errors that
	// happened before the endpoint accepted the request (dial refused, reset
	// before any byte), which count against the endpoint's health.
	Err error
	// ConnectError reports that Err is a failure to reach the endpoint.
	ConnectError bool
	// TTFT is the time from dispatch to the first response byte; 0 if unknown.
	TTFT time.Duration
	// Latency is the time from dispatch to the end of the response; 0 if unknown.
	Latency time.Duration
	// PromptTokens, CachedTokens and CompletionTokens come from the
	// response's usage when it carries one; 0 if unknown.
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	// Buffered reports that the response body came whole rather than token
	// by token: a JSON completion, not an SSE stream. Its first byte left
	// the server after the last token, so TTFT includes the decode, and
	// Latency − TTFT is the time the body took to arrive, not the time its
	// tokens took to generate; observers that learn per-token timing skip
	// such outcomes. The zero value (streamed, or unknown) keeps them.
	Buffered bool
	// Generation is the endpoint's Generation when the request was
	// dispatched to it. The picker sets it, replacing whatever the caller
	// of Done gave, before it reports the outcome to its observers, so
	// that they can tell the late completion of a request sent to an
	// earlier generation (before a restart, or before the endpoint went
	// down) from one of the endpoint's current generation.
	Generation uint64
}

// Clock tells the time. The library reads time only through a Clock so that
// the simulator can run it in virtual time and tests are deterministic.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// PrefixMatcher estimates how much of a request's prompt each endpoint
// already holds in its prefix cache.
//
// Match writes into out[i] the fraction in [0, 1] of req.PromptBlocks that
// eps[i] is believed to hold as a leading prefix; len(out) == len(eps). It
// must cost O(len(req.PromptBlocks)) plus O(len(eps)), not their product, must
// not allocate, must not retain eps or out, and must be safe for concurrent
// use.
type PrefixMatcher interface {
	Match(req *Request, eps []*Endpoint, out []float64)
}

// NoPrefixMatcher is the PrefixMatcher used when no prefix index is
// configured: it matches nothing.
type NoPrefixMatcher struct{}

// Match writes 0 for every endpoint.
func (NoPrefixMatcher) Match(_ *Request, _ []*Endpoint, out []float64) {
	clear(out)
}

// LatencyEstimator predicts the time to first token of a request on an
// endpoint.
//
// PredictTTFT returns the prediction in seconds and whether one is available;
// cachedFraction is the fraction of the prompt the endpoint already holds (as
// reported by a PrefixMatcher). It must be safe for concurrent use and must
// not block or allocate.
type LatencyEstimator interface {
	PredictTTFT(req *Request, ep *Endpoint, cachedFraction float64) (seconds float64, ok bool)
}

// NoLatencyEstimator is the LatencyEstimator used when none is configured:
// every prediction is unknown.
type NoLatencyEstimator struct{}

// PredictTTFT reports that no prediction is available.
func (NoLatencyEstimator) PredictTTFT(*Request, *Endpoint, float64) (float64, bool) {
	return 0, false
}

// Observer receives the picker's dispatch and completion events. Stateful
// signal sources (the prefix index, the latency predictor) implement it to
// learn from what the picker did and what happened.
//
// Dispatched is called on the pick path once the endpoint is chosen, and
// Completed from Done with the outcome. Both must be safe for concurrent use
// and must not block.
type Observer interface {
	Dispatched(req *Request, ep *Endpoint)
	Completed(req *Request, ep *Endpoint, out Outcome)
}
