package engine

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const us = time.Microsecond

// unitProfile makes step times easy arithmetic: a step of N tokens takes
// 1 ms + N µs (+ 1 µs per prefill pair and per decode KV token when
// attn is set).
func unitProfile(attn bool) Profile {
	p := Profile{
		Name: "unit", GPU: "test", Model: "test", TP: 1, Layers: 1,
		GPUMemoryGiB: 1, KVBytesPerToken: 1,
		DefaultMaxNumBatchedTokens: 2048, DefaultMaxNumSeqs: 256,
		OverheadUS: 1000, DensePerTokenUS: 1,
	}
	if attn {
		p.PrefillAttnNS = 1000
		p.DecodeAttnNS = 1000
	}
	return p
}

func unitConfig(budget, seqs, blocks int) Config {
	return Config{Profile: unitProfile(false), MaxNumBatchedTokens: budget, MaxNumSeqs: seqs, NumBlocks: blocks, EnablePrefixCaching: true}
}

// driver runs an engine in virtual time and records its steps and events.
type driver struct {
	e      *Engine
	now    time.Duration
	events []Event
	steps  []stepRec
}

type stepRec struct {
	start, d time.Duration
	tokens   int
	seqs     int
	running  int
}

func newDriver(cfg Config) *driver { return &driver{e: New(cfg)} }

func (d *driver) add(t *testing.T, r *Request) {
	t.Helper()
	require.NoError(t, d.e.Add(d.now, r))
}

// step runs one step; false when there was nothing to do.
func (d *driver) step() bool {
	dur, ok := d.e.StartStep(d.now)
	if !ok {
		return false
	}
	d.steps = append(d.steps, stepRec{start: d.now, d: dur, tokens: d.e.work.tokens, seqs: len(d.e.sched), running: len(d.e.running)})
	d.now += dur
	d.events = d.e.FinishStep(d.now, d.events)
	return true
}

func (d *driver) drain(t *testing.T) {
	t.Helper()
	for i := 0; d.step(); i++ {
		require.Less(t, i, 1_000_000, "engine does not finish")
	}
	require.True(t, d.e.Idle())
}

func (d *driver) find(kind EventKind, r *Request) (Event, bool) {
	for _, ev := range d.events {
		if ev.Kind == kind && ev.Req == r {
			return ev, true
		}
	}
	return Event{}, false
}

func (d *driver) tokens() []int {
	out := make([]int, len(d.steps))
	for i, s := range d.steps {
		out[i] = s.tokens
	}
	return out
}

// blocks returns n content-block ids starting at first.
func blocks(first uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out
}

func req(id uint64, prompt, output int) *Request {
	return &Request{ID: id, Blocks: blocks(id*1000, (prompt+15)/16), BlockTokens: 16, PromptTokens: prompt, OutputTokens: output}
}

func TestBudgetAndMaxNumSeqs(t *testing.T) {
	d := newDriver(unitConfig(100, 3, 1000))
	for i := range 10 {
		d.add(t, req(uint64(i+1), 50, 4))
	}
	d.drain(t)
	// Step 1 admits two 50-token prompts (budget 100); step 2 decodes
	// them (2 tokens) and admits a third prompt (max_num_seqs 3).
	require.GreaterOrEqual(t, len(d.steps), 2)
	assert.Equal(t, 100, d.steps[0].tokens)
	assert.Equal(t, 2, d.steps[0].seqs)
	assert.Equal(t, 52, d.steps[1].tokens)
	assert.Equal(t, 3, d.steps[1].running)
	for i, s := range d.steps {
		assert.LessOrEqual(t, s.tokens, 100, "step %d", i)
		assert.LessOrEqual(t, s.running, 3, "step %d", i)
	}
	n := 0
	for _, ev := range d.events {
		if ev.Kind == Finished {
			n++
		}
	}
	assert.Equal(t, 10, n)
	assert.EqualValues(t, 40, d.e.Stats().GeneratedTokens)
}

func TestChunkedPrefill(t *testing.T) {
	cfg := unitConfig(100, 8, 1000)
	cfg.Profile = unitProfile(true)
	d := newDriver(cfg)
	r := req(1, 250, 2)
	d.add(t, r)
	d.drain(t)
	assert.Equal(t, []int{100, 100, 50, 1}, d.tokens())
	// Step durations: 1 ms + tokens µs + pairs µs (+ KV tokens µs).
	// Chunk pairs: 100·(0+50) = 5000, 100·(100+50) = 15000,
	// 50·(200+25) = 11250; the decode reads 251 KV tokens.
	want := []time.Duration{(1000 + 100 + 5000) * us, (1000 + 100 + 15000) * us, (1000 + 50 + 11250) * us, (1000 + 1 + 251) * us}
	for i, s := range d.steps {
		assert.Equal(t, want[i], s.d, "step %d", i)
	}
	first, ok := d.find(FirstToken, r)
	require.True(t, ok)
	assert.Equal(t, 34500*us, first.At)
	fin, ok := d.find(Finished, r)
	require.True(t, ok)
	assert.Equal(t, 35752*us, fin.At)
	assert.Len(t, d.events, 2, "no event before the prefill completes")
}

func TestSingleRequestMatchesProfile(t *testing.T) {
	for _, name := range []string{"h100-llama3-8b", "a100-llama3-8b", "l4-llama3-8b", "a100x4-llama3-70b"} {
		for _, prompt := range []int{512, 2048} {
			t.Run(name+"/"+strconv.Itoa(prompt), func(t *testing.T) {
				p, _ := ProfileByName(name)
				d := newDriver(DefaultConfig(p))
				r := req(1, prompt, 3)
				d.add(t, r)
				d.drain(t)
				first, ok := d.find(FirstToken, r)
				require.True(t, ok)
				assert.Equal(t, p.PrefillTime(prompt), first.At)
				require.Len(t, d.steps, 3)
				// Decode steps read prompt+1 and prompt+2 KV tokens.
				assert.Equal(t, p.DecodeTime(1, prompt+1), d.steps[1].d)
				assert.Equal(t, p.DecodeTime(1, prompt+2), d.steps[2].d)
			})
		}
	}
}

