package engine

import (
	"math"
	"strings"
	"time"
)

// Profile is the step-time and memory model of one model on one kind of
// GPU (or TP group). A step that batches N tokens takes
//
//	Overhead + Layers·√(DenseFloor² + (DensePerToken·N)²) + PerToken·N
//	  + PrefillAttn·P + DecodeAttn·K + PerSample·S
//
// where P = Σ over prefill chunks of chunk × (context before the chunk +
// chunk/2) (the query×key pairs of causal attention), K = Σ over decode
// tokens of the KV tokens they read, and S = the sequences that sample a
// token. The dense term is a smooth roofline of the per-layer GEMMs
// (QKV, O, gate/up, down projections, norms, activation): flat at the
// weight-read time for small batches, linear in tokens when compute-bound;
// it is fitted to Vidur's per-operator profiles, which it matches within a
// few percent from 64 to 8192 tokens. Every coefficient below cites the
// file in ../shared/perf it comes from, or says what it is estimated from.
//
// Profile is a plain value; copies are independent.
type Profile struct {
	// Name is the profile's key, e.g. "h100-llama3-8b".
	Name string
	// GPU and Model describe the hardware and model; TP is the tensor
	// parallel degree (number of GPUs).
	GPU, Model string
	TP         int
	// Layers is the number of transformer layers.
	Layers int

	// GPUMemoryGiB is the memory of one GPU (nvidia-smi total).
	GPUMemoryGiB float64
	// WeightGiB is the whole model's BF16 weights, split evenly over TP.
	WeightGiB float64
	// ReserveGiB is per-GPU memory vLLM keeps out of the KV cache
	// (activation peak of the profiling run, CUDA graphs, non-torch
	// allocations). An estimate for every profile.
	ReserveGiB float64
	// KVBytesPerToken is the whole model's K and V bytes per token:
	// layers × KV heads × head dim × 2 (K,V) × 2 bytes; split over TP.
	KVBytesPerToken int

	// DefaultMaxNumBatchedTokens and DefaultMaxNumSeqs are vLLM's
	// OpenAI-server defaults on this GPU (vllm/engine/arg_utils.py,
	// EngineArgs.get_batch_defaults: 8192 and 1024 on GPUs with at least
	// 70 GiB that are not A100s, else 2048 and 256). Zero means: that
	// rule applied to GPUMemoryGiB and GPU.
	DefaultMaxNumBatchedTokens, DefaultMaxNumSeqs int

	// OverheadUS is the fixed time of a step in µs: CPU scheduling and
	// launch overhead (CPUOverheadUS), the lm_head weight read and the
	// sampler, and for TP groups the all-reduce latency.
	OverheadUS float64
	// CPUOverheadUS is the part of OverheadUS spent on the host, not on
	// the GPU (kept separate so that GPU-only measurements can be
	// compared with the model).
	CPUOverheadUS float64
	// DenseFloorUS and DensePerTokenUS are the per-layer dense time at one
	// token (weight-read bound) and its per-token slope when compute
	// bound, in µs.
	DenseFloorUS, DensePerTokenUS float64
	// PerTokenUS is a further per-batched-token cost in µs (the TP
	// all-reduce volume for TP groups; zero for one GPU).
	PerTokenUS float64
	// PrefillAttnNS is the whole model's prefill attention time per
	// query×key pair, in ns.
	PrefillAttnNS float64
	// DecodeAttnNS is the whole model's decode attention time per KV token
	// read, in ns.
	DecodeAttnNS float64
	// PerSampleUS is the lm_head/sampler time per sampled sequence, in µs.
	PerSampleUS float64
}

// StepTime returns the duration of a step that batches tokens tokens with
// prefillPairs prefill attention pairs, decodeKV decode KV tokens read and
// samples sampling sequences (see Profile). It is pure and cheap.
func (p *Profile) StepTime(tokens int, prefillPairs float64, decodeKV, samples int) time.Duration {
	return time.Duration(p.stepUS(tokens, prefillPairs, decodeKV, samples) * 1e3)
}

