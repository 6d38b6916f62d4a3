// Package emulator serves emulated vLLM pods over real HTTP on loopback
// ports: an OpenAI-compatible API driven by the routebench engine model
// (benchmarks/engine) in wall-clock time, so that the router, the scraper
// and the picker can be tested end to end against servers that queue,
// batch, cache prefixes and slow down like real ones.
//
// # API
//
// A Pod answers, like vLLM's OpenAI server (vllm/entrypoints/openai):
//
//   - POST /v1/chat/completions and /v1/completions, with and without
//     "stream": a streaming response sends one SSE chunk per output token
//     at the engine's pace, a finish chunk, a usage chunk when
//     stream_options.include_usage is true, and "data: [DONE]"; a
//     non-streaming response is one JSON object with its usage;
//   - GET /v1/models: the base model and the loaded LoRA adapters;
//   - GET /health: 200 with an empty body while the pod is up;
//   - GET /metrics: vLLM's Prometheus exposition with the real metric
//     names (vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc, vllm:prefix_cache_hits_total,
//     vllm:prefix_cache_queries_total, vllm:lora_requests_info,
//     vllm:cache_config_info, vllm:time_to_first_token_seconds, …), the
//     names listed in ../shared/fixtures/METRICS.md.
//
// Errors have vLLM's shape {"error":{"message","type","param","code"}}.
//
// # Engine in wall-clock time
//
// Each pod runs one goroutine that plans an engine step (Engine.StartStep),
// sleeps the step's duration divided by Options.Speed, and applies it
// (Engine.FinishStep). A request's prompt is rendered and cut into 64-byte
// blocks with the library's own prompt hasher (signals/prefix), and the
// chained block hashes are the engine's content-block ids (16 tokens per
// block at 4 bytes per token): a repeated prompt prefix hits the engine's
// prefix cache exactly as it would hit vLLM's. The prompt length in tokens
// is the rendered length over 4 bytes, the output length is max_tokens (or
// Options.DefaultMaxTokens). The engine reports only first tokens and
// completions; between them a request in decode gets one token per step,
// which is what vLLM's continuous batching does while the token budget
// covers every running request. A preempted request sends nothing more
// until it finishes. The engine has no abort: a request whose client went
// away keeps running to completion, as it would inside a vLLM step.
//
// # Failures
//
// Faults injects failures, changeable at run time with Pod.SetFaults:
// answering 500 after N requests, hanging, slowing the engine down, and
// cutting streams after N chunks. Pod.Kill closes the listener and every
// connection (new connections are refused, requests in flight are cut) and
// drops the engine's state; Pod.Restart listens again on the same port with
// empty caches and counters, as a restarted vLLM would.
//
// Every server binds 127.0.0.1 only, serves at most Options.MaxRequests
// requests and stops by itself after Options.Lifetime.
package emulator