func TestDecodeOneTokenPerStep(t *testing.T) {
	d := newDriver(unitConfig(2048, 8, 1000))
	rs := []*Request{req(1, 10, 5), req(2, 10, 5), req(3, 10, 5)}
	for _, r := range rs {
		d.add(t, r)
	}
	d.drain(t)
	assert.Equal(t, []int{30, 3, 3, 3, 3}, d.tokens())
	for _, r := range rs {
		first, _ := d.find(FirstToken, r)
		fin, _ := d.find(Finished, r)
		assert.Equal(t, d.steps[0].start+d.steps[0].d, first.At)
		assert.Equal(t, d.now, fin.At)
	}
	st := d.e.Stats()
	assert.EqualValues(t, 15, st.GeneratedTokens)
	assert.EqualValues(t, 30, st.PromptTokens)
	assert.EqualValues(t, 5, st.Steps)
}

func TestPreemptionAndRecompute(t *testing.T) {
	// 8 blocks of 16 tokens. Two requests of 32 prompt + 40 output tokens
	// each need 5 blocks at the end; together they run out when the older
	// one needs its 5th block: in step 34 (its KV then covers 32+33
	// tokens), the newer one is preempted.
	cfg := unitConfig(2048, 8, 8)
	cfg.EnablePrefixCaching = false
	d := newDriver(cfg)
	r0, r1 := req(1, 32, 40), req(2, 32, 40)
	d.add(t, r0)
	d.add(t, r1)
	d.drain(t)

	pre, ok := d.find(Preempted, r1)
	require.True(t, ok)
	assert.Equal(t, d.steps[33].start, pre.At, "preempted by step 34")
	_, ok = d.find(Preempted, r0)
	assert.False(t, ok, "the older request is never preempted")

	f0, _ := d.find(Finished, r0)
	f1, _ := d.find(Finished, r1)
	assert.Equal(t, 0, f0.Preemptions)
	assert.Equal(t, 1, f1.Preemptions)
	assert.Less(t, f0.At, f1.At)
	// r1 had generated 33 tokens; its recompute prefills 32+33 = 65 tokens
	// in one step, once r0 has finished (5 blocks do not fit beside r0's 5).
	assert.Contains(t, d.tokens(), 65)
	st := d.e.Stats()
	assert.EqualValues(t, 1, st.Preemptions)
	assert.EqualValues(t, 80, st.GeneratedTokens, "recompute does not generate twice")
	assert.Zero(t, st.KVCacheUsage)
	// Only one FirstToken per request, even after a recompute.
	n := 0
	for _, ev := range d.events {
		if ev.Kind == FirstToken {
			n++
		}
	}
	assert.Equal(t, 2, n)
}

