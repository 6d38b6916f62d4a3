package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config configures one Engine. Zero fields take vLLM V1's defaults for the
// profile's GPU, as documented per field.
type Config struct {
	// Profile is the hardware and model step-time profile. Required: a zero
	// Profile fails Validate.
	Profile Profile

	// MaxNumBatchedTokens is the per-step token budget. Zero means vLLM's
	// OpenAI-server default for the GPU: 8192 on GPUs with at least 70 GiB
	// that are not A100s, else 2048 (vllm/engine/arg_utils.py,
	// EngineArgs.get_batch_defaults; see Profile.DefaultMaxNumBatchedTokens).
	MaxNumBatchedTokens int

	// MaxNumSeqs caps the running requests. Zero means vLLM's OpenAI-server
	// default: 1024 on GPUs with at least 70 GiB that are not A100s, else
	// 256 (same source).
	MaxNumSeqs int

	// BlockSize is the KV cache block size in tokens. Zero means 16, vLLM's
	// CUDA default (vllm/config/cache.py, CacheConfig.block_size).
	BlockSize int

	// EnablePrefixCaching turns on automatic prefix caching. vLLM V1
	// enables it by default, but a Go bool's zero value is false, so this
	// is the one field whose zero value is not vLLM's default: set it, or
	// start from DefaultConfig.
	EnablePrefixCaching bool

	// GPUMemoryUtilization is the fraction of GPU memory vLLM may use for
	// weights, activations and KV cache. Zero means 0.9, vLLM's default
	// (vllm/config/cache.py, CacheConfig.gpu_memory_utilization).
	GPUMemoryUtilization float64

	// NumBlocks overrides the KV cache size in blocks. Zero means: derive
	// it from the profile's memory (Profile.NumBlocks).
	NumBlocks int

	// MaxLoRAs is the number of distinct LoRA adapters allowed in one batch
	// (GPU adapter slots). Zero means 1, vLLM's default
	// (vllm/config/lora.py, LoRAConfig.max_loras).
	MaxLoRAs int

	// MaxCPULoRAs is the number of adapters kept loaded in host memory;
	// an adapter outside it costs LoRALoadTime when it enters a batch.
	// Zero means MaxLoRAs, vLLM's default (LoRAConfig.max_cpu_loras).
	MaxCPULoRAs int

	// LoRALoadTime is the time to load an adapter that is not in the CPU
	// cache (read from disk and copy to the GPU), added to the step that
	// first uses it. Zero means DefaultLoRALoadTime.
	LoRALoadTime time.Duration

	// LoRASwapTime is the time to copy an adapter already in the CPU cache
	// into a GPU slot. Zero means DefaultLoRASwapTime.
	LoRASwapTime time.Duration
}

// DefaultLoRALoadTime is an estimate of the time to load a rank-16 LoRA
// adapter of a Llama-3-8B-class model from local disk into a GPU slot. The
// adapter on the q,k,v,o,gate,up,down projections has 32 layers × 16 ×
// (2·(4096+4096) + 2·(4096+1024) + 2·(4096+14336) + (14336+4096)) ≈ 42 M
// parameters (q and o, k and v, gate and up, down), 84 MB in BF16; at
// ~2 GB/s (safetensors read from a local NVMe plus host-to-device copy)
// that is ~40 ms. Estimate, not a measurement.
const DefaultLoRALoadTime = 40 * time.Millisecond

// DefaultLoRASwapTime is an estimate of the time to copy the same 84 MB
// adapter from pinned host memory to the GPU over PCIe 4.0 x16 (~25 GB/s
// effective): ~3.4 ms, rounded to 3 ms. Estimate, not a measurement.
const DefaultLoRASwapTime = 3 * time.Millisecond

// DefaultConfig returns the vLLM V1 OpenAI-server defaults for profile p,
// with prefix caching enabled (V1's default).
func DefaultConfig(p Profile) Config {
	return Config{Profile: p, EnablePrefixCaching: true}
}

