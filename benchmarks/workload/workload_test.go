package workload

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func arrivals(w *Workload) []time.Duration {
	out := make([]time.Duration, len(w.Requests))
	for i, r := range w.Requests {
		out[i] = r.Arrival
	}
	return out
}

func reqAt(ms int, tenant string) Request {
	return Request{Arrival: time.Duration(ms) * time.Millisecond, Tenant: tenant, PromptTokens: 1, OutputTokens: 1, BlockTokens: 16, Blocks: []uint64{uint64(ms)}}
}

func TestMerge(t *testing.T) {
	a := &Workload{Name: "a", Requests: []Request{reqAt(0, "a"), reqAt(10, "a"), reqAt(20, "a")}}
	b := &Workload{Name: "b", Requests: []Request{reqAt(5, "b"), reqAt(10, "b"), reqAt(30, "b")}}

	t.Run("interleave with stable ties", func(t *testing.T) {
		m := Merge(a, nil, b)
		assert.Equal(t, "a+b", m.Name)
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{0, 5 * ms, 10 * ms, 10 * ms, 20 * ms, 30 * ms}, arrivals(m))
		assert.Equal(t, "a", m.Requests[2].Tenant)
		assert.Equal(t, "b", m.Requests[3].Tenant)
		assert.True(t, m.Start.IsZero())
		// Inputs are untouched.
		assert.Len(t, a.Requests, 3)
		assert.Equal(t, 5*ms, b.Requests[0].Arrival)
	})
	t.Run("aligned on start times", func(t *testing.T) {
		t0 := time.Date(2023, 11, 16, 18, 0, 0, 0, time.UTC)
		a2, b2 := *a, *b
		a2.Start = t0.Add(time.Second)
		b2.Start = t0
		m := Merge(&a2, &b2)
		assert.True(t, t0.Equal(m.Start))
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{5 * ms, 10 * ms, 30 * ms, 1000 * ms, 1010 * ms, 1020 * ms}, arrivals(m))
	})
	t.Run("empty", func(t *testing.T) {
		m := Merge()
		assert.Empty(t, m.Requests)
		assert.Equal(t, Stats{}, m.Stats())
	})
}

func TestScaleKeepsBurstShape(t *testing.T) {
	// Gaps 1 s, 3 s: mean rate 2/4 s = 0.5 req/s.
	w := &Workload{Requests: []Request{reqAt(1000, ""), reqAt(2000, ""), reqAt(5000, "")}}
	require.InDelta(t, 0.5, w.Stats().MeanRate, 1e-12)
	s := w.Scale(2) // four times faster
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{250 * ms, 500 * ms, 1250 * ms}, arrivals(s))
	assert.InDelta(t, 2, s.Stats().MeanRate, 1e-12)
	assert.InDelta(t, w.Stats().InterArrivalCV, s.Stats().InterArrivalCV, 1e-12)
	assert.Equal(t, 1000*ms, w.Requests[0].Arrival, "receiver unchanged")

	// A real bursty trace keeps its CV at any rate.
	code, err := LoadAzure(openTrace(t, AzureCodeFile), "code")
	require.NoError(t, err)
	for _, rate := range []float64{1, 10, 100} {
		st := code.Scale(rate).Stats()
		assert.InDelta(t, rate, st.MeanRate, rate*1e-6)
		assert.InDelta(t, 13.15, st.InterArrivalCV, 0.005)
	}

	one := &Workload{Requests: []Request{reqAt(7, "")}}
	assert.Equal(t, arrivals(one), arrivals(one.Scale(3)), "no rate to scale")
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		assert.Panics(t, func() { w.Scale(bad) })
	}
}

func TestLimitAndWindow(t *testing.T) {
	w := &Workload{Name: "w", Start: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
	for ms := 0; ms < 10; ms++ {
		w.Requests = append(w.Requests, reqAt(100*ms, ""))
	}
	ms := time.Millisecond
	tests := []struct {
		name string
		got  *Workload
		want []time.Duration
	}{
		{"limit 3", w.Limit(3), []time.Duration{0, 100 * ms, 200 * ms}},
		{"limit 0", w.Limit(0), []time.Duration{}},
		{"limit beyond", w.Limit(99), arrivals(w)},
		{"window", w.Window(250*ms, 500*ms), []time.Duration{50 * ms, 150 * ms}},
		{"window inclusive start", w.Window(300*ms, 400*ms), []time.Duration{0}},
		{"window empty", w.Window(950*ms, 2000*ms), []time.Duration{}},
		{"window reversed", w.Window(500*ms, 100*ms), []time.Duration{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, arrivals(tc.got))
			assert.Equal(t, "w", tc.got.Name)
		})
	}
	assert.True(t, w.Start.Add(250*ms).Equal(w.Window(250*ms, 500*ms).Start))
	assert.Len(t, w.Requests, 10, "receiver unchanged")
}