func TestPrefixCacheHit(t *testing.T) {
	cases := []struct {
		name        string
		first, then *Request
		wantCached  int
	}{
		{"partial last block", req(1, 100, 1), &Request{ID: 2, Blocks: blocks(1000, 7), BlockTokens: 16, PromptTokens: 100, OutputTokens: 1}, 96},
		{"whole prompt cached keeps the last block to compute", req(1, 96, 1), &Request{ID: 2, Blocks: blocks(1000, 6), BlockTokens: 16, PromptTokens: 96, OutputTokens: 1}, 80},
		{"shared first three blocks", req(1, 100, 1), &Request{ID: 2, Blocks: append(blocks(1000, 3), 7, 8, 9, 10), BlockTokens: 16, PromptTokens: 100, OutputTokens: 1}, 48},
		{"different first block", req(1, 100, 1), &Request{ID: 2, Blocks: append([]uint64{5}, blocks(1001, 6)...), BlockTokens: 16, PromptTokens: 100, OutputTokens: 1}, 0},
		{"one-block prompt", req(1, 16, 1), &Request{ID: 2, Blocks: blocks(1000, 1), BlockTokens: 16, PromptTokens: 16, OutputTokens: 1}, 0},
		{
			"512-token content blocks (Mooncake hash_ids)",
			&Request{ID: 1, Blocks: []uint64{7, 8}, BlockTokens: 512, PromptTokens: 1000, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{7, 8}, BlockTokens: 512, PromptTokens: 1000, OutputTokens: 1},
			992,
		},
		{
			"512-token blocks sharing the first",
			&Request{ID: 1, Blocks: []uint64{7, 8}, BlockTokens: 512, PromptTokens: 1000, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{7, 9}, BlockTokens: 512, PromptTokens: 1000, OutputTokens: 1},
			512,
		},
		{
			"24-token content blocks, all shared",
			&Request{ID: 1, Blocks: []uint64{1, 2, 3, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{1, 2, 3, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			112,
		},
		{
			// KV block 1 (tokens 16-31) spans content blocks 0 and 1.
			"24-token content blocks, second differs",
			&Request{ID: 1, Blocks: []uint64{1, 2, 3, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{1, 9, 3, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			16,
		},
		{
			"24-token content blocks, third differs",
			&Request{ID: 1, Blocks: []uint64{1, 2, 3, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{1, 2, 9, 4, 5}, BlockTokens: 24, PromptTokens: 120, OutputTokens: 1},
			48,
		},
		{
			"tokens beyond the content blocks never hit",
			&Request{ID: 1, Blocks: []uint64{7}, BlockTokens: 16, PromptTokens: 100, OutputTokens: 1},
			&Request{ID: 2, Blocks: []uint64{7}, BlockTokens: 16, PromptTokens: 100, OutputTokens: 1},
			16,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(unitConfig(2048, 8, 1000))
			d.add(t, c.first)
			d.drain(t)
			assert.Equal(t, c.wantCached, d.e.PrefixHitTokens(c.then))
			d.add(t, c.then)
			d.drain(t)
			f1, _ := d.find(FirstToken, c.first)
			f2, _ := d.find(FirstToken, c.then)
			assert.Equal(t, 0, f1.CachedTokens)
			assert.Equal(t, c.wantCached, f2.CachedTokens)
			// TTFT: 1 ms + computed tokens µs.
			assert.Equal(t, time.Duration(1000+c.first.PromptTokens)*us, f1.At)
			assert.Equal(t, time.Duration(1000+c.then.PromptTokens-c.wantCached)*us, f2.At-d.steps[1].start)
			st := d.e.Stats()
			assert.EqualValues(t, c.first.PromptTokens+c.then.PromptTokens, st.PrefixQueries)
			assert.EqualValues(t, c.wantCached, st.PrefixHits)
		})
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	cfg := unitConfig(2048, 8, 1000)
	cfg.EnablePrefixCaching = false
	d := newDriver(cfg)
	d.add(t, req(1, 100, 1))
	d.drain(t)
	again := req(1, 100, 1)
	assert.Zero(t, d.e.PrefixHitTokens(again))
	d.add(t, again)
	d.drain(t)
	assert.Zero(t, d.e.Stats().PrefixHits)
}

func TestLRUEviction(t *testing.T) {
	// 12 blocks. A, B, C (4 blocks each) run one after the other; then D
	// (2 blocks) must evict. Free blocks are reused least recently freed
	// first, and a request's blocks are freed tail first, so D evicts A's
	// last two blocks: A keeps a 2-block prefix, B and C stay whole
	// (capped at 3 blocks: the last prompt token is always computed).
	d := newDriver(unitConfig(2048, 8, 12))
	a, b, c := req(1, 64, 1), req(2, 64, 1), req(3, 64, 1)
	for _, r := range []*Request{a, b, c} {
		d.add(t, r)
		d.drain(t)
	}
	for _, r := range []*Request{a, b, c} {
		assert.Equal(t, 48, d.e.PrefixHitTokens(r))
	}
	assert.Zero(t, d.e.Stats().KVCacheUsage, "cached but unreferenced blocks count as free")
	dd := req(4, 32, 1)
	d.add(t, dd)
	d.drain(t)
	assert.Equal(t, 32, d.e.PrefixHitTokens(a))
	assert.Equal(t, 48, d.e.PrefixHitTokens(b))
	assert.Equal(t, 48, d.e.PrefixHitTokens(c))
	assert.Equal(t, 16, d.e.PrefixHitTokens(dd))
}

func TestHitProtectsBlocksFromEviction(t *testing.T) {
	// A hit takes the cached blocks off the free queue: while A' runs on
	// A's blocks, another request cannot evict them.
	d := newDriver(unitConfig(2048, 8, 7))
	a := req(1, 64, 1)
	d.add(t, a)
	d.drain(t)
	again := &Request{ID: 9, Blocks: a.Blocks[:4], BlockTokens: 16, PromptTokens: 56, OutputTokens: 5}
	d.add(t, again)
	require.True(t, d.step())
	// again (56 tokens: A's first 3 full blocks and a partial one) holds
	// 3 of A's cached blocks and one new block, enough for its 5 output
	// tokens: 4 of 7 in use. A request needing exactly 3 blocks takes the
	// 3 free ones, evicting A's 4th block but none of the 3 held by again.
	assert.InDelta(t, 4.0/7, d.e.Stats().KVCacheUsage, 1e-9)
	other := req(2, 48, 1)
	d.add(t, other)
	dur, ok := d.e.StartStep(d.now)
	require.True(t, ok)
	assert.InDelta(t, 1, d.e.Stats().KVCacheUsage, 1e-9, "other admitted")
	assert.Equal(t, 48, d.e.PrefixHitTokens(a))
	d.now += dur
	d.events = d.e.FinishStep(d.now, d.events)
	_, ok = d.find(Finished, other)
	assert.True(t, ok)
	d.drain(t)
	assert.Equal(t, 48, d.e.PrefixHitTokens(a))
}

func TestAdapterInHash(t *testing.T) {
	base := blocks(500, 7)
	mk := func(id uint64, adapter string) *Request {
		return &Request{ID: id, Blocks: base, BlockTokens: 16, PromptTokens: 100, OutputTokens: 1, Adapter: adapter}
	}
	cases := []struct {
		name    string
		first   string
		then    string
		wantHit int
	}{
		{"same adapter", "x", "x", 96},
		{"adapter then base model", "x", "", 0},
		{"base model then adapter", "", "x", 0},
		{"different adapters", "x", "y", 0},
		{"base model twice", "", "", 96},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(unitConfig(2048, 8, 1000))
			d.add(t, mk(1, c.first))
			d.drain(t)
			then := mk(2, c.then)
			assert.Equal(t, c.wantHit, d.e.PrefixHitTokens(then))
			d.add(t, then)
			d.drain(t)
			f, _ := d.find(FirstToken, then)
			assert.Equal(t, c.wantHit, f.CachedTokens)
		})
	}
}

func TestLoRASlotsAndLoadTime(t *testing.T) {
	withAdapter := func(id uint64, adapter string, output int) *Request {
		r := req(id, 10, output)
		r.Adapter = adapter
		return r
	}
	t.Run("one slot: other adapters wait", func(t *testing.T) {
		cfg := unitConfig(2048, 8, 1000)
		cfg.MaxLoRAs = 1
		cfg.MaxCPULoRAs = 2
		cfg.LoRALoadTime = 40 * time.Millisecond
		cfg.LoRASwapTime = 3 * time.Millisecond
		d := newDriver(cfg)
		r0, r1, r2 := withAdapter(1, "a", 3), withAdapter(2, "b", 2), withAdapter(3, "a", 3)
		for _, r := range []*Request{r0, r1, r2} {
			d.add(t, r)
		}
		require.True(t, d.step())
		// r0 and r2 (adapter a) run; r1 (b) is skipped but keeps its place.
		assert.Equal(t, 20, d.steps[0].tokens)
		assert.Equal(t, 1000*us+20*us+40*time.Millisecond, d.steps[0].d, "load a from disk")
		st := d.e.Stats()
		assert.Equal(t, []string{"a"}, st.RunningAdapters)
		assert.Equal(t, []string{"b"}, st.WaitingAdapters)
		assert.Equal(t, 1, st.MaxLoRA)
		require.True(t, d.step())
		assert.Equal(t, 1002*us, d.steps[1].d, "a resident: no load")
		require.True(t, d.step())
		// Step 4: r1 runs alone, b loaded from disk.
		require.True(t, d.step())
		assert.Equal(t, 10, d.steps[3].tokens)
		assert.Equal(t, 1010*us+40*time.Millisecond, d.steps[3].d)
		d.drain(t)
		// a is still in the CPU cache (2 entries): swapped back in.
		r3 := withAdapter(4, "a", 1)
		d.add(t, r3)
		require.True(t, d.step())
		assert.Equal(t, 1010*us+3*time.Millisecond, d.steps[len(d.steps)-1].d)
		st = d.e.Stats()
		assert.Empty(t, st.RunningAdapters)
		assert.Empty(t, st.WaitingAdapters)
	})
	t.Run("two slots: both run, both load", func(t *testing.T) {
		cfg := unitConfig(2048, 8, 1000)
		cfg.MaxLoRAs = 2
		d := newDriver(cfg)
		d.add(t, withAdapter(1, "a", 1))
		d.add(t, withAdapter(2, "b", 1))
		d.add(t, withAdapter(3, "c", 1))
		require.True(t, d.step())
		assert.Equal(t, 20, d.steps[0].tokens)
		assert.Equal(t, 1020*us+2*DefaultLoRALoadTime, d.steps[0].d)
		d.drain(t)
		assert.Len(t, d.steps, 2)
	})
	t.Run("base-model requests are never held back", func(t *testing.T) {
		cfg := unitConfig(2048, 8, 1000)
		d := newDriver(cfg)
		d.add(t, withAdapter(1, "a", 1))
		d.add(t, withAdapter(2, "b", 1))
		d.add(t, req(3, 10, 1))
		require.True(t, d.step())
		assert.Equal(t, 20, d.steps[0].tokens)
		assert.Equal(t, []string{"b"}, d.e.Stats().WaitingAdapters)
	})
}

func TestReset(t *testing.T) {
	d := newDriver(unitConfig(64, 8, 100))
	rs := []*Request{req(1, 100, 5), req(2, 100, 5), req(3, 30, 5)}
	for _, r := range rs {
		d.add(t, r)
	}
	require.True(t, d.step())
	require.True(t, d.step())
	_, ok := d.e.StartStep(d.now)
	require.True(t, ok)
	assert.ElementsMatch(t, rs, d.e.InFlight(nil))

	d.e.Reset()
	assert.Empty(t, d.e.FinishStep(d.now, nil), "the planned step is dropped")
	assert.True(t, d.e.Idle())
	assert.Empty(t, d.e.InFlight(nil))
	st := d.e.Stats()
	assert.Equal(t, Stats{NumBlocks: 100, BlockSize: 16, MaxLoRA: 1}, st)
	assert.Zero(t, d.e.PrefixHitTokens(rs[0]), "prefix cache emptied")

	// The engine works after a restart.
	d.events = d.events[:0]
	r := req(7, 100, 2)
	d.add(t, r)
	d.drain(t)
	_, ok = d.find(Finished, r)
	assert.True(t, ok)
	assert.Len(t, d.events, 2)
}

func TestAddErrors(t *testing.T) {
	e := New(unitConfig(2048, 8, 10))
	assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: 0, OutputTokens: 1}), ErrInvalid)
	assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: 5, OutputTokens: 0}), ErrInvalid)
	assert.ErrorIs(t, e.Add(0, &Request{PromptTokens: 150, OutputTokens: 12}), ErrTooLarge, "161 KV tokens need 11 blocks of 10")
	assert.NoError(t, e.Add(0, &Request{PromptTokens: 150, OutputTokens: 11}), "160 KV tokens: the last output token is never stored")
	assert.False(t, e.Idle())
}

