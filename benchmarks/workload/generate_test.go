package workload

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func gen(t testing.TB, cfg GenConfig) *Workload {
	t.Helper()
	w, err := Generate(cfg)
	require.NoError(t, err)
	require.Len(t, w.Requests, cfg.N)
	return w
}

// Tolerances below are about three standard errors of the estimate for the
// sample size: the mean gap of n gamma gaps with coefficient of variation
// c has relative standard error c/sqrt(n).
func TestArrivalProcesses(t *testing.T) {
	const n = 50000
	tests := []struct {
		name          string
		arr           Arrivals
		rate, rateTol float64 // relative tolerance
		cv, cvTol     float64 // relative tolerance
	}{
		{"poisson", Poisson{Rate: 50}, 50, 0.02, 1, 0.03},
		{"gamma cv 0.5", Gamma{Rate: 50, CV: 0.5}, 50, 0.01, 0.5, 0.03},
		{"gamma cv 1", Gamma{Rate: 20, CV: 1}, 20, 0.02, 1, 0.03},
		{"gamma cv 2", Gamma{Rate: 50, CV: 2}, 50, 0.03, 2, 0.05},
		{"gamma cv 4", Gamma{Rate: 5, CV: 4}, 5, 0.06, 4, 0.08},
		{"constant", Constant{Rate: 8}, 8, 1e-9, 0, 0},
		// Mean rate (100·1 s + 1·9 s)/10 s = 10.9 req/s.
		{"on/off", &OnOff{BaseRate: 1, BurstRate: 100, On: time.Second, Off: 9 * time.Second}, 10.9, 0.02, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := gen(t, GenConfig{Seed: 7, N: n, Arrivals: tc.arr, Lengths: Fixed{Prompt: 10, Output: 10}})
			s := w.Stats()
			assert.InDelta(t, tc.rate, s.MeanRate, tc.rate*tc.rateTol)
			if tc.cv > 0 {
				assert.InDelta(t, tc.cv, s.InterArrivalCV, tc.cv*tc.cvTol)
			}
			assert.True(t, slices.IsSortedFunc(w.Requests, func(a, b Request) int { return int(a.Arrival - b.Arrival) }))
		})
	}
}

func TestConstantArrivalsAreEven(t *testing.T) {
	w := gen(t, GenConfig{N: 4, Arrivals: Constant{Rate: 4}, Lengths: Fixed{1, 1}})
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{250 * ms, 500 * ms, 750 * ms, 1000 * ms}, arrivals(w))
}

func TestOnOffBursts(t *testing.T) {
	// 100 req/s for 1 s, then 1 req/s for 9 s: of the 109 expected
	// arrivals per 10 s cycle, 100 fall in the On second.
	w := gen(t, GenConfig{Seed: 3, N: 20000, Arrivals: &OnOff{BaseRate: 1, BurstRate: 100, On: time.Second, Off: 9 * time.Second}, Lengths: Fixed{1, 1}})
	on := 0
	for _, r := range w.Requests {
		if r.Arrival%(10*time.Second) < time.Second {
			on++
		}
	}
	assert.InDelta(t, 100.0/109, float64(on)/float64(len(w.Requests)), 0.01)
	idc, peak := w.Burstiness(time.Second)
	assert.Greater(t, idc, 50.0, "strongly over-dispersed")
	// The busiest 1 s window is an On second: Poisson(100) at its maximum
	// over ~180 cycles, between the mean 100 and 100 + 4 sd = 140.
	assert.Greater(t, peak, 100/10.9)
	assert.Less(t, peak, 140/10.9)

	// Pure on/off: nothing arrives in the Off periods.
	w = gen(t, GenConfig{Seed: 3, N: 5000, Arrivals: &OnOff{BurstRate: 50, On: 2 * time.Second, Off: 3 * time.Second}, Lengths: Fixed{1, 1}})
	for _, r := range w.Requests {
		require.Less(t, r.Arrival%(5*time.Second), 2*time.Second)
	}
	assert.InDelta(t, 20, w.Stats().MeanRate, 0.6) // 50·2/5

	// Short bursts in long quiet hours: the cycle position stays exact
	// over weeks of virtual time. Expected 1000·0.001 + 0.001·3600 = 4.6
	// arrivals per 3600.001 s cycle.
	w = gen(t, GenConfig{Seed: 4, N: 2000, Arrivals: &OnOff{BaseRate: 0.001, BurstRate: 1000, On: time.Millisecond, Off: time.Hour}, Lengths: Fixed{1, 1}})
	assert.Greater(t, w.Requests[len(w.Requests)-1].Arrival, 300*time.Hour)
	assert.InDelta(t, 4.6/3600.001, w.Stats().MeanRate, 0.07*4.6/3600.001)
}

