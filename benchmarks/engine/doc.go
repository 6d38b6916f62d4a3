// Package engine models one model-server pod (a vLLM V1-like engine) in
// virtual time, for the routebench fleet simulator.
//
// The model follows vLLM V1's scheduler and KV cache manager
// (vllm/v1/core/sched/scheduler.py, vllm/v1/core/kv_cache_manager.py,
// vllm/v1/core/block_pool.py, vllm/v1/core/kv_cache_utils.py):
//
//   - continuous batching: each step first schedules the running requests
//     (one decode token each, or the next prefill chunk), then admits waiting
//     requests in FCFS order with chunked prefill, within a per-step token
//     budget (max_num_batched_tokens) and a cap on running sequences
//     (max_num_seqs);
//   - paged KV blocks of 16 tokens, the number of blocks derived from GPU
//     memory × gpu_memory_utilization minus the model weights, divided by the
//     model's KV bytes per token; when a running request cannot get a block,
//     the newest running request is preempted and later recomputed;
//   - automatic prefix caching of full blocks identified by a hash chain of
//     the prompt content (the LoRA adapter is mixed into the hash), with
//     reference-counted blocks and LRU eviction of unreferenced ones;
//   - LoRA: at most max_loras distinct adapters in a batch, a load time when
//     an adapter is not resident, requests for other adapters waiting for a
//     slot.
//
// A step's duration comes from a per-GPU Profile: a fixed overhead, a dense
// (GEMM) term that is flat at the weight-read time for small batches and
// linear in the batched tokens beyond (a smooth roofline), a further linear
// per-token term (TP all-reduce), a prefill attention term in chunk ×
// context, a decode attention term in KV tokens read, and a
// per-sampled-sequence term. Every coefficient cites the measurement in
// ../shared/perf it was fitted to, or says what it was estimated from.
//
// The simulator drives an Engine with Add, StartStep and FinishStep (a step
// is planned at its start and applied at its end, so a discrete-event loop
// schedules one "step end" event per busy pod), reads the values vLLM
// would export on /metrics with Stats, and models a pod restart with
// InFlight and Reset. PrefixHitTokens answers, without side effects, how
// much of a prompt a pod would serve from its cache (for oracle policies).
// An Engine is not safe for concurrent use; a simulator owns one per pod.
// Steady-state stepping does not allocate.
//
// What the model leaves out: speculative decoding, CUDA-graph padding,
// output-token blocks in the prefix cache (only prompt blocks are hashed,
// since a Request does not carry its output's content), swap-based
// preemption, priorities other than FCFS, and max_model_len checks (a
// request is refused only if it could never fit in the KV cache, or has
// 2³¹-1 tokens or more).
package engine