func TestStartStepWithoutWork(t *testing.T) {
	e := New(unitConfig(2048, 8, 10))
	d, ok := e.StartStep(0)
	assert.False(t, ok)
	assert.Zero(t, d)
	assert.Empty(t, e.FinishStep(0, nil))
	require.NoError(t, e.Add(0, req(1, 10, 1)))
	_, ok = e.StartStep(0)
	require.True(t, ok)
	assert.Panics(t, func() { e.StartStep(0) })
}

func TestConfigDefaults(t *testing.T) {
	cases := []struct {
		profile       string
		budget, seqs  int
		wantBlocksMin int
	}{
		{"h100-llama3-8b", 8192, 1024, 20000},
		{"a100-llama3-8b", 2048, 256, 20000},
		{"l4-llama3-8b", 2048, 256, 1000},
		{"h100x4-llama3-70b", 8192, 1024, 20000},
		{"a100x4-llama3-70b", 2048, 256, 20000},
	}
	for _, c := range cases {
		t.Run(c.profile, func(t *testing.T) {
			p, _ := ProfileByName(c.profile)
			e := New(DefaultConfig(p))
			cfg := e.Config()
			assert.Equal(t, c.budget, cfg.MaxNumBatchedTokens)
			assert.Equal(t, c.seqs, cfg.MaxNumSeqs)
			assert.Equal(t, 16, cfg.BlockSize)
			assert.InDelta(t, 0.9, cfg.GPUMemoryUtilization, 0)
			assert.Equal(t, 1, cfg.MaxLoRAs)
			assert.Equal(t, 1, cfg.MaxCPULoRAs)
			assert.True(t, cfg.EnablePrefixCaching)
			assert.Equal(t, p.NumBlocks(0.9, 16), cfg.NumBlocks)
			assert.Greater(t, cfg.NumBlocks, c.wantBlocksMin)
			assert.Equal(t, cfg.NumBlocks, e.Stats().NumBlocks)
		})
	}
	assert.Panics(t, func() { New(Config{}) })
}

