package engine

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// perfDir is ../shared/perf seen from this package (benchmarks/engine).
var perfDir = filepath.Join("..", "..", "..", "shared", "perf")

var (
	csvMu    sync.Mutex
	csvFiles = map[string][][]string{}
)

// csvCell returns the value of column col in 1-based line row of a CSV
// file in perfDir (line 1 is the header).
func csvCell(t *testing.T, file string, row int, col string) float64 {
	t.Helper()
	csvMu.Lock()
	recs, ok := csvFiles[file]
	if !ok {
		f, err := os.Open(filepath.Join(perfDir, file))
		if err == nil {
			recs, err = csv.NewReader(f).ReadAll()
			f.Close()
		}
		if err != nil {
			csvMu.Unlock()
			require.NoError(t, err)
		}
		csvFiles[file] = recs
	}
	csvMu.Unlock()
	require.Less(t, row-1, len(recs), "%s has no line %d", file, row)
	for i, h := range recs[0] {
		if h == col {
			v, err := strconv.ParseFloat(recs[row-1][i], 64)
			require.NoError(t, err)
			return v
		}
	}
	t.Fatalf("%s has no column %q", file, col)
	return 0
}

// vidurOps are Vidur's per-layer dense operators (all but emb, which runs
// once per step, not per layer).
var vidurOps = []string{"input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
	"post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"}

func within(t *testing.T, want, got, tol float64, msg string) {
	t.Helper()
	t.Logf("%s: measured %.4g, model %.4g (%+.1f%%)", msg, want, got, 100*(got/want-1))
	assert.InEpsilon(t, want, got, tol, "%s: measured %.4g, model %.4g (%+.1f%%)", msg, want, got, 100*(got/want-1))
}

// TestDenseMatchesVidur checks the dense term against Vidur's measured
// per-layer operator medians, summed over the ops and multiplied by the
// layers. The literals are the sums of the rows' time_stats.<op>.median;
// the test re-reads the rows to check the literals.
func TestDenseMatchesVidur(t *testing.T) {
	const (
		a100_8b  = "vidur_a100_meta-llama_Meta-Llama-3-8B_mlp.csv"
		h100_7b  = "vidur_h100_meta-llama_Llama-2-7b-hf_mlp.csv"
		a100_70b = "vidur_a100_meta-llama_Meta-Llama-3-70B_mlp.csv"
		h100_70b = "vidur_h100_meta-llama_Llama-2-70b-hf_mlp.csv"
	)
	cases := []struct {
		profile string
		file    string
		row     int
		tokens  int
		tp      int
		perLyr  float64 // ms, sum of op medians in the row
		scale   float64 // model-size scale (Llama-2-7B → Llama-3-8B)
	}{
		{"a100-llama3-8b", a100_8b, 457, 1, 1, 0.3030, 1},
		{"a100-llama3-8b", a100_8b, 451, 32, 1, 0.3410, 1},
		{"a100-llama3-8b", a100_8b, 391, 512, 1, 1.0825, 1},
		{"a100-llama3-8b", a100_8b, 262, 2048, 1, 4.4310, 1},
		{"h100-llama3-8b", h100_7b, 262, 1, 1, 0.1750, llama3Over2},
		{"h100-llama3-8b", h100_7b, 256, 32, 1, 0.1810, llama3Over2},
		{"h100-llama3-8b", h100_7b, 196, 512, 1, 0.3745, llama3Over2},
		{"h100-llama3-8b", h100_7b, 67, 2048, 1, 1.2665, llama3Over2},
		{"a100x4-llama3-70b", a100_70b, 1369, 1, 4, 0.3110, 1},
		{"a100x4-llama3-70b", a100_70b, 1363, 32, 4, 0.3280, 1},
		{"a100x4-llama3-70b", a100_70b, 1303, 512, 4, 1.1240, 1},
		{"a100x4-llama3-70b", a100_70b, 1174, 2048, 4, 4.2635, 1},
		{"h100x4-llama3-70b", h100_70b, 784, 1, 4, 0.1790, 1},
		{"h100x4-llama3-70b", h100_70b, 778, 32, 4, 0.1915, 1},
		{"h100x4-llama3-70b", h100_70b, 718, 512, 4, 0.3750, 1},
		{"h100x4-llama3-70b", h100_70b, 589, 2048, 4, 1.4195, 1},
	}
	for _, c := range cases {
		t.Run(c.profile+"/"+strconv.Itoa(c.tokens), func(t *testing.T) {
			sum := 0.0
			for _, op := range vidurOps {
				sum += csvCell(t, c.file, c.row, "time_stats."+op+".median")
			}
			require.InDelta(t, c.perLyr, sum, 0.0006, "literal vs %s line %d", c.file, c.row)
			require.EqualValues(t, c.tokens, csvCell(t, c.file, c.row, "num_tokens"))
			require.EqualValues(t, c.tp, csvCell(t, c.file, c.row, "num_tensor_parallel_workers"))

			p, ok := ProfileByName(c.profile)
			require.True(t, ok)
			want := c.perLyr * c.scale * float64(p.Layers)
			got := p.DenseTime(c.tokens).Seconds() * 1e3
			within(t, want, got, 0.15, c.file)
		})
	}
}

