// Package sim is routebench's discrete-event fleet simulator: N pods, each
// an engine model (benchmarks/engine) behind a *signals.Endpoint, an arrival
// stream (benchmarks/workload), metrics scrapes that lag like real ones, and
// the routing policy under test (benchmarks/policy) in the loop, all in
// virtual time.
//
// # Events
//
// One binary heap orders five kinds of events by virtual time (ties in
// scheduling order, so a run is deterministic for a seed): a request's
// arrival, its delivery to the chosen pod after a network delay, the end of
// a pod's engine step, a pod's scrape, and the publication of a scrape's
// result. No goroutine runs in the loop; the library code the policy calls
// reads the virtual time through the injected Clock.
//
// At an arrival the simulator builds a signals.Request: the model, the
// adapter, the prompt's chained block hashes, its token count, the output
// length as max_tokens, priority and session. The hashes are real: each
// content block id of the workload stands for deterministic synthetic text
// (BytesPerToken bytes per token: a tag spelling a SplitMix64 hash of the
// id, then pseudo-words from a fixed corpus), and the request's text is
// hashed with the library's own prefix.Hasher, so the prefix index sees
// what it would see in production. The pod's engine keys its prefix cache
// by the same hashes (engine.Request.PromptHashes: one per 16 tokens, its
// KV block) instead of hashing the prompt a second time.
// The policy picks an endpoint; the request reaches that pod's engine
// NetworkDelay later. The engine's FirstToken event fixes the TTFT (and is
// passed on to the policy's Choice.FirstToken, as a proxy reports the
// first response byte to the picker), its
// Finished event the end-to-end latency, and the policy's Done is called
// then with the outcome (TTFT, latency, prompt, cached and completion
// tokens).
//
// Each pod is scraped every ScrapeInterval (±ScrapeJitter, random phase per
// pod). A scrape takes the endpoint's Counters as the Baseline and the
// engine's Stats (running, waiting, KV usage, LoRA adapters, prefix-cache
// hit rate over the interval, cache geometry) at the moment it is sent, and
// publishes them with Endpoint.SetMetrics ScrapeLatencyMin–Max later, as a
// scraper does after the HTTP round trip.
//
// # Figures
//
// Per run: TTFT mean/p50/p90/p99, TPOT mean/p99, end-to-end mean/p99,
// output tokens per second, goodput (requests per second meeting the SLO)
// and SLO attainment, the servers' prefix-cache hit rate, preemptions, and
// the load imbalance (max/mean requests per pod).
//
// # Capacity and loads
//
// Loads are fractions of the fleet's capacity for the scenario's workload,
// measured by MeasureCapacity: each pod type's saturated throughput on the
// round-robin share of the workload (all requests queued at once, as vLLM's
// benchmark_throughput does), summed over the pods. The suite measures it
// on the first CapacityRequests requests of the scenario's workload, so the
// quick and the default suite offer the same rates.
//
// # Suite
//
// RunSuite runs the default scenarios (DefaultScenarios) at 50%, 70% and
// 90% load with the baseline policies, runs in parallel (each run single
// threaded and deterministic), and returns a Report that WriteTable prints
// and that serialises to JSON.
package sim