func TestConfigValidate(t *testing.T) {
	h, _ := ProfileByName("h100-llama3-8b")
	tiny := h
	tiny.GPUMemoryGiB = 10 // less than the weights
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", DefaultConfig(h), true},
		{"zero profile", Config{}, false},
		{"negative seqs", Config{Profile: h, MaxNumSeqs: -1}, false},
		{"negative budget", Config{Profile: h, MaxNumBatchedTokens: -1}, false},
		{"negative load time", Config{Profile: h, LoRALoadTime: -time.Second}, false},
		{"utilization above 1", Config{Profile: h, GPUMemoryUtilization: 1.5}, false},
		{"no room for KV", Config{Profile: tiny}, false},
		{"no room for KV but explicit blocks", Config{Profile: tiny, NumBlocks: 100}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.ok {
				require.NoError(t, err)
				assert.NotPanics(t, func() { New(c.cfg) })
				return
			}
			require.ErrorIs(t, err, ErrConfig)
			assert.Panics(t, func() { New(c.cfg) })
		})
	}
}

// randomWorkload builds n requests with shared prefixes, adapters and
// mixed lengths from a seeded source.
func randomWorkload(seed uint64, n int) ([]time.Duration, []*Request) {
	rng := rand.New(rand.NewPCG(seed, 1))
	at := make([]time.Duration, n)
	rs := make([]*Request, n)
	now := time.Duration(0)
	adapters := []string{"", "", "a", "b", "c"}
	for i := range rs {
		now += time.Duration(rng.ExpFloat64() * float64(3*time.Millisecond))
		at[i] = now
		prompt := 16 + rng.IntN(900)
		nb := (prompt + 63) / 64
		bl := make([]uint64, nb)
		sys := uint64(rng.IntN(4))
		for j := range bl {
			if j < 4 {
				bl[j] = sys*100 + uint64(j) // shared system prompt
			} else {
				bl[j] = uint64(i)<<20 | uint64(j)
			}
		}
		rs[i] = &Request{ID: uint64(i), Blocks: bl, BlockTokens: 64, PromptTokens: prompt, OutputTokens: 1 + rng.IntN(120), Adapter: adapters[rng.IntN(len(adapters))]}
	}
	return at, rs
}

func runOpen(t *testing.T, cfg Config, at []time.Duration, rs []*Request) *driver {
	t.Helper()
	d := newDriver(cfg)
	runOpenOn(t, d, at, rs, nil)
	return d
}

// runOpenOn runs the arrivals on d's engine until it is idle, appending
// the engine's Stats after every step to stats if it is not nil.
func runOpenOn(t *testing.T, d *driver, at []time.Duration, rs []*Request, stats *[]Stats) {
	t.Helper()
	next := 0
	for next < len(rs) || !d.e.Idle() {
		for next < len(rs) && at[next] <= d.now {
			d.add(t, rs[next])
			next++
		}
		if !d.step() {
			require.Less(t, next, len(rs), "stuck with work")
			d.now = at[next]
		}
		if stats != nil {
			*stats = append(*stats, d.e.Stats())
		}
	}
}

func TestResetBehavesAsNew(t *testing.T) {
	// An engine that ran one workload (other adapters first, a warm prefix
	// cache, grown buffers) and was reset runs a second workload exactly
	// as a new engine does: same steps, events and metric values,
	// adapters listed in the same order.
	cfg := unitConfig(512, 32, 300)
	cfg.Profile = unitProfile(true)
	cfg.MaxLoRAs = 2
	at1, rs1 := randomWorkload(3, 300)
	at2, rs2 := randomWorkload(4, 300)
	// The first workload meets the second's adapters in the reverse order.
	var order []string
	for _, r := range rs2 {
		if r.Adapter != "" && !slices.Contains(order, r.Adapter) {
			order = append(order, r.Adapter)
		}
	}
	require.Len(t, order, 3)
	for i, a := range slices.Backward(order) {
		rs1[2-i].Adapter = a
	}

	used := runOpen(t, cfg, at1, rs1)
	used.e.Reset()
	reused := &driver{e: used.e}
	var reusedStats []Stats
	runOpenOn(t, reused, at2, rs2, &reusedStats)

	fresh := newDriver(cfg)
	var freshStats []Stats
	runOpenOn(t, fresh, at2, rs2, &freshStats)

	require.Equal(t, fresh.steps, reused.steps)
	require.Equal(t, fresh.events, reused.events)
	require.Equal(t, freshStats, reusedStats)
	assert.Positive(t, fresh.e.Stats().PrefixHits)
}