// Request is one inference request as the engine sees it. The engine keeps
// the pointer until the request finishes (or Reset) and does not modify
// the Request; the caller must not modify it while the engine holds it.
type Request struct {
	// ID identifies the request to the caller; the engine does not use
	// it (prompt tokens beyond Blocks are never hashed, so they need no
	// unique key).
	ID uint64
	// Blocks is the prompt content as a sequence of content-block ids:
	// equal ids at equal positions after equal prefixes are equal text, so
	// shared leading ids are a shared prefix. Each id stands for BlockTokens
	// tokens. Prompt tokens beyond len(Blocks)×BlockTokens are unique to the
	// request and never hit the prefix cache.
	Blocks []uint64
	// BlockTokens is the number of tokens per content block (e.g. 16, or
	// 512 for Mooncake hash_ids). Zero means the engine's BlockSize.
	BlockTokens int
	// PromptTokens is the total number of prompt tokens (>=1); the last
	// content block may be partial.
	PromptTokens int
	// OutputTokens is the number of tokens to generate (>=1).
	OutputTokens int
	// Adapter is the LoRA adapter name, or "" for the base model.
	Adapter string
	// PromptHashes optionally carries the prompt's prefix hashes as the
	// caller computed them (a gateway hashes prompts too):
	// PromptHashes[j] identifies the adapter and the first (j+1)·HashTokens
	// tokens of the prompt's content blocks, so equal prefixes have equal
	// hashes and different ones different hashes. When HashTokens equals
	// the engine's BlockSize, no hash is 0 and there is one for every full
	// KV block inside the content blocks, the engine uses them as its
	// prefix-cache keys instead of hashing Blocks itself (which gives the
	// same hits, up to 64-bit collisions). The engine keeps the slice
	// while it holds the Request.
	PromptHashes []uint64
	// HashTokens is the number of tokens per entry of PromptHashes.
	HashTokens int
}

// EventKind says what happened to a request.
type EventKind uint8

const (
	// FirstToken: the request's prefill completed and its first output
	// token was produced at Event.At (its TTFT is At minus its arrival).
	FirstToken EventKind = iota + 1
	// Finished: the request produced its last output token at Event.At and
	// left the engine. The engine no longer references the Request.
	Finished
	// Preempted: the request was preempted (its KV blocks freed, to be
	// recomputed later) by the step starting at Event.At. It stays in the
	// engine and will produce a Finished event.
	Preempted
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case FirstToken:
		return "FirstToken"
	case Finished:
		return "Finished"
	case Preempted:
		return "Preempted"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event reports a change in one request's state.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Req is the request it happened to (the pointer given to Add).
	Req *Request
	// At is the virtual time of the event.
	At time.Duration
	// CachedTokens is, for FirstToken and Finished, the number of prompt
	// tokens served from the prefix cache when the request was first
	// scheduled.
	CachedTokens int
	// Preemptions is, for Finished, how many times the request was
	// preempted.
	Preemptions int
}

// Stats are the values vLLM exports on /metrics, read at one instant.
type Stats struct {
	// Running is vllm:num_requests_running.
	Running int
	// Waiting is vllm:num_requests_waiting (preempted requests included).
	Waiting int
	// KVCacheUsage is vllm:kv_cache_usage_perc, a fraction in [0,1]: one
	// minus free blocks over all blocks, where cached blocks that no
	// request references count as free (vllm/v1/core/block_pool.py,
	// BlockPool.get_usage).
	KVCacheUsage float64
	// RunningAdapters and WaitingAdapters are the running_lora_adapters
	// and waiting_lora_adapters labels of vllm:lora_requests_info, in
	// order of first appearance. Fresh slices owned by the caller.
	RunningAdapters []string
	WaitingAdapters []string
	// MaxLoRA is the max_lora label of vllm:lora_requests_info.
	MaxLoRA int
	// PrefixQueries and PrefixHits are vllm:prefix_cache_queries and
	// vllm:prefix_cache_hits: cumulative prompt tokens looked up and found
	// in the prefix cache when requests were first scheduled.
	PrefixQueries, PrefixHits uint64
	// NumBlocks and BlockSize are vllm:cache_config_info's num_gpu_blocks
	// and block_size.
	NumBlocks, BlockSize int
	// Preemptions is vllm:num_preemptions, cumulative.
	Preemptions uint64
	// Steps is the number of steps executed, cumulative.
	Steps uint64
	// GeneratedTokens and PromptTokens are vllm:generation_tokens and
	// vllm:prompt_tokens, cumulative (prompt tokens counted once per
	// request, when it is first scheduled).
	GeneratedTokens, PromptTokens uint64
}