func TestGammaSampleMoments(t *testing.T) {
	// Gamma(k, 1) has mean k and variance k.
	for _, k := range []float64{1.0 / 169, 0.25, 1, 4, 30} {
		r := rand.New(rand.NewPCG(1, 2))
		const n = 400000
		var sum, sumSq float64
		for range n {
			x := gammaSample(r, k)
			if !(x >= 0) {
				t.Fatalf("k=%v: sample %v", k, x)
			}
			sum += x
			sumSq += x * x
		}
		mean := sum / n
		variance := sumSq/n - mean*mean
		relSE := 1 / math.Sqrt(k*n) // sd/mean/sqrt(n)
		assert.InDelta(t, k, mean, k*4*relSE, "mean for k=%v", k)
		if k >= 0.25 {
			assert.InDelta(t, k, variance, k*0.05, "variance for k=%v", k)
		}
	}
}

func TestMultiTenantSystemPrompts(t *testing.T) {
	cfg := GenConfig{
		Name: "mt", Seed: 11, N: 4000, Arrivals: Poisson{Rate: 10},
		Lengths: Fixed{Prompt: 1000, Output: 10},
		Tenants: []Tenant{
			{Name: "a", Weight: 3, SystemPromptTokens: 1024, SystemPrompts: 2, Priority: 1, Model: "big"},
			{Name: "b", Weight: 1, SystemPromptTokens: 1000, Priority: -1},
		},
		Model: "small",
	}
	w := gen(t, cfg)
	byTenant := map[string][]Request{}
	for _, r := range w.Requests {
		byTenant[r.Tenant] = append(byTenant[r.Tenant], r)
	}
	na, nb := len(byTenant["a"]), len(byTenant["b"])
	require.Equal(t, cfg.N, na+nb)
	assert.InDelta(t, 0.75, float64(na)/float64(cfg.N), 0.025)

	// Tenant a: 2024-token prompts, 64 full system blocks shared among the
	// requests using the same one of its two prompts.
	firstUse := map[uint64][]uint64{}
	for _, r := range byTenant["a"] {
		require.Equal(t, 2024, r.PromptTokens)
		require.Len(t, r.Blocks, 127) // ceil(2024/16)
		assert.Equal(t, "big", r.Model)
		assert.Equal(t, 1, r.Priority)
		if q, ok := firstUse[r.Blocks[0]]; ok {
			require.Equal(t, q[:64], r.Blocks[:64], "same system prompt, same 64 blocks")
			require.NotEqual(t, q[64], r.Blocks[64], "own text differs")
		} else {
			firstUse[r.Blocks[0]] = r.Blocks
		}
	}
	assert.Len(t, firstUse, 2)
	// Tenant b: 1000-token system prompt = 62 full blocks + 8 tokens that
	// share block 62 with the request's own text, so block 62 is unique.
	var first []uint64
	for _, r := range byTenant["b"] {
		require.Equal(t, 2000, r.PromptTokens)
		assert.Equal(t, "small", r.Model)
		assert.Equal(t, -1, r.Priority)
		if first == nil {
			first = r.Blocks
			continue
		}
		require.Equal(t, first[:62], r.Blocks[:62])
		require.NotEqual(t, first[62], r.Blocks[62])
	}
	// No block is shared across tenants, and generated ids live in name
	// space 3.
	owner := map[uint64]string{}
	for _, r := range w.Requests {
		for _, id := range r.Blocks {
			if id>>56 != 3 {
				t.Fatalf("block id %x outside the generated name space", id)
			}
			if o, ok := owner[id]; ok && o != r.Tenant {
				t.Fatalf("block id %x shared by tenants %q and %q", id, o, r.Tenant)
			}
			owner[id] = r.Tenant
		}
	}
	// Infinite-cache hit fraction: every request but the first user of
	// each system prompt hits it (3 prompts in all).
	hits := float64(na-2)*1024 + float64(nb-1)*62*16
	total := float64(na)*2024 + float64(nb)*2000
	assert.InDelta(t, hits/total, w.Stats().SharedPrefixFraction, 1e-12)
}