func TestDeterminismAndInvariants(t *testing.T) {
	cfg := unitConfig(512, 32, 300) // small cache: preemptions happen
	cfg.Profile = unitProfile(true)
	cfg.MaxLoRAs = 2
	at, rs := randomWorkload(42, 400)
	d1 := runOpen(t, cfg, at, rs)
	d2 := runOpen(t, cfg, at, rs)
	require.Equal(t, d1.events, d2.events)
	require.Equal(t, d1.steps, d2.steps)

	st := d1.e.Stats()
	assert.Positive(t, st.Preemptions, "the workload must exercise preemption")
	assert.Positive(t, st.PrefixHits, "and prefix hits")
	first := map[*Request]time.Duration{}
	fin := map[*Request]time.Duration{}
	outputs := 0
	for _, ev := range d1.events {
		switch ev.Kind {
		case FirstToken:
			_, dup := first[ev.Req]
			assert.False(t, dup, "one FirstToken per request")
			first[ev.Req] = ev.At
		case Finished:
			_, dup := fin[ev.Req]
			assert.False(t, dup, "one Finished per request")
			fin[ev.Req] = ev.At
		}
	}
	for i, r := range rs {
		outputs += r.OutputTokens
		require.Contains(t, fin, r)
		assert.LessOrEqual(t, first[r], fin[r])
		assert.Greater(t, first[r], at[i])
	}
	assert.EqualValues(t, outputs, st.GeneratedTokens)
	for _, s := range d1.steps {
		assert.LessOrEqual(t, s.tokens, 512)
		assert.LessOrEqual(t, s.running, 32)
	}
	// Everything is released at the end.
	assert.Equal(t, d1.e.pool.numBlocks, d1.e.pool.numFree)
	assert.Zero(t, st.KVCacheUsage)
	assert.Zero(t, st.Running)
	assert.Zero(t, st.Waiting)
}

func TestSteadyStateDoesNotAllocate(t *testing.T) {
	p, _ := ProfileByName("h100-llama3-8b")
	e := New(DefaultConfig(p))
	_, rs := randomWorkload(7, 64)
	for _, r := range rs {
		r.Adapter = ""
	}
	var out []Event
	run := func() {
		for _, r := range rs {
			_ = e.Add(0, r)
		}
		now := time.Duration(0)
		for {
			d, ok := e.StartStep(now)
			if !ok {
				break
			}
			now += d
			out = e.FinishStep(now, out[:0])
		}
	}
	for range 20 { // warm up: seq structs, block tables, queues, event buffer
		run()
	}
	assert.Zero(t, testing.AllocsPerRun(5, run))
}

// TestBlockPoolModel runs random operations on a block pool and on a
// plain reference model of vLLM's block pool (a free list in order, a
// hash → block map with eager eviction) and requires the same answers:
// which block is taken, what a lookup finds, how many blocks are free.
func TestBlockPoolModel(t *testing.T) {
	for _, c := range []struct{ blocks, hashes int }{{40, 2000}, {1000, 3000}} {
		t.Run(strconv.Itoa(c.blocks), func(t *testing.T) {
			var p blockPool
			p.init(c.blocks)
			rng := rand.New(rand.NewPCG(5, uint64(c.blocks)))
			hs := make([]uint64, c.hashes)
			for i := range hs {
				hs[i] = mix64(uint64(i)+1) | 1
			}
			// Reference model.
			free := make([]int32, c.blocks)
			for i := range free {
				free[i] = int32(i)
			}
			ref := make([]int, c.blocks)
			hashOf := map[int32]uint64{}
			blockOf := map[uint64]int32{}
			var held []int32 // one entry per reference
			releases := 0
			removeFree := func(id int32) {
				for i, f := range free {
					if f == id {
						free = append(free[:i], free[i+1:]...)
						return
					}
				}
				t.Fatalf("block %d not free", id)
			}
			for op := range 30000 {
				switch k := rng.IntN(10); {
				case k < 3 && len(free) > 0: // take
					want := free[0]
					free = free[1:]
					if h, ok := hashOf[want]; ok {
						delete(blockOf, h)
						delete(hashOf, want)
					}
					require.Equal(t, want, p.take(), "op %d", op)
					ref[want] = 1
					held = append(held, want)
				case k < 5 && len(held) > 0: // register a held block
					id := held[rng.IntN(len(held))]
					h := hs[rng.IntN(len(hs))]
					p.register(id, h, noBlock, false)
					if _, ok := hashOf[id]; !ok {
						if _, dup := blockOf[h]; !dup {
							hashOf[id] = h
							blockOf[h] = id
						}
					}
				case k < 7 && len(held) > 0: // release one reference
					i := rng.IntN(len(held))
					id := held[i]
					held = append(held[:i], held[i+1:]...)
					p.release(id)
					releases++
					ref[id]--
					if ref[id] == 0 {
						free = append(free, id)
					}
				default: // look up, and touch a hit
					h := hs[rng.IntN(len(hs))]
					want, wantOK := blockOf[h]
					got, ok := p.lookup(h, noBlock)
					require.Equal(t, wantOK, ok, "op %d", op)
					if ok {
						require.Equal(t, want, got, "op %d", op)
						if ref[got] == 0 {
							removeFree(got)
						}
						ref[got]++
						p.touch(got)
						held = append(held, got)
					}
				}
				require.Equal(t, len(free), p.numFree, "op %d", op)
				require.Equal(t, len(blockOf), p.hashed, "op %d", op)
			}
			assert.Positive(t, p.table.rebuilds, "stale entries were dropped")
			assert.Greater(t, releases, 1024, "more frees than the initial ring holds: it was compacted")
			assert.LessOrEqual(t, len(p.table.e), p.table.maxLen)
		})
	}
}

