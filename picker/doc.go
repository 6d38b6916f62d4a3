// Package picker chooses the model-server endpoint for each inference
// request: filters remove endpoints that cannot serve it, weighted scorers
// rate the rest on live signals, and a strategy picks the winner.
//
// A Picker is built from a Config (YAML or JSON, see ParseConfig) whose
// filter and scorer names are looked up in a scorer.Registry. Pick is safe
// for concurrent use and never blocks on I/O. It takes no lock of its own:
// endpoints and configuration are immutable snapshots swapped atomically by
// SetEndpoints and Reconfigure, and the live per-endpoint counters are
// atomics. The signals it calls may lock: with the default sources, the
// prefix index (prefix.Index) takes its read lock in Match (its write lock
// once after an endpoint restart anywhere in the process) and its write
// lock in Dispatched, and the latency predictor (latency.Predictor) takes
// short mutexes in Dispatched (its table of pending dispatches and the
// endpoint's model) and, on an endpoint's first sight, to add its state.
// None is held across I/O; observers added with WithObserver, and custom
// matchers, estimators, filters and scorers, may take their own.
//
// Every successful Pick returns a Result whose Done must be called exactly
// once with the outcome. Done releases the in-flight accounting that keeps
// a burst from piling onto one endpoint between scrapes, marks endpoints
// down on connect errors and up on success (unless the endpoint failed
// after the request was picked: see signals.Endpoint.HealthMark), and feeds
// the outcome to the prefix index and the latency predictor (any
// signals.Observer). The Result's Fallbacks and Breakdown live in pooled
// scratch space and are valid until Done; this is what keeps a pick to one
// allocation.
//
// Time and randomness are injected (WithClock, WithSeed) so that the
// benchmark simulator drives the real picker in virtual time.
package picker