func TestConversationsGrow(t *testing.T) {
	cfg := GenConfig{
		Seed: 5, N: 20000, Arrivals: Poisson{Rate: 10}, Lengths: Fixed{Prompt: 100, Output: 50},
		Tenants:       []Tenant{{Name: "t", SystemPromptTokens: 320}},
		Conversations: &ConvConfig{Sessions: 50, TurnsMean: 4, ThinkTime: 2 * time.Second},
	}
	w := gen(t, cfg)
	sessions := map[string][]Request{}
	var order []string
	for _, r := range w.Requests {
		require.NotEmpty(t, r.Session)
		if _, ok := sessions[r.Session]; !ok {
			order = append(order, r.Session)
		}
		sessions[r.Session] = append(sessions[r.Session], r)
	}
	for _, name := range order {
		turns := sessions[name]
		require.Equal(t, 420, turns[0].PromptTokens, "system prompt + first message")
		require.True(t, strings.HasPrefix(name, "t/conv-"), name)
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			// Prompt = previous prompt + its answer + a new message.
			require.Equal(t, prev.PromptTokens+50+100, cur.PromptTokens)
			require.Len(t, cur.Blocks, (cur.PromptTokens+15)/16)
			full := prev.PromptTokens / 16
			require.Equal(t, prev.Blocks[:full], cur.Blocks[:full], "turn %d shares turn %d's full blocks", k, k-1)
			if prev.PromptTokens%16 != 0 {
				// The previous partial block now holds more text: a new id.
				require.NotEqual(t, prev.Blocks[full], cur.Blocks[full])
			}
			require.GreaterOrEqual(t, cur.Arrival-prev.Arrival, 2*time.Second, "think time")
		}
	}
	// Mean turns of the conversations that ended before the last 50 were
	// opened: geometric with mean 4.
	total := 0
	done := order[:len(order)-cfg.Conversations.Sessions]
	for _, name := range done {
		total += len(sessions[name])
	}
	assert.InDelta(t, 4, float64(total)/float64(len(done)), 0.2)
	assert.Greater(t, w.Stats().SharedPrefixFraction, 0.7)
}

func TestConversationsRespectContextLimit(t *testing.T) {
	w := gen(t, GenConfig{
		Seed: 2, N: 3000, Arrivals: Poisson{Rate: 5}, Lengths: Fixed{Prompt: 300, Output: 200},
		Conversations: &ConvConfig{Sessions: 4, TurnsMean: 50, MaxPromptTokens: 2000},
	})
	sessions := map[string]int{}
	for _, r := range w.Requests {
		require.LessOrEqual(t, r.PromptTokens, 2000)
		sessions[r.Session]++
	}
	// Prompts 300, 800, 1300, 1800: at most 4 turns before the limit.
	for name, n := range sessions {
		require.LessOrEqual(t, n, 4, name)
	}
	assert.Contains(t, sessions, "conv-1")
}