// ErrTooLarge is returned by Add for a request whose KV cannot fit in the
// whole KV cache: its prompt and every output token but the last (which is
// sampled and never fed back), PromptTokens+OutputTokens-1 tokens. Such a
// request could never run. It is also returned for a request of 2³¹-1
// tokens or more, beyond the engine's token counters.
var ErrTooLarge = errors.New("engine: request does not fit in the KV cache")

// ErrInvalid is returned by Add for a request with PromptTokens < 1 or
// OutputTokens < 1.
var ErrInvalid = errors.New("engine: request needs PromptTokens >= 1 and OutputTokens >= 1")

// seq is the engine's state of one request (vllm/v1/request.py, Request).
// Every field a decode step reads lies in its first 64 bytes, one cache
// line: the simulator is bound by memory accesses per running request and
// step. Token counts are int32 for that (a prompt has far fewer than 2³¹
// tokens).
type seq struct {
	numTokens   int32    // prompt tokens + generated tokens so far
	numComputed int32    // tokens whose KV is computed (or scheduled this step)
	generated   int32    // output tokens produced
	output      int32    // req.OutputTokens
	numCached   int32    // leading entries of blocks registered in the prefix cache (or found there)
	numHashes   int32    // len(hashes)
	adapter     int32    // index into Engine.adapters, -1 for none
	holder      int32    // the block holding hashes[numCached-1], plus one (see cacheFull)
	firstDone   bool     // FirstToken reported
	started     bool     // scheduled at least once (prefix stats counted)
	blocks      []int32  // block table
	hashes      []uint64 // hash chain of the cacheable full prompt blocks: own or the Request's PromptHashes
	own         []uint64 // the seq's own buffer for hashes
	req         *Request
	cachedHit   int // prompt tokens hit on first schedule
	preemptions int
}

// Engine is one simulated vLLM V1-like pod. It is not safe for concurrent
// use. The zero value is not usable; call New.
type Engine struct {
	cfg       Config
	prof      Profile
	budget    int
	maxSeqs   int
	blockSize int

	pool blockPool

	waiting  deque
	running  []*seq
	free     []*seq // recycled seq structs
	sched    []*seq // scheduled in the planned step, in order
	preempts []*seq // preempted while planning the step
	inStep   bool
	stepAt   time.Duration

	// LoRA bookkeeping; adapter ids index these slices.
	adapterIdx   map[string]int32
	adapters     []string
	runningCount []int32 // running requests per adapter
	waitingCount []int32
	gpuLoRA      lru
	cpuLoRA      lru
	batchLoRAs   []int32 // scratch: distinct adapters in the planned step
	loraMark     []uint64
	loraEpoch    uint64

	work    stepWork
	hits    []int32 // scratch: prefix-cache hits of the request being admitted
	scratch seq     // scratch for PrefixHitTokens

	stats Stats
}