func (p *Profile) stepUS(tokens int, prefillPairs float64, decodeKV, samples int) float64 {
	n := float64(tokens)
	return p.OverheadUS + p.denseUS(n) + p.PerTokenUS*n + p.PrefillAttnNS*prefillPairs*1e-3 +
		p.DecodeAttnNS*float64(decodeKV)*1e-3 + p.PerSampleUS*float64(samples)
}

func (p *Profile) denseUS(n float64) float64 {
	lin := p.DensePerTokenUS * n
	return float64(p.Layers) * math.Sqrt(p.DenseFloorUS*p.DenseFloorUS+lin*lin)
}

// DenseTime returns the dense (GEMM) part of a step of tokens tokens over
// all layers: the part Vidur's per-operator profiles measure.
func (p *Profile) DenseTime(tokens int) time.Duration {
	return time.Duration(p.denseUS(float64(tokens)) * 1e3)
}

// PrefillTime returns the duration of a step that prefills one prompt of
// n tokens with no cached prefix (a lone request's TTFT when n fits the
// token budget).
func (p *Profile) PrefillTime(n int) time.Duration {
	return p.StepTime(n, float64(n)*float64(n)/2, 0, 1)
}

// DecodeTime returns the duration of a decode-only step of batch
// sequences that each read context KV tokens.
func (p *Profile) DecodeTime(batch, context int) time.Duration {
	return p.StepTime(batch, 0, batch*context, batch)
}

// batchDefaults returns DefaultMaxNumBatchedTokens and DefaultMaxNumSeqs,
// each, when not positive, replaced by vLLM's OpenAI-server default
// (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): 8192 tokens
// and 1024 sequences when the GPU has at least 70 GiB and its lower-cased
// name does not contain "a100", else 2048 and 256.
func (p *Profile) batchDefaults() (tokens, seqs int) {
	tokens, seqs = 2048, 256
	if p.GPUMemoryGiB >= 70 && !strings.Contains(strings.ToLower(p.GPU), "a100") {
		tokens, seqs = 8192, 1024
	}
	if p.DefaultMaxNumBatchedTokens > 0 {
		tokens = p.DefaultMaxNumBatchedTokens
	}
	if p.DefaultMaxNumSeqs > 0 {
		seqs = p.DefaultMaxNumSeqs
	}
	return tokens, seqs
}

// NumBlocks returns the KV cache size in blocks of blockSize tokens for a
// gpu_memory_utilization of util: per GPU, util × memory minus the weight
// shard and the reserve, divided by the per-GPU KV bytes of a block (vLLM
// V1: vllm/v1/worker/gpu_worker.py determine_available_memory and
// vllm/v1/core/kv_cache_utils.py get_num_blocks).
func (p *Profile) NumBlocks(util float64, blockSize int) int {
	tp := float64(max(p.TP, 1))
	avail := (p.GPUMemoryGiB*util - p.WeightGiB/tp - p.ReserveGiB) * (1 << 30)
	perBlock := float64(p.KVBytesPerToken) / tp * float64(blockSize)
	if avail <= 0 || perBlock <= 0 {
		return 0
	}
	return int(avail / perBlock)
}

// Model shapes.
const (
	// llama3_8bKV: 32 layers × 8 KV heads × 128 head dim × 2 (K,V) × 2
	// bytes = 131072 bytes (128 KiB) per token (Meta-Llama-3-8B
	// config.json; Vidur's mlp.csv rows carry n_kv_head 8).
	llama3_8bKV = 32 * 8 * 128 * 2 * 2
	// llama3_70bKV: 80 layers × 8 × 128 × 2 × 2 = 327680 bytes (320 KiB).
	llama3_70bKV = 80 * 8 * 128 * 2 * 2
	// llama3_8bGiB: 8.03 B parameters × 2 bytes.
	llama3_8bGiB = 8.03e9 * 2 / (1 << 30)
	// llama3_70bGiB: 70.55 B parameters × 2 bytes.
	llama3_70bGiB = 70.55e9 * 2 / (1 << 30)
)