func TestLoRAZipfPopularity(t *testing.T) {
	const n = 40000
	w := gen(t, GenConfig{
		Seed: 9, N: n, Arrivals: Poisson{Rate: 100}, Lengths: Fixed{Prompt: 10, Output: 1},
		LoRA: &LoRAConfig{Adapters: 5, ZipfS: 1, Fraction: 0.5},
	})
	counts := map[string]int{}
	with := 0
	for _, r := range w.Requests {
		if r.Adapter != "" {
			counts[r.Adapter]++
			with++
		}
	}
	assert.InDelta(t, 0.5, float64(with)/n, 0.015)
	require.Len(t, counts, 5)
	// P(lora-i) = (1/(i+1)) / H_5, H_5 = 1 + 1/2 + 1/3 + 1/4 + 1/5 = 137/60.
	for i := range 5 {
		want := 60.0 / 137 / float64(i+1)
		assert.InDelta(t, want, float64(counts[AdapterName(i)])/float64(with), 0.015, AdapterName(i))
		if i > 0 {
			assert.Greater(t, counts[AdapterName(i-1)], counts[AdapterName(i)], "popularity ordering")
		}
	}
	assert.Equal(t, "lora-0", AdapterName(0))

	// Conversations keep their adapter across turns.
	w = gen(t, GenConfig{
		Seed: 9, N: 5000, Arrivals: Poisson{Rate: 100}, Lengths: Fixed{Prompt: 10, Output: 1},
		LoRA:          &LoRAConfig{Adapters: 3, ZipfS: 0, Fraction: 1},
		Conversations: &ConvConfig{Sessions: 10, TurnsMean: 5},
	})
	adapter := map[string]string{}
	for _, r := range w.Requests {
		require.NotEmpty(t, r.Adapter)
		if a, ok := adapter[r.Session]; ok {
			require.Equal(t, a, r.Adapter)
		}
		adapter[r.Session] = r.Adapter
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	cfg := func(seed uint64) GenConfig {
		return GenConfig{
			Name: "d", Seed: seed, N: 2000,
			Arrivals:      &OnOff{BaseRate: 2, BurstRate: 40, On: time.Second, Off: 4 * time.Second},
			Lengths:       LengthDist{Prompt: []int{10, 200, 3000}, Output: []int{5, 50, 500}},
			Tenants:       []Tenant{{Name: "x", Weight: 1, SystemPromptTokens: 64}, {Name: "y", Weight: 2}},
			Conversations: &ConvConfig{Sessions: 8, TurnsMean: 3, ThinkTime: time.Second},
			LoRA:          &LoRAConfig{Adapters: 4, ZipfS: 1.2, Fraction: 0.3},
		}
	}
	c := cfg(42)
	a := gen(t, c)
	b := gen(t, c) // the same OnOff value, reset by Generate
	assert.Equal(t, a, b)
	other := gen(t, cfg(43))
	assert.NotEqual(t, arrivals(a), arrivals(other))
	assert.NotEqual(t, a.Requests[0].Blocks, other.Requests[0].Blocks)

	// Content and arrivals use separate streams: changing the tenants
	// leaves the arrival times alone.
	c2 := cfg(42)
	c2.Tenants = nil
	c2.Arrivals = &OnOff{BaseRate: 2, BurstRate: 40, On: time.Second, Off: 4 * time.Second}
	assert.Equal(t, arrivals(a), arrivals(gen(t, c2)))

	// Workloads with different names do not share generated blocks.
	c3 := cfg(42)
	c3.Name = "other"
	ids := map[uint64]bool{}
	for _, r := range a.Requests {
		for _, id := range r.Blocks {
			ids[id] = true
		}
	}
	for _, r := range gen(t, c3).Requests {
		for _, id := range r.Blocks {
			require.False(t, ids[id])
		}
	}
}

func TestGenerateUsesLengthDist(t *testing.T) {
	d := LengthDist{Prompt: []int{100, 7000}, Output: []int{900, 3}}
	w := gen(t, GenConfig{Seed: 1, N: 2000, Arrivals: Poisson{Rate: 1}, Lengths: d})
	pairs := map[[2]int]int{}
	for _, r := range w.Requests {
		pairs[[2]int{r.PromptTokens, r.OutputTokens}]++
	}
	// Rows are drawn whole and uniformly.
	require.Len(t, pairs, 2)
	assert.InDelta(t, 1000, pairs[[2]int{100, 900}], 100)
	assert.InDelta(t, 1000, pairs[[2]int{7000, 3}], 100)

	c := d.Clip(5000, 500)
	assert.Equal(t, []int{100, 5000}, c.Prompt)
	assert.Equal(t, []int{500, 3}, c.Output)
	assert.Equal(t, []int{100, 7000}, d.Prompt, "Clip leaves d alone")
	p, o := LengthDist{}.Sample(nil)
	assert.Equal(t, [2]int{1, 1}, [2]int{p, o})
	p, o = Fixed{}.Sample(nil)
	assert.Equal(t, [2]int{1, 1}, [2]int{p, o})
}

func TestGenerateRejectsBadConfig(t *testing.T) {
	ok := func() GenConfig { return GenConfig{N: 10, Arrivals: Poisson{Rate: 1}, Lengths: Fixed{1, 1}} }
	tests := []struct {
		name   string
		edit   func(*GenConfig)
		substr string
	}{
		{"no requests", func(c *GenConfig) { c.N = 0 }, "N = 0"},
		{"no arrivals", func(c *GenConfig) { c.Arrivals = nil }, "no Arrivals"},
		{"zero rate", func(c *GenConfig) { c.Arrivals = Poisson{} }, "Poisson rate 0"},
		{"gamma cv", func(c *GenConfig) { c.Arrivals = Gamma{Rate: 1} }, "Gamma CV 0"},
		{"gamma rate", func(c *GenConfig) { c.Arrivals = Gamma{Rate: math.Inf(1), CV: 1} }, "Gamma rate"},
		{"constant rate", func(c *GenConfig) { c.Arrivals = Constant{Rate: -1} }, "Constant rate"},
		{"on/off period", func(c *GenConfig) { c.Arrivals = &OnOff{BurstRate: 1, On: time.Second} }, "OnOff periods"},
		{"on/off rates", func(c *GenConfig) { c.Arrivals = &OnOff{On: time.Second, Off: time.Second} }, "positive base or burst"},
		{"on/off negative", func(c *GenConfig) { c.Arrivals = &OnOff{BaseRate: -1, BurstRate: 1, On: time.Second, Off: time.Second} }, "non-negative"},
		{"no lengths", func(c *GenConfig) { c.Lengths = nil }, "no LengthSampler"},
		{"block tokens", func(c *GenConfig) { c.BlockTokens = -16 }, "BlockTokens"},
		{"tenant weight", func(c *GenConfig) { c.Tenants = []Tenant{{Name: "a", Weight: -1}} }, "weight -1"},
		{"tenant prompt", func(c *GenConfig) { c.Tenants = []Tenant{{Name: "a", SystemPromptTokens: -1}} }, "negative system prompt"},
		{"duplicate tenant", func(c *GenConfig) { c.Tenants = []Tenant{{Name: "a"}, {Name: "a"}} }, "duplicate tenant"},
		{"sessions", func(c *GenConfig) { c.Conversations = &ConvConfig{TurnsMean: 2} }, "Sessions = 0"},
		{"turns", func(c *GenConfig) { c.Conversations = &ConvConfig{Sessions: 1, TurnsMean: 0.5} }, "TurnsMean = 0.5"},
		{"think", func(c *GenConfig) { c.Conversations = &ConvConfig{Sessions: 1, TurnsMean: 1, ThinkTime: -1} }, "ThinkTime"},
		{"context", func(c *GenConfig) { c.Conversations = &ConvConfig{Sessions: 1, TurnsMean: 1, MaxPromptTokens: -1} }, "MaxPromptTokens"},
		{"adapters", func(c *GenConfig) { c.LoRA = &LoRAConfig{Fraction: 0.5} }, "Adapters = 0"},
		{"zipf", func(c *GenConfig) { c.LoRA = &LoRAConfig{Adapters: 2, ZipfS: -1} }, "ZipfS"},
		{"fraction", func(c *GenConfig) { c.LoRA = &LoRAConfig{Adapters: 2, Fraction: 1.5} }, "Fraction = 1.5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.edit(&c)
			_, err := Generate(c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.substr)
			assert.Contains(t, err.Error(), "workload: Generate: ")
		})
	}
	_, err := Generate(ok())
	require.NoError(t, err)
}

func TestTenantWeightsAllZeroShareEqually(t *testing.T) {
	w := gen(t, GenConfig{Seed: 1, N: 10000, Arrivals: Poisson{Rate: 1}, Lengths: Fixed{1, 1},
		Tenants: []Tenant{{Name: "a"}, {Name: "b"}}})
	assert.InDelta(t, 5000, len(w.Tenant("a").Requests), 200)
}