// Validate reports whether New accepts cfg: a profile is set, no size is
// negative, GPUMemoryUtilization is in [0, 1], and the KV cache gets at
// least one block. The error wraps ErrConfig.
func (cfg Config) Validate() error {
	p := cfg.Profile
	switch {
	case p.Name == "" || p.Layers <= 0:
		return fmt.Errorf("%w: Profile is required", ErrConfig)
	case cfg.MaxNumBatchedTokens < 0, cfg.MaxNumSeqs < 0, cfg.BlockSize < 0, cfg.NumBlocks < 0,
		cfg.MaxLoRAs < 0, cfg.MaxCPULoRAs < 0, cfg.LoRALoadTime < 0, cfg.LoRASwapTime < 0:
		return fmt.Errorf("%w: negative size or time", ErrConfig)
	case cfg.NumBlocks > maxBlocks:
		return fmt.Errorf("%w: NumBlocks %d above %d", ErrConfig, cfg.NumBlocks, maxBlocks)
	case !(cfg.GPUMemoryUtilization >= 0 && cfg.GPUMemoryUtilization <= 1):
		return fmt.Errorf("%w: GPUMemoryUtilization %v not in [0, 1]", ErrConfig, cfg.GPUMemoryUtilization)
	}
	if cfg.NumBlocks == 0 {
		util, bs := cfg.GPUMemoryUtilization, cfg.BlockSize
		if util == 0 {
			util = 0.9
		}
		if bs == 0 {
			bs = 16
		}
		if n := p.NumBlocks(util, bs); n < 1 || n > maxBlocks {
			return fmt.Errorf("%w: profile %s gives %d KV blocks, want 1…%d", ErrConfig, p.Name, n, maxBlocks)
		}
	}
	return nil
}

// ErrConfig is wrapped by the errors of Config.Validate.
var ErrConfig = errors.New("engine: invalid Config")

