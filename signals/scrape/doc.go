// Package scrape keeps the scraped half of the signals live: it polls every
// model-server endpoint's Prometheus metrics page and publishes a new
// signals.Metrics snapshot on the endpoint after each good scrape.
//
// # Engine metric maps
//
// A MetricMap says which metric, label selectors and aggregation (sum, max,
// mean) give each signal on one kind of server. Built-in maps cover vLLM V1
// with V0 fallbacks (and llm-d-inference-sim), SGLang, TGI, Triton with the
// TensorRT-LLM backend, and trtllm-serve, with the names documented in
// shared/fixtures/METRICS.md; Config.Engines adds user-defined maps, which
// decode from YAML or JSON. An endpoint picks its map with
// signals.EndpointSpec.Engine ("" means vLLM).
//
// A signal the server does not publish is unknown, never zero. The prefix
// cache hit rate is Δhits / Δqueries between two scrapes (unknown when no
// query happened); a counter that goes down is a counter reset, which marks
// the endpoint restarted (signals.Endpoint.MarkRestarted).
//
// # Parsing
//
// Parser reads the text exposition format with a hand-written line scanner
// that looks only at the families its map names and skips every other line
// after its metric name: no regular expressions, no per-line allocation.
// Parser.ParseFull does the same through a complete prom2json parse; it is
// the reference the fast path is tested and benchmarked against
// (BenchmarkScrapeParse).
//
// # Scraper
//
// Scraper runs one scheduling loop: each endpoint is scraped every interval
// (50 ms by default) with random jitter so that pods are not hit in lockstep,
// with a bounded number of scrapes in flight, a per-request timeout, a cap on
// the bytes read, and exponential backoff while an endpoint keeps failing.
// After FailureThreshold consecutive failures the endpoint is marked
// unhealthy; the first good scrape sent after the last failure (a scrape's
// own, or a connect error the router reported) brings it back. Each scrape
// records its duration and errors, and the age of every endpoint's snapshot
// is observed, through an OpenTelemetry MeterProvider.
//
// Time is read through a signals.Clock and jitter comes from a seeded
// math/rand/v2 source, so results are reproducible; Scraper.Scrape scrapes one
// endpoint synchronously for tests and virtual-time simulators.
package scrape
