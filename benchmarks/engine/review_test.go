package engine

import (
	"math"
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