// TestBlockPoolChainModel drives a block pool the way the engine does —
// requests whose prompts are paths in a tree of blocks look up their
// prefix from the root, take blocks for the rest and register them in
// chunks chained on the parent's holder, and release everything in
// reverse order — and requires the answers of the plain reference model of
// vLLM's block pool (a free list in order, one hash → block map with eager
// eviction): which blocks are taken, and for every hash of a path, which
// block holds it, found by walking the path as a lookup does.
func TestBlockPoolChainModel(t *testing.T) {
	promotions := 0
	for _, c := range []struct{ blocks, nodes int }{{24, 30}, {60, 200}, {400, 600}} {
		blocks, nodes := c.blocks, c.nodes
		t.Run(strconv.Itoa(blocks), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(9, uint64(blocks)))
			// A forest of nodes with 8 roots; node i's path is the chain
			// of hashes from its root to it.
			parentOf := make([]int, nodes)
			hashOf := make([]uint64, nodes)
			for i := range parentOf {
				parentOf[i] = -1
				if i >= 8 {
					parentOf[i] = rng.IntN(i)
				}
				hashOf[i] = mix64(uint64(i)+77) | 1
			}
			path := func(i int) []uint64 {
				var hs []uint64
				for ; i >= 0; i = parentOf[i] {
					hs = append(hs, hashOf[i])
				}
				slices.Reverse(hs)
				return hs
			}

			var p blockPool
			p.init(blocks)
			free := make([]int32, blocks)
			for i := range free {
				free[i] = int32(i)
			}
			ref := make([]int, blocks)
			held := map[int32]uint64{}   // block → hash it holds
			holder := map[uint64]int32{} // hash → block holding it
			removeFree := func(id int32) {
				i := slices.Index(free, id)
				require.GreaterOrEqual(t, i, 0, "block %d not free", id)
				free = slices.Delete(free, i, i+1)
			}
			type job struct {
				hs        []uint64
				blocks    []int32
				numCached int
				holder    int32
			}
			var jobs []*job
			// walk checks every hash of hs against the model, walking as
			// holderOf does.
			walk := func(hs []uint64, op int) {
				parent := noBlock
				for j, h := range hs {
					got, ok := p.lookup(h, parent)
					want, wantOK := holder[h]
					require.Equal(t, wantOK, ok, "op %d, position %d", op, j)
					parent = noBlock
					if ok {
						require.Equal(t, want, got, "op %d, position %d", op, j)
						parent = got + 1
					}
				}
			}
			for op := range 40000 {
				switch k := rng.IntN(10); {
				case k < 3: // a request arrives: look up, touch, take
					hs := path(rng.IntN(nodes))
					jb := &job{hs: hs}
					parent := noBlock
					for _, h := range hs {
						got, ok := p.lookup(h, parent)
						want, wantOK := holder[h]
						require.Equal(t, wantOK, ok, "op %d", op)
						if !ok {
							break
						}
						require.Equal(t, want, got, "op %d", op)
						if ref[got] == 0 {
							removeFree(got)
						}
						ref[got]++
						p.touch(got)
						jb.blocks = append(jb.blocks, got)
						parent = got + 1
					}
					jb.numCached, jb.holder = len(jb.blocks), parent
					for len(jb.blocks) < len(hs) && len(free) > 0 {
						want := free[0]
						free = free[1:]
						if h, ok := held[want]; ok {
							delete(holder, h)
							delete(held, want)
						}
						require.Equal(t, want, p.take(), "op %d", op)
						ref[want] = 1
						jb.blocks = append(jb.blocks, want)
					}
					jobs = append(jobs, jb)
				case k < 6 && len(jobs) > 0: // register a chunk, as cacheFull
					jb := jobs[rng.IntN(len(jobs))]
					if jb.numCached == len(jb.blocks) {
						continue
					}
					limit := jb.numCached + 1 + rng.IntN(len(jb.blocks)-jb.numCached)
					for j := jb.numCached; j < limit; j++ {
						id, h := jb.blocks[j], jb.hs[j]
						if _, dup := holder[h]; !dup {
							holder[h] = id
							held[id] = h
						}
					}
					parent := p.registerChain(jb.blocks, jb.hs, jb.numCached, limit, jb.holder)
					require.Equal(t, holder[jb.hs[limit-1]]+1, parent, "op %d: registerChain returns the holder", op)
					jb.numCached, jb.holder = limit, parent
				case k < 8 && len(jobs) > 0: // a request finishes
					i := rng.IntN(len(jobs))
					jb := jobs[i]
					jobs = slices.Delete(jobs, i, i+1)
					for _, id := range slices.Backward(jb.blocks) {
						p.release(id)
						if ref[id]--; ref[id] == 0 {
							free = append(free, id)
						}
					}
				default:
					walk(path(rng.IntN(nodes)), op)
				}
				require.Equal(t, len(free), p.numFree, "op %d", op)
				require.Equal(t, len(holder), p.hashed, "op %d", op)
			}
			promotions += p.promotions
		})
	}
	assert.Positive(t, promotions, "children of evicted parents were moved to the table")
}

