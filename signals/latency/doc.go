// Package latency predicts, per endpoint and in process, the time to first
// token (TTFT) and the time per output token (TPOT) of a request, learning
// online from the outcomes the picker reports. It is what lets a fleet that
// mixes H100, A100 and L4-class cards route itself: the question is not
// "which queue is shortest" but "where will this request's first token come
// soonest".
//
// # Model
//
// A Predictor keeps, for each endpoint, a linear model of TTFT in six
// explainable features:
//
//	TTFT ≈ θ₀                       fixed overhead (HTTP, scheduling, first step)
//	     + θ₁ · uncached prompt kilotokens of this request
//	     + θ₂ · prefill kilotokens queued ahead of it
//	     + θ₃ · requests in the running batch
//	     + θ₄ · KV-cache utilisation
//	     + θ₅ · [the request's LoRA adapter must be loaded]
//
// The uncached tokens are PromptTokens × (1 − the prefix match on that
// endpoint). The queued work is the uncached tokens this process sent there
// that have not produced a first token yet (Endpoint.Prefilling: requests
// already decoding do not count) plus the scraped waiting requests beyond
// those (Endpoint.QueueDepth less this process's prefilling requests: other
// routers' requests) times the endpoint's mean uncached prompt size. This
// is the physics of a continuous-batching server with chunked prefill
// (vLLM, SGLang): a request's first token comes once the prefill work ahead
// of it and its own have gone through at the card's prefill rate, while
// every running sequence takes a slice of each step (Agrawal et al.,
// "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve",
// OSDI 2024; Kwon et al., "Efficient Memory Management for Large Language
// Model Serving with PagedAttention", SOSP 2023). Being linear in those
// terms, the model extrapolates sensibly to loads it has not seen, and its
// coefficients read as seconds per thousand tokens, seconds per running
// request, seconds to load an adapter (Predictor.Explain). 1000 / θ₁ is the
// endpoint's prefill throughput in tokens per second; the predictor
// publishes it with Endpoint.SetThroughput for the token-load scorer.
//
// TPOT has a smaller model of the same kind: a base step time plus terms in
// the running batch size and KV utilisation, learned from
// (Latency − TTFT) / (CompletionTokens − 1) of streamed responses. A
// response whose body came whole (signals.Outcome.Buffered: a JSON
// completion rather than an SSE stream) teaches TTFT only: its first byte
// came after its last token, so TTFT there is the time to the whole
// answer, which is what such a client waits for, and Latency − TTFT is
// the body's transfer time, not decode time.
//
// The alternatives were weighed. A gradient-boosted model (as in a peer's
// Python sidecar) needs batch training, a feature pipeline and a sidecar,
// and its documentation calls it unfit for mixed pools; it cannot follow a
// pod that slows down between retrainings. A pure drain-rate estimate
// (queued tokens ÷ measured tokens per second) has one parameter and cannot
// separate a fixed overhead, batch interference or an adapter load from the
// prefill rate. Six coefficients per endpoint fitted online is the smallest
// model that has each effect and stays explainable.
//
// # Learning
//
// Coefficients are fitted by exponentially weighted least squares with a
// forgetting factor λ (Config.Forgetting, default 0.97: a memory of about 33
// observations), regularised toward a prior (ridge), re-solved exactly by a
// 6×6 Cholesky factorisation after each observation (see model for the
// method and its citations: Ljung and Söderström 1983; Haykin 2002;
// Gunnarsson 1996). Observations are weighted for relative error, because
// latency noise is multiplicative (Carroll and Ruppert 1988). A request's
// whole update (pairing, both models, the pool prior) costs a few
// microseconds and a prediction on the order of a hundred nanoseconds,
// neither allocating (BenchmarkUpdate, BenchmarkPredict); the ridge term keeps the system
// positive definite, so it cannot wind up or lose definiteness however
// degenerate the inputs, and every feature and target is clamped to a
// finite range, so no input produces NaN.
//
// Least squares gives one observation unbounded influence, so once an
// endpoint's model has Config.FullConfidenceSamples effective observations
// each new one is clipped to within a factor of 4 of the prediction before
// it is folded in (a Huber-type bound; see model's clipRatio): a prefix-cache
// hit its server did not report, an 8 000-token prompt answered in 50 ms,
// no longer makes the endpoint publish a prefill rate hundreds of times its
// real one for the next hundred requests. Before that, the prefill rate
// the predictor publishes (1000 / θ₁, for the prefill and token-load
// scorers, which divide by it at face value) is blended with the pool's in
// proportion to the sample confidence, a negative θ₁ counting as zero,
// because the first few observations cannot separate θ₁ from the constant
// and the queued-work coefficient.
//
// # Cold start and confidence
//
// Before an endpoint has observations its coefficients are the pool's: a
// running average of the speed-normalised coefficients learned on the other
// endpoints, or, before any, a prior of Config.PriorThroughput tokens per
// second. Either is scaled by the endpoint's relative speed from its labels
// (signals.Endpoint.RelativeSpeed: signals.LabelRelativeSpeed, or
// signals.LabelGPU with the speeds of signals.GPURelativeSpeed), so a new
// H100 is expected to be 2.2 times faster than a new A100 from its first
// request. Confidence(ep) in [0, 1] grows with the effective number of
// observations (full at Config.FullConfidenceSamples), fades with the time
// since the last one (so an endpoint that stopped receiving traffic is
// explored again), and is at least Config.PriorConfidence for a labelled
// endpoint. The latency scorer (scorer.LatencyScorer) blends predictions of
// low confidence toward the best candidate's, optimism that makes the picker
// sample an unknown endpoint until the model knows it.
//
// # Drift
//
// With forgetting factor λ, the weight of observations older than k is λ^k
// of the total, so a step change of an endpoint's speed is half absorbed
// after ln 0.5 / ln λ ≈ 23 observations and 90% after 76 for λ = 0.97. On
// the package's synthetic fleet a 4× endpoint that drops to 1× is ranked
// behind a 2× one within 18 to 33 of its observations over 20 seeds (the
// tests bound it by 45).
//
// # Effect
//
// In a closed-loop test (fleet_test.go) the real picker with this predictor
// and the latency scorer alone serves a 1×/2×/4× fleet of FIFO prefill
// queues at 70% load with a mean TTFT of 249 ms, against 310 ms for
// least-in-flight, which keeps feeding the slow card, and 21 s for
// round-robin, which overloads it.
//
// # Wiring
//
// The picker feeds a Predictor as a signals.Observer: Dispatched records
// the features at dispatch (the predictor removes the request's own share
// of the load, which the picker has already counted) in a bounded table
// keyed by request, and Completed pairs them with the outcome. Dispatches
// whose completion never comes are evicted oldest first
// (Config.MaxPending). Failed requests teach nothing.
//
// Requests carry their objectives in signals.Request.SLO;
// ParseSLOHeaders reads them from the x-slo-ttft-ms and x-slo-tpot-ms
// headers.
package latency
