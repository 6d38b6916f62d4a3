// Package picker chooses the model-server endpoint for each inference
// request: filters remove endpoints that cannot serve it, weighted scorers
// rate the rest on live signals, and a strategy picks the winner.
//
// A Picker is built from a Config (YAML or JSON, see ParseConfig) whose
// filter and scorer names are looked up in a scorer.Registry. Pick is safe
// for concurrent use, never blocks on I/O and takes no lock: endpoints and
// configuration are immutable snapshots swapped atomically by SetEndpoints
// and Reconfigure, and the live per-endpoint counters are atomics.
//
// Every successful Pick returns a Result whose Done must be called exactly
// once with the outcome. Done releases the in-flight accounting that keeps
// a burst from piling onto one endpoint between scrapes, marks endpoints
// down on connect errors and up on success, and feeds the outcome to the
// prefix index and the latency predictor (any signals.Observer). The
// Result's Fallbacks and Breakdown live in pooled scratch space and are
// valid until Done; this is what keeps a pick to one allocation.
//
// Time and randomness are injected (WithClock, WithSeed) so that the
// benchmark simulator drives the real picker in virtual time.
package picker