// Calibration constants shared by several profiles. Rows are 1-based line
// numbers of the files in ../shared/perf (line 1 is the header).
const (
	// cpuOverheadUS: host-side time per step. DistServe's A100 fit for
	// OPT-13B TP1 (distserve_profiler-a100-80g.distserve.json,
	// "facebook/opt-13b"."1".decoding_smallbs[0] = 19.93 ms) minus the
	// weight read of 12.85 B × 2 bytes at the 1.44 TB/s effective A100
	// bandwidth Vidur's dense floor shows (436 MB per Llama-3-8B layer in
	// 0.303 ms) leaves ≈ 2.1 ms. The same fit for vLLM 0.2
	// (…vllm.json, 23.48 ms) leaves 5.6 ms; vLLM V1's CUDA graphs and
	// persistent batch cut most of that, so the DistServe value is taken.
	// Estimate.
	cpuOverheadUS = 2100

	// rtx4090 measurements, LLMServingSim, vLLM 0.19, Llama-3.1-8B BF16,
	// per layer (llmservingsim_RTX4090_Llama-3.1-8B_tp1_*.csv).
	//
	// Dense floor at 1 token (dense.csv rows 1066 qkv_proj 54.898, 914
	// o_proj 38.1313, 610 gate_up_proj 247.292, 154 down_proj 126.766,
	// 2 act_fn 2.592, 762 layernorm 1.85083 ×2 per layer, 1218 rotary_emb
	// 2.17567).
	rtx4090FloorUS = 54.898 + 38.1313 + 247.292 + 126.766 + 2.592 + 2*1.85083 + 2.17567
	// Dense at 2048 tokens (rows 1217 qkv 631.069, 1065 o 419.483, 761
	// gate_up 2896.81, 305 down 1459.55, 153 act 168.943, 913 layernorm
	// 28.4845 ×2, 1369 rotary 26.228), divided by 2048.
	rtx4090PerTokUS = (631.069 + 419.483 + 2896.81 + 1459.55 + 168.943 + 2*28.4845 + 26.228) / 2048
	// lm_head at 1 sequence (per_sequence.csv row 2: 1096.93 µs) and the
	// sampler (row 42: 25.001 µs): once per step.
	rtx4090LMHeadUS = 1096.93
	samplerUS       = 25.001
	// Per sampled sequence: lm_head and sampler growth from 1 to 32
	// sequences ((1190.84-1096.93) + (36.8307-25.001)) / 31, rows 21, 61.
	rtx4090PerSampleUS = ((1190.84 - 1096.93) + (36.8307 - 25.001)) / 31
	// Prefill attention: least-squares slope over the 36 attention.csv
	// rows with n_decode=0 and prefill_chunk 512/1024/2048 (rows
	// 5441-6420, 6509-7488, 7577-8556) of time against
	// chunk·(kv_prefill + chunk/2): 0.11805 ns per pair per layer, × 32.
	rtx4090PrefillAttnNS = 0.11805 * 32
	// Decode attention: least-squares slope over the 66 rows with
	// prefill_chunk=0 and n_decode ≥ 8 of time against
	// n_decode·kv_decode: 4.2947 ns per KV token per layer, × 32.
	rtx4090DecodeAttnNS = 4.2947 * 32

	// rtx4090PeakTFLOPS and l4PeakTFLOPS are the dense BF16 tensor peaks
	// (FP32 accumulate) of the NVIDIA Ada datasheets: 165.2 and 121.
	// rtx4090GBs and l4GBs are memory bandwidths: 1008 and 300 GB/s.
	rtx4090PeakTFLOPS = 165.2
	l4PeakTFLOPS      = 121
	rtx4090GBs        = 1008
	l4GBs             = 300

	// a100_8bFloorUS/a100_8bPerTokUS: Vidur A100 Meta-Llama-3-8B TP1
	// (vidur_a100_meta-llama_Meta-Llama-3-8B_mlp.csv), sum of the
	// per-layer op medians except emb (input_layernorm, attn_pre_proj,
	// attn_rope, attn_post_proj, post_attention_layernorm, mlp_up_proj,
	// mlp_act, mlp_down_proj, add): row 457 (num_tokens 1) 0.3030 ms,
	// row 262 (num_tokens 2048) 4.4310 ms / 2048.
	a100_8bFloorUS  = 303.0
	a100_8bPerTokUS = 4431.0 / 2048
	// h100_7bFloorUS/h100_7bPerTokUS: the same sums for Vidur H100
	// Llama-2-7b-hf TP1 (vidur_h100_meta-llama_Llama-2-7b-hf_mlp.csv):
	// row 262 (1 token) 0.1750 ms, row 67 (2048 tokens) 1.2665 ms / 2048.
	// Vidur has no Llama-3 H100 profile; Llama-3-8B's layer has
	// 218.1 M dense parameters (QKV 4096×6144, O 4096², gate/up
	// 4096×28672, down 14336×4096) against Llama-2-7B's 202.4 M (QKV
	// 4096×12288, O 4096², gate/up 4096×22016, down 11008×4096), so both
	// the weight-read floor and the FLOPs scale by llama3Over2 = 1.0777.
	h100_7bFloorUS  = 175.0
	h100_7bPerTokUS = 1266.5 / 2048
	llama3Over2     = 218103808.0 / 202375168.0
)