// New returns an Engine for cfg, empty, at virtual time zero. It panics
// with the error of cfg.Validate if that is not nil (call Validate first
// for untrusted configurations).
func New(cfg Config) *Engine {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	p := cfg.Profile
	tokens, seqs := p.batchDefaults()
	if cfg.MaxNumBatchedTokens == 0 {
		cfg.MaxNumBatchedTokens = tokens
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = seqs
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.GPUMemoryUtilization == 0 {
		cfg.GPUMemoryUtilization = 0.9
	}
	if cfg.NumBlocks == 0 {
		cfg.NumBlocks = p.NumBlocks(cfg.GPUMemoryUtilization, cfg.BlockSize)
	}
	if cfg.MaxLoRAs == 0 {
		cfg.MaxLoRAs = 1
	}
	if cfg.MaxCPULoRAs < cfg.MaxLoRAs {
		cfg.MaxCPULoRAs = cfg.MaxLoRAs
	}
	if cfg.LoRALoadTime == 0 {
		cfg.LoRALoadTime = DefaultLoRALoadTime
	}
	if cfg.LoRASwapTime == 0 {
		cfg.LoRASwapTime = DefaultLoRASwapTime
	}
	e := &Engine{
		cfg:        cfg,
		prof:       p,
		budget:     cfg.MaxNumBatchedTokens,
		maxSeqs:    cfg.MaxNumSeqs,
		blockSize:  cfg.BlockSize,
		adapterIdx: make(map[string]int32),
	}
	e.pool.init(cfg.NumBlocks)
	e.gpuLoRA.init(cfg.MaxLoRAs)
	e.cpuLoRA.init(cfg.MaxCPULoRAs)
	e.stats.NumBlocks = cfg.NumBlocks
	e.stats.BlockSize = cfg.BlockSize
	e.stats.MaxLoRA = cfg.MaxLoRAs
	return e
}

// Config returns the effective configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Add enqueues r at virtual time now at the tail of the waiting queue. It
// returns ErrInvalid or ErrTooLarge (and does not enqueue) for a request
// that could never run. Add may be called while a step is planned; the
// request is considered from the next StartStep. now is accepted for
// symmetry with the other methods and for future use; the engine keeps no
// arrival times (the caller measures TTFT from its own record).
func (e *Engine) Add(now time.Duration, r *Request) error {
	_ = now
	if r.PromptTokens < 1 || r.OutputTokens < 1 {
		return ErrInvalid
	}
	// The request's KV peaks at PromptTokens+OutputTokens-1 tokens, in
	// at most limit tokens; compared without overflow.
	limit := math.MaxInt32 - 1
	if e.blockSize <= limit/e.pool.numBlocks {
		limit = e.pool.numBlocks * e.blockSize
	}
	if r.PromptTokens > limit || r.OutputTokens-1 > limit-r.PromptTokens {
		return ErrTooLarge
	}
	s := e.newSeq(r)
	e.waiting.pushBack(s)
	if s.adapter >= 0 {
		e.waitingCount[s.adapter]++
	}
	return nil
}

func (e *Engine) newSeq(r *Request) *seq {
	var s *seq
	if n := len(e.free); n > 0 {
		s = e.free[n-1]
		e.free = e.free[:n-1]
		blocks, own := s.blocks[:0], s.own[:0]
		*s = seq{blocks: blocks, own: own}
	} else {
		s = &seq{}
	}
	s.req = r
	s.numTokens = int32(r.PromptTokens)
	s.output = int32(r.OutputTokens)
	s.adapter = -1
	if r.Adapter != "" {
		s.adapter = e.adapterID(r.Adapter)
	}
	e.hashPrompt(s)
	return s
}

func (e *Engine) adapterID(name string) int32 {
	if id, ok := e.adapterIdx[name]; ok {
		return id
	}
	id := int32(len(e.adapters))
	e.adapterIdx[name] = id
	e.adapters = append(e.adapters, name)
	e.runningCount = append(e.runningCount, 0)
	e.waitingCount = append(e.waitingCount, 0)
	e.loraMark = append(e.loraMark, 0)
	return id
}

// Idle reports whether nothing is running or waiting (a planned step, if
// any, still needs its FinishStep).
func (e *Engine) Idle() bool { return len(e.running) == 0 && e.waiting.len() == 0 }

// StartStep plans one step at virtual time now, as vLLM V1's
// Scheduler.schedule does (vllm/v1/core/sched/scheduler.py): running
// requests first in order (one decode token each, or their next prefill
// chunk), preempting the newest running request when KV blocks run out;
// then, if nothing was preempted, waiting requests in FCFS order with
// chunked prefill, while the token budget, max_num_seqs, free blocks and
// LoRA slots allow. A waiting request whose blocks do not fit stops
// admission (head-of-line, as in vLLM); one whose adapter would exceed
// max_loras is skipped and keeps its place. It returns the step's duration;
// the caller must call FinishStep at now+d. ok is false (and no step is
// planned) when nothing can be scheduled. StartStep panics if a step is
// already planned. It does not allocate in steady state.
func (e *Engine) StartStep(now time.Duration) (d time.Duration, ok bool) {
	if e.inStep {
		panic("engine: StartStep called twice without FinishStep")
	}
	e.sched = e.sched[:0]
	e.loraEpoch++
	e.batchLoRAs = e.batchLoRAs[:0]
	e.work = stepWork{}
	budget := e.budget

	// Running requests ("First, schedule the RUNNING requests").
	preempted := false
	sched := e.sched
	decodes, decodeKV := 0, 0 // plain decode tokens, summed here rather than by account
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(int(s.numTokens-s.numComputed), budget)
		if n <= 0 {
			continue
		}
		// Most steps of a decoding request need no new block and have no
		// block left to register: then allocate would do nothing.
		noop := int(s.numComputed)+n <= len(s.blocks)*e.blockSize && s.numCached >= s.numHashes
		if noop && s.numComputed == s.numTokens-1 && s.generated > 0 && s.adapter < 0 {
			// A plain decode token (n is 1): what account does for it.
			decodes++
			decodeKV += int(s.numTokens)
			s.numComputed++
			sched = append(sched, s)
			budget--
			continue
		}
		e.sched = sched
		for !noop && !e.allocate(s, n) {
			// Preempt the lowest-priority running request: under FCFS the
			// newest, the tail of the running list.
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		budget -= n
		e.account(s, n)
		sched = e.sched
	}
	e.sched = sched
	e.work.tokens += decodes
	e.work.samples += decodes
	e.work.decodeKV += decodeKV

	// Waiting requests, FCFS, only when nothing was preempted.
	if !preempted {
		skipped := 0 // requests kept at the head because of LoRA slots
		for budget > 0 && len(e.running) < e.maxSeqs && skipped < e.waiting.len() {
			s := e.waiting.at(skipped)
			if s.adapter >= 0 && e.loraMark[s.adapter] != e.loraEpoch && len(e.batchLoRAs) >= e.cfg.MaxLoRAs {
				skipped++
				continue
			}
			n, ok := e.admit(s, budget)
			if !ok {
				break
			}
			e.waiting.removeAt(skipped)
			if s.adapter >= 0 {
				e.waitingCount[s.adapter]--
				e.runningCount[s.adapter]++
			}
			if !s.started {
				s.started = true
				e.stats.PrefixQueries += uint64(s.req.PromptTokens)
				e.stats.PrefixHits += uint64(s.cachedHit)
				e.stats.PromptTokens += uint64(s.req.PromptTokens)
			}
			e.running = append(e.running, s)
			budget -= n
			e.account(s, n)
		}
	}
	if len(e.sched) == 0 && len(e.preempts) == 0 {
		return 0, false
	}
	if len(e.sched) > 0 {
		w := e.work
		d = e.prof.StepTime(w.tokens, w.prefillPairs, w.decodeKV, w.samples) + w.loraLoad
	}
	e.inStep = true
	e.stepAt = now
	return d, true
}

// stepWork is the work of the planned step, the inputs of Profile.StepTime.
type stepWork struct {
	tokens       int     // batched tokens
	prefillPairs float64 // Σ chunk × (context before chunk + chunk/2)
	decodeKV     int     // Σ KV tokens read by decode tokens
	samples      int     // sequences producing a token
	loraLoad     time.Duration
}

// account adds n scheduled tokens of s to the planned step.
func (e *Engine) account(s *seq, n int) {
	w := &e.work
	w.tokens += n
	if n == 1 && s.generated > 0 && s.numComputed == s.numTokens-1 {
		w.decodeKV += int(s.numTokens)
	} else {
		w.prefillPairs += float64(n) * (float64(s.numComputed) + float64(n)/2)
	}
	if int(s.numComputed)+n == int(s.numTokens) {
		w.samples++
	}
	s.numComputed += int32(n)
	e.sched = append(e.sched, s)
	if s.adapter >= 0 {
		w.loraLoad += e.useLoRA(s.adapter)
	}
}

// useLoRA marks adapter a as in the planned batch and returns the time it
// costs: zero when it is in a GPU slot, LoRASwapTime when it is in the CPU
// cache, LoRALoadTime otherwise.
func (e *Engine) useLoRA(a int32) time.Duration {
	if e.loraMark[a] == e.loraEpoch {
		return 0
	}
	e.loraMark[a] = e.loraEpoch
	e.batchLoRAs = append(e.batchLoRAs, a)
	inCPU := e.cpuLoRA.touch(a)
	if !inCPU {
		e.cpuLoRA.add(a, e.loraMark, e.loraEpoch)
	}
	if e.gpuLoRA.touch(a) {
		return 0
	}
	e.gpuLoRA.add(a, e.loraMark, e.loraEpoch)
	if inCPU {
		return e.cfg.LoRASwapTime
	}
	return e.cfg.LoRALoadTime
}

// FinishStep applies the step planned by StartStep, at virtual time now
// (its start plus its duration), and appends the resulting events to out:
// Preempted events (At = the step's start) first, then FirstToken and
// Finished events in batch order. It returns out. Calling it with no step
// planned (or after Reset dropped the planned step) only returns out.
func (e *Engine) FinishStep(now time.Duration, out []Event) []Event {
	if !e.inStep {
		return out
	}
	e.inStep = false
	e.stats.Steps++
	for _, s := range e.preempts {
		out = append(out, Event{Kind: Preempted, Req: s.req, At: e.stepAt})
	}
	e.preempts = e.preempts[:0]
	finished := false
	generated := 0
	for _, s := range e.sched {
		if s.numComputed < s.numTokens {
			continue // partial prefill chunk
		}
		s.generated++
		s.numTokens++
		generated++
		if !s.firstDone {
			s.firstDone = true
			out = append(out, Event{Kind: FirstToken, Req: s.req, At: now, CachedTokens: s.cachedHit})
		}
		if s.generated >= s.output {
			out = append(out, Event{Kind: Finished, Req: s.req, At: now, CachedTokens: s.cachedHit, Preemptions: s.preemptions})
			s.numTokens = -1 // mark for removal
			finished = true
		}
	}
	e.stats.GeneratedTokens += uint64(generated)
	e.sched = e.sched[:0]
	if finished {
		j := 0
		for _, s := range e.running {
			if s.numTokens >= 0 {
				e.running[j] = s
				j++
				continue
			}
			e.freeBlocks(s)
			if s.adapter >= 0 {
				e.runningCount[s.adapter]--
			}
			s.req, s.hashes = nil, nil
			e.free = append(e.free, s)
		}
		clear(e.running[j:])
		e.running = e.running[:j]
	}
	return out
}

// preempt frees s's blocks and puts it at the head of the waiting queue,
// to be recomputed (vLLM V1 preempts by recompute: scheduler.py,
// Scheduler._preempt_request).
func (e *Engine) preempt(s *seq) {
	e.freeBlocks(s)
	s.numComputed = 0
	s.preemptions++
	e.stats.Preemptions++
	if s.adapter >= 0 {
		e.runningCount[s.adapter]--
		e.waitingCount[s.adapter]++
	}
	e.waiting.pushFront(s)
	e.preempts = append(e.preempts, s)
}

// Stats returns the current metric values. The adapter slices are fresh
// and owned by the caller.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Running = len(e.running)
	st.Waiting = e.waiting.len()
	st.KVCacheUsage = 1 - float64(e.pool.numFree)/float64(e.pool.numBlocks)
	for i, name := range e.adapters {
		if e.runningCount[i] > 0 {
			st.RunningAdapters = append(st.RunningAdapters, name)
		}
		if e.waitingCount[i] > 0 {
			st.WaitingAdapters = append(st.WaitingAdapters, name)
		}
	}
	return st
}