func TestStats(t *testing.T) {
	blk := func(ids ...uint64) []uint64 { return ids }
	w := &Workload{Requests: []Request{
		{Arrival: 0, PromptTokens: 48, OutputTokens: 10, BlockTokens: 16, Blocks: blk(1, 2, 3), Tenant: "a", Session: "s1"},
		// Shares blocks 1, 2 with the first: 32 tokens.
		{Arrival: time.Second, PromptTokens: 40, OutputTokens: 20, BlockTokens: 16, Blocks: blk(1, 2, 4), Tenant: "a", Session: "s1"},
		// Same ids, other adapter: no hit.
		{Arrival: 2 * time.Second, PromptTokens: 48, OutputTokens: 30, BlockTokens: 16, Blocks: blk(1, 2, 3), Tenant: "b", Adapter: "x"},
		// Block 2 at position 0 is not the prefix (1, 2): no hit.
		{Arrival: 4 * time.Second, PromptTokens: 32, OutputTokens: 40, BlockTokens: 16, Blocks: blk(2, 3)},
		// Whole prompt cached, last block partial: all 40 tokens hit.
		{Arrival: 8 * time.Second, PromptTokens: 40, OutputTokens: 50, BlockTokens: 16, Blocks: blk(1, 2, 4)},
	}}
	s := w.Stats()
	assert.Equal(t, 5, s.Requests)
	assert.Equal(t, 8*time.Second, s.Duration)
	assert.InDelta(t, 0.5, s.MeanRate, 1e-12)
	// Gaps 1, 1, 2, 4 s: mean 2, population sd sqrt((1+1+0+4)/4) = sqrt(1.5).
	assert.InDelta(t, math.Sqrt(1.5)/2, s.InterArrivalCV, 1e-12)
	assert.InDelta(t, (48+40+48+32+40)/5.0, s.PromptMean, 1e-12)
	// Sorted prompts 32 40 40 48 48: ranks ceil(2.5)=3, ceil(4.5)=5, ceil(4.95)=5.
	assert.Equal(t, []int{40, 48, 48}, []int{s.PromptP50, s.PromptP90, s.PromptP99})
	assert.Equal(t, []int{30, 50, 50}, []int{s.OutputP50, s.OutputP90, s.OutputP99})
	assert.InDelta(t, (32+40)/208.0, s.SharedPrefixFraction, 1e-12)
	assert.InDelta(t, 5/14.0, s.SharedBlockFraction, 1e-12)
	assert.Equal(t, 2, s.Tenants)
	assert.Equal(t, 1, s.Sessions)
	assert.Equal(t, 1, s.Adapters)
	assert.InDelta(t, 0.2, s.AdapterFraction, 1e-12)
	assert.Contains(t, s.String(), "5 requests over 8s (0.50 req/s")

	a := w.Tenant("a")
	assert.Len(t, a.Requests, 2)
	assert.Equal(t, "a", a.Name)
}

func TestBurstiness(t *testing.T) {
	w := &Workload{Requests: []Request{reqAt(0, ""), reqAt(100, ""), reqAt(900, ""), reqAt(2500, ""), reqAt(3000, "")}}
	// Windows of 1 s from the first arrival. Counts over [0,1),[1,2),[2,3),[3,4): 3, 0, 1, 1 -> mean 1.25,
	// variance (9+0+1+1)/4 - 1.5625 = 1.1875.
	idc, peak := w.Burstiness(time.Second)
	assert.InDelta(t, 1.1875/1.25, idc, 1e-12)
	assert.InDelta(t, 3/1.25, peak, 1e-12)
	idc, peak = (&Workload{}).Burstiness(time.Second)
	assert.Zero(t, idc)
	assert.Zero(t, peak)
	idc, _ = w.Burstiness(0)
	assert.Zero(t, idc)
}

// refSharedPrefix is sharedPrefix with a Go map for the set of prefix
// positions seen.
func refSharedPrefix(rs []Request) (tokens, blocks float64) {
	seen := map[uint64]bool{}
	var hitTokens, allTokens, hitBlocks, allBlocks int
	for _, r := range rs {
		h := hashString(r.Adapter)
		hit, inRun := 0, true
		for _, id := range r.Blocks {
			h = mix(h, id)
			if seen[h] && inRun {
				hit++
				continue
			}
			inRun = false
			seen[h] = true
		}
		hitBlocks += hit
		allBlocks += len(r.Blocks)
		hitTokens += min(hit*r.BlockTokens, r.PromptTokens)
		allTokens += r.PromptTokens
	}
	return float64(hitTokens) / float64(allTokens), float64(hitBlocks) / float64(allBlocks)
}

func TestSharedPrefixMatchesMapReference(t *testing.T) {
	w, err := Generate(GenConfig{
		Name: "ref", Seed: 9, N: 2000,
		Arrivals: Poisson{Rate: 10},
		Lengths:  Fixed{Prompt: 700, Output: 10},
		Tenants: []Tenant{
			{Name: "a", Weight: 1, SystemPromptTokens: 300, SystemPrompts: 3},
			{Name: "b", Weight: 2},
		},
		Conversations: &ConvConfig{Sessions: 50, TurnsMean: 4, ThinkTime: time.Second},
		LoRA:          &LoRAConfig{Adapters: 3, ZipfS: 1, Fraction: 0.3},
	})
	require.NoError(t, err)
	wantTokens, wantBlocks := refSharedPrefix(w.Requests)
	require.Positive(t, wantTokens)
	gotTokens, gotBlocks := sharedPrefix(w.Requests)
	assert.Equal(t, wantTokens, gotTokens)
	assert.Equal(t, wantBlocks, gotBlocks)
}

func TestHashSet(t *testing.T) {
	s := newHashSet(100)
	for _, h := range []uint64{0, 1, 17, 17 + 1<<40, 1 << 63} {
		assert.False(t, s.add(h), "%d is new", h)
		assert.True(t, s.add(h), "%d is there", h)
	}
	for i := range uint64(90) {
		s.add(i<<8 | 3) // collide in the low bits
	}
	assert.True(t, s.add(89<<8|3))
	assert.False(t, s.add(90<<8|3))
}
