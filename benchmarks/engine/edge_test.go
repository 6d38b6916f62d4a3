package engine

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAddRefusesExactlyWhatCannotFit checks Add's contract ("a request is
// refused only if it could never fit in the KV cache") at its boundary. A
// request holds KV for its prompt and every output token but the last,
// which is sampled and never fed back: PromptTokens+OutputTokens-1
// tokens. With 10 blocks of 16 tokens (160 tokens), 150 prompt + 11
// output tokens need 160 and must run to completion; 150 + 12 need 161
// and can never run.
func TestAddRefusesExactlyWhatCannotFit(t *testing.T) {
	cfg := unitConfig(2048, 8, 10)
	cfg.EnablePrefixCaching = false
	d := newDriver(cfg)
	assert.ErrorIs(t, d.e.Add(0, &Request{PromptTokens: 150, OutputTokens: 12}), ErrTooLarge)
	r := &Request{ID: 1, PromptTokens: 150, OutputTokens: 11}
	require.NoError(t, d.e.Add(0, r))
	d.drain(t)
	f, ok := d.find(Finished, r)
	require.True(t, ok)
	assert.Zero(t, f.Preemptions)
	st := d.e.Stats()
	assert.EqualValues(t, 11, st.GeneratedTokens)
	// 1 prefill step and 10 decode steps.
	assert.EqualValues(t, 11, st.Steps)

	// Sizes whose sum overflows int are refused, not accepted.
	e := New(unitConfig(2048, 8, 10))
	for _, c := range []struct{ prompt, output int }{
		{math.MaxInt, 1},
		{math.MaxInt - 5, 10},
		{100, math.MaxInt},
		{math.MaxInt, math.MaxInt},
	} {
		assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: c.prompt, OutputTokens: c.output}), ErrTooLarge, "%d+%d", c.prompt, c.output)
	}
	assert.True(t, e.Idle())

	// A cache of 2^32 tokens (2^22 blocks of 1024) can hold a 2^31-token
	// prompt, but the engine counts tokens in int32: it must refuse the
	// request rather than run it with a wrapped count.
	cfg = unitConfig(2048, 8, 1<<22)
	cfg.BlockSize = 1024
	e = New(cfg)
	assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: 1 << 31, OutputTokens: 1}), ErrTooLarge)
	assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: 1 << 30, OutputTokens: 1 << 30}), ErrTooLarge)
	assert.True(t, e.Idle())
}

// TestZeroProfileDefaultsTakeVLLMRule checks Config's promise that a
// zero MaxNumBatchedTokens or MaxNumSeqs means vLLM's OpenAI-server
// default for the GPU — 8192 tokens and 1024 sequences on a GPU with at
// least 70 GiB that is not an A100, else 2048 and 256
// (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults) — also for a
// Profile built without its Default fields, and that such an engine runs.
func TestZeroProfileDefaultsTakeVLLMRule(t *testing.T) {
	cases := []struct {
		gpu          string
		gib          float64
		tokens, seqs int
	}{
		{"H100-SXM 80GB", 81559.0 / 1024, 8192, 1024},
		{"MI300X", 192, 8192, 1024},
		{"A100-SXM 80GB", 80, 2048, 256},
		{"NVIDIA a100 80GB PCIe", 80, 2048, 256},
		{"L40S", 46068.0 / 1024, 2048, 256},
		{"exactly 70 GiB", 70, 8192, 1024},
		{"just under 70 GiB", 69.99, 2048, 256},
	}
	for _, c := range cases {
		t.Run(c.gpu, func(t *testing.T) {
			p := unitProfile(false)
			p.GPU, p.GPUMemoryGiB = c.gpu, c.gib
			p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 0, 0
			cfg := Config{Profile: p, NumBlocks: 1000}
			require.NoError(t, cfg.Validate())
			d := newDriver(cfg)
			assert.Equal(t, c.tokens, d.e.Config().MaxNumBatchedTokens)
			assert.Equal(t, c.seqs, d.e.Config().MaxNumSeqs)
			r := req(1, 100, 2)
			d.add(t, r)
			d.drain(t)
			_, ok := d.find(Finished, r)
			assert.True(t, ok)
		})
	}
}

// TestBuiltinProfileDefaultsFollowVLLMRule checks that every built-in
// profile's Default fields are what vLLM's rule gives for its GPU.
func TestBuiltinProfileDefaultsFollowVLLMRule(t *testing.T) {
	for _, p := range Profiles() {
		big := p.GPUMemoryGiB >= 70 && !strings.Contains(strings.ToLower(p.GPU), "a100")
		tokens, seqs := 2048, 256
		if big {
			tokens, seqs = 8192, 1024
		}
		assert.Equal(t, tokens, p.DefaultMaxNumBatchedTokens, p.Name)
		assert.Equal(t, seqs, p.DefaultMaxNumSeqs, p.Name)
		p.DefaultMaxNumBatchedTokens, p.DefaultMaxNumSeqs = 0, 0
		assert.Equal(t, tokens, New(DefaultConfig(p)).Config().MaxNumBatchedTokens, p.Name)
		assert.Equal(t, seqs, New(DefaultConfig(p)).Config().MaxNumSeqs, p.Name)
	}
}