// InFlight appends every request in the engine (running first, then
// waiting in queue order) to dst and returns it. Call it before Reset to
// learn which requests a restart loses.
func (e *Engine) InFlight(dst []*Request) []*Request {
	for _, s := range e.running {
		dst = append(dst, s.req)
	}
	for i := 0; i < e.waiting.len(); i++ {
		dst = append(dst, e.waiting.at(i).req)
	}
	return dst
}

// Reset models a pod restart: every running and waiting request is dropped
// without an event (use InFlight first to fail them), the planned step is
// discarded, the KV and prefix caches and the LoRA caches are emptied and
// the adapters seen are forgotten. Cumulative counters (prefix
// hits/queries, preemptions, steps, tokens) restart from zero, as a
// restarted vLLM's do. A reset Engine behaves as one New returns for its
// Config, and keeps its buffers, so a simulator can reuse it for another
// run without allocating.
func (e *Engine) Reset() {
	for _, s := range e.running {
		s.req, s.hashes = nil, nil
		e.free = append(e.free, s)
	}
	clear(e.running)
	e.running = e.running[:0]
	for e.waiting.len() > 0 {
		s := e.waiting.popFront()
		s.req, s.hashes = nil, nil
		e.free = append(e.free, s)
	}
	clear(e.sched)
	e.sched = e.sched[:0]
	clear(e.preempts)
	e.preempts = e.preempts[:0]
	e.inStep = false
	e.pool.init(e.pool.numBlocks)
	e.gpuLoRA.init(e.cfg.MaxLoRAs)
	e.cpuLoRA.init(e.cfg.MaxCPULoRAs)
	clear(e.adapterIdx)
	clear(e.adapters)
	e.adapters = e.adapters[:0]
	e.runningCount = e.runningCount[:0]
	e.waitingCount = e.waitingCount[:0]
	e.loraMark = e.loraMark[:0]
	e.batchLoRAs = e.batchLoRAs[:0]
	e.stats = Stats{NumBlocks: e.pool.numBlocks, BlockSize: e.blockSize, MaxLoRA: e.cfg.MaxLoRAs}
}