// profiles is the table returned by Profiles.
var profiles = []Profile{
	h100Llama3_8B(),
	a100Llama3_8B(),
	l4Llama3_8B(),
	rtx4090Llama3_8B(),
	h100x4Llama3_70B(),
	a100x4Llama3_70B(),
}

// Profiles returns the built-in profiles: "h100-llama3-8b",
// "a100-llama3-8b", "l4-llama3-8b", "rtx4090-llama3-8b",
// "h100x4-llama3-70b", "a100x4-llama3-70b". The slice is fresh and owned
// by the caller.
func Profiles() []Profile { return append([]Profile(nil), profiles...) }

// ProfileByName returns the built-in profile called name.
func ProfileByName(name string) (Profile, bool) {
	for _, p := range profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

func llama3_8B(name, gpu string) Profile {
	return Profile{
		Name: name, GPU: gpu, Model: "Llama-3-8B", TP: 1, Layers: 32,
		WeightGiB: llama3_8bGiB, KVBytesPerToken: llama3_8bKV,
		CPUOverheadUS: cpuOverheadUS,
	}
}

// rtx4090Llama3_8B is the calibration profile measured by LLMServingSim:
// every GPU coefficient is a measurement (see the rtx4090 constants);
// only the CPU overhead and the memory reserve are estimates.
func rtx4090Llama3_8B() Profile {
	p := llama3_8B("rtx4090-llama3-8b", "RTX 4090 24GB")
	p.GPUMemoryGiB = 24564.0 / 1024 // nvidia-smi total, MiB
	p.ReserveGiB = 1.5              // estimate: 2048-token activation peak + graphs
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 2048, 256
	p.OverheadUS = cpuOverheadUS + rtx4090LMHeadUS + samplerUS
	p.DenseFloorUS = rtx4090FloorUS
	p.DensePerTokenUS = rtx4090PerTokUS
	p.PrefillAttnNS = rtx4090PrefillAttnNS
	p.DecodeAttnNS = rtx4090DecodeAttnNS
	p.PerSampleUS = rtx4090PerSampleUS
	return p
}

// l4Llama3_8B is an estimate: the L4 is the same Ada architecture as the
// RTX 4090 (AD104 vs AD102), so the RTX 4090 measurements are scaled with
// the same efficiency: weight- and KV-read (memory-bound) terms by the
// bandwidth ratio 1008/300 GB/s, compute-bound terms (dense slope,
// prefill attention) by the BF16 peak ratio 165.2/121 TFLOPS. The same
// datasheet scaling applied across architectures (RTX 4090 → A100) would
// make the A100's GEMMs 22% (floor) and 32% (slope) faster than Vidur
// measures, so these L4 numbers are likely optimistic; the L4's 72 W power
// cap may lower sustained compute further. Estimates, no L4 measurement
// is available in ../shared/perf.
func l4Llama3_8B() Profile {
	mem := float64(rtx4090GBs) / l4GBs
	flops := rtx4090PeakTFLOPS / l4PeakTFLOPS
	p := llama3_8B("l4-llama3-8b", "L4 24GB")
	p.GPUMemoryGiB = 23034.0 / 1024 // nvidia-smi total, MiB
	p.ReserveGiB = 1.5              // estimate, as for the RTX 4090
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 2048, 256
	p.OverheadUS = cpuOverheadUS + rtx4090LMHeadUS*mem + samplerUS
	p.DenseFloorUS = rtx4090FloorUS * mem
	p.DensePerTokenUS = rtx4090PerTokUS * flops
	p.PrefillAttnNS = rtx4090PrefillAttnNS * flops
	p.DecodeAttnNS = rtx4090DecodeAttnNS * mem
	p.PerSampleUS = rtx4090PerSampleUS * mem
	return p
}

// a100Llama3_8B: dense terms measured (Vidur A100 Llama-3-8B); the
// lm_head read, decode attention and per-sample terms are the RTX 4090
// measurements scaled by the ratio of measured dense floors (both read
// the same 436 MB per layer, so the ratio is the effective bandwidth
// ratio, 303.0/475.6); prefill attention is the RTX 4090 measurement
// scaled by the ratio of measured dense slopes (2.164/2.763 µs per token
// per layer: the GPUs' achieved compute ratio, assumed to hold for the
// attention kernels too). Scaling by the datasheet peaks instead
// (165.2/312) would be 32% faster than Vidur measures for the GEMMs, so
// measured ratios are preferred. Estimates except the dense terms.
func a100Llama3_8B() Profile {
	bw := a100_8bFloorUS / rtx4090FloorUS
	p := llama3_8B("a100-llama3-8b", "A100-SXM 80GB")
	p.GPUMemoryGiB = 81920.0 / 1024 // nvidia-smi total, MiB
	p.ReserveGiB = 2.0              // estimate: 2048-token activation peak + graphs
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 2048, 256
	p.OverheadUS = cpuOverheadUS + rtx4090LMHeadUS*bw + samplerUS
	p.DenseFloorUS = a100_8bFloorUS
	p.DensePerTokenUS = a100_8bPerTokUS
	p.PrefillAttnNS = rtx4090PrefillAttnNS * a100_8bPerTokUS / rtx4090PerTokUS
	p.DecodeAttnNS = rtx4090DecodeAttnNS * bw
	p.PerSampleUS = rtx4090PerSampleUS * bw
	return p
}

// h100Llama3_8B: dense terms from Vidur H100 Llama-2-7B scaled to
// Llama-3-8B's layer size (llama3Over2); the other terms scaled from the
// RTX 4090 measurements as for the A100 (bandwidth by the measured dense
// floor ratio, attention compute by the measured dense slope ratio).
func h100Llama3_8B() Profile {
	floor := h100_7bFloorUS * llama3Over2
	bw := floor / rtx4090FloorUS
	p := llama3_8B("h100-llama3-8b", "H100-SXM 80GB")
	p.GPUMemoryGiB = 81559.0 / 1024 // nvidia-smi total, MiB
	p.ReserveGiB = 3.0              // estimate: 8192-token activation peak + graphs
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 8192, 1024
	p.OverheadUS = cpuOverheadUS + rtx4090LMHeadUS*bw + samplerUS
	p.DenseFloorUS = floor
	p.DensePerTokenUS = h100_7bPerTokUS * llama3Over2
	p.PrefillAttnNS = rtx4090PrefillAttnNS * p.DensePerTokenUS / rtx4090PerTokUS
	p.DecodeAttnNS = rtx4090DecodeAttnNS * bw
	p.PerSampleUS = rtx4090PerSampleUS * bw
	return p
}

// The TP4 70B profiles take their dense terms from Vidur's TP4 rows (the
// per-GPU GEMM shards) and fit the remaining terms to SplitwiseSim's
// end-to-end vLLM measurements of Llama-2-70B at TP4
// (splitwise_perf_model.csv; Llama-2-70B has Llama-3-70B's layer shapes,
// only the vocabulary differs): OverheadUS and DecodeAttnNS solve the two
// decode measurements (token_time at batch 1 and 32, prompt 512, 128
// output tokens, mean context 576); PerTokenUS (all-reduce volume and
// other per-token work) minimises the squared relative error of
// prompt_time at batch 1 over the prompts a step of the GPU's default
// token budget can hold. Each measurement is the mean of its repeated
// rows. PerSampleUS is folded into the fitted terms.
//
// H100: PerTokenUS and PrefillAttnNS are fitted together over prompts
// 128…8192 (budget 8192); relative errors −27, −18, +10, +6, +6, −7, +1 %.
//
// A100: fitted over 128…2048 (budget 2048). Fitting PrefillAttnNS too
// drives it to zero, which is not physical, so it is fixed at the RTX 4090
// attention measurement scaled to a 70B TP4 shard (80 layers × 8192 FLOP
// per pair per GPU against 32 × 16384: ×1.25) and to the A100 as for
// a100-llama3-8b (×2.164/2.763): 3.70 ns (estimate). Relative errors
// −14.7, −1.1, −1.0, −1.2, +8.1 % for 128…2048 (and −11, −24 % at 4096
// and 8192, which chunked prefill never runs as one step).
func llama3_70B(name, gpu string) Profile {
	return Profile{
		Name: name, GPU: gpu, Model: "Llama-3-70B", TP: 4, Layers: 80,
		WeightGiB: llama3_70bGiB, KVBytesPerToken: llama3_70bKV,
		CPUOverheadUS: cpuOverheadUS,
	}
}

// a100x4Llama3_70B: dense from Vidur A100 Meta-Llama-3-70B TP4
// (vidur_a100_meta-llama_Meta-Llama-3-70B_mlp.csv row 1369, 1 token:
// 0.3110 ms per layer; row 1174, 2048 tokens: 4.2635 ms); the rest fitted
// to splitwise_perf_model.csv a100-80gb TP4 rows 212-216, 302-306,
// 352-356 (token_time, batch 1), 262-266 (batch 32) and 282-346
// (prompt_time).
func a100x4Llama3_70B() Profile {
	p := llama3_70B("a100x4-llama3-70b", "4× A100-SXM 80GB")
	p.GPUMemoryGiB = 81920.0 / 1024
	p.ReserveGiB = 2.0 // estimate
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 2048, 256
	p.DenseFloorUS = 311.0
	p.DensePerTokenUS = 4263.5 / 2048
	p.OverheadUS = 19856
	p.PerTokenUS = 32.47
	p.PrefillAttnNS = rtx4090PrefillAttnNS * (80 * 8192) / (32 * 16384) * a100_8bPerTokUS / rtx4090PerTokUS
	p.DecodeAttnNS = 330.2
	return p
}

// h100x4Llama3_70B: dense from Vidur H100 Llama-2-70b-hf TP4
// (vidur_h100_meta-llama_Llama-2-70b-hf_mlp.csv row 784, 1 token:
// 0.1790 ms per layer; row 524, 4096 tokens: 2.7720 ms); the rest fitted
// to splitwise_perf_model.csv h100-80gb TP4 rows 217-221, 307-311,
// 357-361 (token_time, batch 1), 267-271 (batch 32) and 287-351
// (prompt_time).
func h100x4Llama3_70B() Profile {
	p := llama3_70B("h100x4-llama3-70b", "4× H100-SXM 80GB")
	p.GPUMemoryGiB = 81559.0 / 1024
	p.ReserveGiB = 3.0 // estimate
	p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 8192, 1024
	p.DenseFloorUS = 179.0
	p.DensePerTokenUS = 2772.0 / 4096
	p.OverheadUS = 15053
	p.PerTokenUS = 36.4
	p.PrefillAttnNS = 5.75
	p.DecodeAttnNS = 340
	return p
}