func TestBlockPoolRefindsEvictedParent(t *testing.T) {
	// A and B compute the same prompt h0 h1 h2 at the same time. A
	// registers h0 and h1 first, so B's copies stay uncached and B chains
	// its next chunk on A's block for h1. A finishes and its block for h1
	// is evicted; C computes h0 h1 again (hitting A's h0) before B
	// registers h2. B's h2 must then chain on C's block, where a lookup of
	// the prompt finds it.
	hs := []uint64{mix64(1) | 1, mix64(2) | 1, mix64(3) | 1}
	walk := func(p *blockPool) []int32 {
		var got []int32
		parent := noBlock
		for _, h := range hs {
			b, ok := p.lookup(h, parent)
			parent = noBlock
			if ok {
				parent = b + 1
			} else {
				b = -1
			}
			got = append(got, b)
		}
		return got
	}
	for _, recompute := range []bool{false, true} {
		t.Run(strconv.FormatBool(recompute), func(t *testing.T) {
			var p blockPool
			p.init(8)
			a := []int32{p.take(), p.take()}
			b := []int32{p.take(), p.take(), p.take()}
			spare := p.take()
			holderA := p.registerChain(a, hs, 0, 2, noBlock)
			require.Equal(t, a[1]+1, holderA)
			holderB := p.registerChain(b, hs, 0, 2, noBlock)
			require.Equal(t, a[1]+1, holderB, "B's copies are duplicates")
			p.release(a[1])
			p.release(a[0])
			p.release(spare)
			for range 3 { // the 2 never-used blocks, then A's h1 (freed first)
				p.take()
			}
			require.Equal(t, []int32{a[0], -1, -1}, walk(&p))
			var c int32 = -1
			if recompute {
				h0, ok := p.lookup(hs[0], noBlock)
				require.True(t, ok)
				p.touch(h0)
				c = p.take()
				require.Equal(t, c+1, p.registerChain([]int32{h0, c}, hs, 1, 2, h0+1))
			}
			require.Equal(t, b[2]+1, p.registerChain(b, hs, 2, 3, holderB))
			if recompute {
				assert.Equal(t, []int32{a[0], c, b[2]}, walk(&p))
			} else {
				assert.Equal(t, []int32{a[0], -1, b[2]}, walk(&p))
			}
		})
	}
}

func TestBlockPoolTopBitCollision(t *testing.T) {
	// Two hashes that differ only in the bits a table entry does not keep
	// share one entry: the later registration wins, and a lookup never
	// returns a block holding a different hash.
	var p blockPool
	p.init(8)
	a, b := p.take(), p.take()
	h1 := uint64(0xabcdef0123456789)
	h2 := h1 ^ 1
	p.register(a, h1, noBlock, false)
	p.register(b, h2, noBlock, false)
	_, ok := p.lookup(h1, noBlock)
	assert.False(t, ok)
	got, ok := p.lookup(h2, noBlock)
	require.True(t, ok)
	assert.Equal(t, b, got)
}

func TestEventKindString(t *testing.T) {
	assert.Equal(t, "FirstToken", FirstToken.String())
	assert.Equal(t, "Finished", Finished.String())
	assert.Equal(t, "Preempted", Preempted.String())
	assert.Equal(t, "EventKind(9)", EventKind(9).String())
}

func TestPromptHashesStandInForTheEnginesOwn(t *testing.T) {
	cfg := unitConfig(512, 32, 300)
	cfg.Profile = unitProfile(true)
	cfg.MaxLoRAs = 2
	run := func(hashes func(r *Request) ([]uint64, int)) *driver {
		at, rs := randomWorkload(42, 300)
		for _, r := range rs {
			r.PromptHashes, r.HashTokens = hashes(r)
		}
		return runOpen(t, cfg, at, rs)
	}
	// chain is an independent prefix hash per 16 tokens: FNV-1a over the
	// adapter, then over the content-block id and offset of each token.
	chain := func(r *Request) []uint64 {
		h := fnv.New64a()
		h.Write([]byte(r.Adapter))
		var out []uint64
		covered := min(r.PromptTokens, len(r.Blocks)*r.BlockTokens)
		var buf [16]byte
		for tok := range covered {
			binary.LittleEndian.PutUint64(buf[:8], r.Blocks[tok/r.BlockTokens])
			binary.LittleEndian.PutUint64(buf[8:], uint64(tok%r.BlockTokens))
			h.Write(buf[:])
			if (tok+1)%16 == 0 {
				out = append(out, h.Sum64())
			}
		}
		return out
	}
	unique := func(r *Request) []uint64 {
		out := chain(r)
		for i := range out {
			out[i] = mix64(r.ID<<20|uint64(i)) | 1
		}
		return out
	}
	// outcome is what a run reports per request, by request ID.
	type outcome struct {
		kind                EventKind
		id                  uint64
		at                  time.Duration
		cached, preemptions int
	}
	outcomes := func(d *driver) []outcome {
		out := make([]outcome, len(d.events))
		for i, ev := range d.events {
			out[i] = outcome{ev.Kind, ev.Req.ID, ev.At, ev.CachedTokens, ev.Preemptions}
		}
		return out
	}
	plain := run(func(*Request) ([]uint64, int) { return nil, 0 })
	require.Positive(t, plain.e.Stats().PrefixHits)

	equivalent := run(func(r *Request) ([]uint64, int) { return chain(r), 16 })
	assert.Equal(t, outcomes(plain), outcomes(equivalent), "an equivalent chain gives the same run")
	assert.Equal(t, plain.steps, equivalent.steps)

	used := run(func(r *Request) ([]uint64, int) { return unique(r), 16 })
	assert.Zero(t, used.e.Stats().PrefixHits, "hashes that share nothing are used: no hits")

	for name, h := range map[string]func(r *Request) ([]uint64, int){
		"other block size": func(r *Request) ([]uint64, int) { return unique(r), 32 },
		"too short": func(r *Request) ([]uint64, int) {
			u := unique(r)
			if len(u) == 0 {
				return u, 16
			}
			return u[:len(u)-1], 16
		},
		"a zero hash": func(r *Request) ([]uint64, int) {
			u := unique(r)
			if len(u) > 0 {
				u[0] = 0
			}
			return u, 16
		},
	} {
		ignored := run(h)
		assert.Equal(t, outcomes(plain), outcomes(ignored), "%s: the engine hashes the prompt itself", name)
	}
}

func TestSeqHotFieldsFitOneCacheLine(t *testing.T) {
	// A decode step reads the token counts, the adapter, the flags and the
	// block table's header of every running request: keep them in the
	// first 64 bytes of a seq.
	var s seq
	assert.LessOrEqual(t, unsafe.Offsetof(s.blocks)+unsafe.Sizeof(s.blocks), uintptr(64))
	assert.Less(t, unsafe.Offsetof(s.started), unsafe.Offsetof(s.blocks))
}