// TestSplitwiseTTFTAndDecode checks whole-step times of the 70B TP4
// profiles against SplitwiseSim's end-to-end vLLM measurements of
// Llama-2-70B at TP4 (splitwise_perf_model.csv): prompt_time of one
// prompt (TTFT) and token_time (one decode iteration) at batch 1 and 32
// with prompt 512 and 128 output tokens (mean context 512+64).
func TestSplitwiseTTFTAndDecode(t *testing.T) {
	const file = "splitwise_perf_model.csv"
	cases := []struct {
		profile string
		row     int
		col     string
		prompt  int
		batch   int
		ms      float64
	}{
		{"a100x4-llama3-70b", 212, "prompt_time", 512, 1, 126.898329006508},
		{"a100x4-llama3-70b", 322, "prompt_time", 2048, 1, 402.2117049898952},
		{"a100x4-llama3-70b", 212, "token_time", 512, 1, 44.31801987445261},
		{"a100x4-llama3-70b", 262, "token_time", 512, 32, 52.56291358515356},
		{"h100x4-llama3-70b", 217, "prompt_time", 512, 1, 59.55572199309245},
		{"h100x4-llama3-70b", 327, "prompt_time", 2048, 1, 198.1834420002997},
		{"h100x4-llama3-70b", 217, "token_time", 512, 1, 29.762305037895818},
		{"h100x4-llama3-70b", 267, "token_time", 512, 32, 36.82076102250996},
	}
	for _, c := range cases {
		t.Run(c.profile+"/"+c.col+"/"+strconv.Itoa(c.prompt)+"x"+strconv.Itoa(c.batch), func(t *testing.T) {
			require.InDelta(t, c.ms, csvCell(t, file, c.row, c.col), 1e-9, "literal vs %s line %d", file, c.row)
			require.EqualValues(t, c.prompt, csvCell(t, file, c.row, "prompt_size"))
			require.EqualValues(t, c.batch, csvCell(t, file, c.row, "batch_size"))
			require.EqualValues(t, 4, csvCell(t, file, c.row, "tensor_parallel"))
			p, ok := ProfileByName(c.profile)
			require.True(t, ok)
			var got time.Duration
			if c.col == "prompt_time" {
				got = p.PrefillTime(c.prompt)
			} else {
				got = p.DecodeTime(c.batch, c.prompt+64)
			}
			within(t, c.ms, got.Seconds()*1e3, 0.15, file)
		})
	}
}

// TestRTX4090MatchesLLMServingSim checks the GPU part of whole steps of
// the rtx4090 profile (StepTime minus the host overhead, which the
// profiler does not see) against LLMServingSim's measured Llama-3.1-8B
// layers composed into a model: 32 × (dense ops + attention) + embedding
// + final norm + lm_head + sampler. The literals are those sums of the
// rows named beside them (dense.csv, attention.csv, per_sequence.csv).
func TestRTX4090MatchesLLMServingSim(t *testing.T) {
	const pre = "llmservingsim_RTX4090_Llama-3.1-8B_tp1_"
	type cell struct {
		file string
		row  int
		mult float64
	}
	cases := []struct {
		name   string
		us     float64
		cells  []cell
		step   func(p *Profile) time.Duration
		tokens int
	}{
		{
			name: "ttft-512", us: 48305.0,
			cells: []cell{
				// dense rows at 512 tokens: qkv, o, gate_up, down, act, layernorm ×2, rotary
				{"dense", 1121, 32}, {"dense", 969, 32}, {"dense", 665, 32}, {"dense", 209, 32},
				{"dense", 57, 32}, {"dense", 817, 64}, {"dense", 1273, 32},
				{"attention", 5441, 32},              // prefill_chunk 512, kv 0
				{"dense", 361, 1}, {"dense", 513, 1}, // embedding, final_layernorm
				{"per_sequence", 2, 1}, {"per_sequence", 42, 1}, // lm_head, sampler at 1
			},
			step: func(p *Profile) time.Duration { return p.PrefillTime(512) },
		},
		{
			name: "ttft-2048", us: 193005.0,
			cells: []cell{
				{"dense", 1217, 32}, {"dense", 1065, 32}, {"dense", 761, 32}, {"dense", 305, 32},
				{"dense", 153, 32}, {"dense", 913, 64}, {"dense", 1369, 32},
				{"attention", 7577, 32},
				{"dense", 457, 1}, {"dense", 609, 1},
				{"per_sequence", 2, 1}, {"per_sequence", 42, 1},
			},
			step: func(p *Profile) time.Duration { return p.PrefillTime(2048) },
		},
		{
			name: "decode-1x512", us: 16777.0,
			cells: []cell{
				{"dense", 1066, 32}, {"dense", 914, 32}, {"dense", 610, 32}, {"dense", 154, 32},
				{"dense", 2, 32}, {"dense", 762, 64}, {"dense", 1218, 32},
				{"attention", 7, 32}, // n_decode 1, kv 512
				{"dense", 306, 1}, {"dense", 458, 1},
				{"per_sequence", 2, 1}, {"per_sequence", 42, 1},
			},
			step: func(p *Profile) time.Duration { return p.DecodeTime(1, 512) },
		},
		{
			name: "decode-32x512", us: 21542.0,
			cells: []cell{
				{"dense", 1085, 32}, {"dense", 933, 32}, {"dense", 629, 32}, {"dense", 173, 32},
				{"dense", 21, 32}, {"dense", 781, 64}, {"dense", 1237, 32},
				{"attention", 62, 32}, // n_decode 32, kv 512
				{"dense", 325, 1}, {"dense", 477, 1},
				{"per_sequence", 21, 1}, {"per_sequence", 61, 1}, // lm_head, sampler at 32
			},
			step: func(p *Profile) time.Duration { return p.DecodeTime(32, 512) },
		},
	}
	p, ok := ProfileByName("rtx4090-llama3-8b")
	require.True(t, ok)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sum := 0.0
			for _, cl := range c.cells {
				sum += cl.mult * csvCell(t, pre+cl.file+".csv", cl.row, "time_us")
			}
			require.InEpsilon(t, c.us, sum, 0.0005, "literal vs the cited rows")
			gpu := c.step(&p).Seconds()*1e6 - p.CPUOverheadUS
			within(t, c.us, gpu, 0.15, "LLMServingSim RTX4090")
		})
	}
}

// TestProfiles checks the table: names, memory and the ordering of the
// hardware (an H100 is faster than an A100, which is faster than an L4).
func TestProfiles(t *testing.T) {
	names := []string{"h100-llama3-8b", "a100-llama3-8b", "l4-llama3-8b", "rtx4090-llama3-8b", "h100x4-llama3-70b", "a100x4-llama3-70b"}
	ps := Profiles()
	require.Len(t, ps, len(names))
	for i, n := range names {
		assert.Equal(t, n, ps[i].Name)
		p, ok := ProfileByName(n)
		require.True(t, ok)
		assert.Equal(t, ps[i], p)
		assert.Positive(t, p.NumBlocks(0.9, 16), n)
	}
	_, ok := ProfileByName("tpu-v5e")
	assert.False(t, ok)
	ps[0].Name = "changed"
	assert.Equal(t, "h100-llama3-8b", Profiles()[0].Name, "Profiles returns a copy")

	h, _ := ProfileByName("h100-llama3-8b")
	a, _ := ProfileByName("a100-llama3-8b")
	l, _ := ProfileByName("l4-llama3-8b")
	for _, n := range []int{128, 512, 2048} {
		assert.Less(t, h.PrefillTime(n), a.PrefillTime(n))
		assert.Less(t, a.PrefillTime(n), l.PrefillTime(n))
	}
	assert.Less(t, h.DecodeTime(32, 1024), a.DecodeTime(32, 1024))
	assert.Less(t, a.DecodeTime(32, 1024), l.DecodeTime(32, 1024))

	// KV capacity by arithmetic: (GiB·0.9 − weights/TP − reserve)·2^30 /
	// (KV bytes per token / TP · 16).
	blocks := func(mem, weights, reserve float64, tp, kv int) int {
		return int((mem*0.9 - weights/float64(tp) - reserve) * (1 << 30) / (float64(kv) / float64(tp) * 16))
	}
	assert.Equal(t, blocks(81559.0/1024, 8.03e9*2/(1<<30), 3.0, 1, 131072), h.NumBlocks(0.9, 16))
	assert.Equal(t, blocks(23034.0/1024, 8.03e9*2/(1<<30), 1.5, 1, 131072), l.NumBlocks(0.9, 16))
	x, _ := ProfileByName("a100x4-llama3-70b")
	assert.Equal(t, blocks(80, 70.55e9*2/(1<<30), 2.0, 4, 327680), x.NumBlocks(0.9, 16))
	assert.Equal(t, 131072, h.KVBytesPerToken)
	assert.Equal(t, 327680, x.KVBytesPerToken)
}
