package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/workload"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

func TestClock(t *testing.T) {
	var c Clock
	assert.Equal(t, Epoch, c.Now())
	c.Set(1500 * time.Millisecond)
	assert.Equal(t, Epoch.Add(1500*time.Millisecond), c.Now())
	assert.Equal(t, 1500*time.Millisecond, c.Elapsed())
}

func TestEventQueueOrder(t *testing.T) {
	var q eventQueue
	r := rand.New(rand.NewPCG(1, 2))
	var pushed []event
	for i := range 500 {
		e := event{at: time.Duration(r.IntN(50)), pod: int32(i)}
		q.push(e)
		pushed = append(pushed, e)
	}
	// Expected order: by time, then by push order (pod holds the push index).
	slices.SortStableFunc(pushed, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	for i, want := range pushed {
		got := q.pop()
		require.Equal(t, want.at, got.at, "event %d", i)
		require.Equal(t, want.pod, got.pod, "event %d: ties must keep push order", i)
	}
	assert.Equal(t, 0, q.len())
}

func TestPercentile(t *testing.T) {
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name string
		in   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"single", []float64{7}, 99, 7},
		{"p50 of 10", sorted, 50, 5},
		{"p90 of 10", sorted, 90, 9},
		{"p99 of 10", sorted, 99, 10},
		{"p100", sorted, 100, 10},
		{"p1", sorted, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Percentile(tt.in, tt.p))
		})
	}
}

func TestImbalance(t *testing.T) {
	tests := []struct {
		name   string
		counts []int
		want   float64
	}{
		{"none", []int{0, 0}, 0},
		{"even", []int{5, 5, 5, 5}, 1},
		{"one pod takes all of 4", []int{8, 0, 0, 0}, 4},
		{"3:1", []int{3, 1}, 1.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.InDelta(t, tt.want, imbalance(tt.counts), 1e-12)
		})
	}
}

func TestSLOMet(t *testing.T) {
	slo := SLO{TTFT: time.Second, TPOT: 50 * time.Millisecond}
	assert.True(t, slo.met(1.0, 0.05))
	assert.False(t, slo.met(1.01, 0.01))
	assert.False(t, slo.met(0.1, 0.051))
	assert.True(t, SLO{}.met(100, 100), "the zero SLO has no objective")
}

func TestSLOJSON(t *testing.T) {
	data, err := json.Marshal(SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond})
	require.NoError(t, err)
	assert.JSONEq(t, `{"ttft_s": 2, "tpot_s": 0.1}`, string(data))
	var back SLO
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond}, back)
	require.Error(t, json.Unmarshal([]byte(`{"ttft_s": "x"}`), &back))
}

func TestBlockText(t *testing.T) {
	a := appendBlockText(nil, 42, 64)
	assert.Len(t, a, 64)
	assert.Equal(t, a, appendBlockText(nil, 42, 64), "deterministic per id")
	long := appendBlockText([]byte("x"), 42, 2051)
	assert.Len(t, long, 2052, "appends exactly n bytes")
	assert.Equal(t, a, long[1:65], "a shorter block is a prefix of a longer one")
	assert.Equal(t, a[:5], appendBlockText(nil, 42, 5))
	// Distinct ids give distinct tags: the first 16 bytes spell
	// splitmix64(id), a bijection.
	seen := map[string]uint64{}
	for id := range uint64(10000) {
		tag := string(appendBlockText(nil, id, 16))
		prev, dup := seen[tag]
		require.False(t, dup, "ids %d and %d share a tag", prev, id)
		seen[tag] = id
	}
	for _, c := range long[1:] {
		require.True(t, c == ' ' || c >= 'a' && c <= 'z', "lower-case pseudo-words, got %q", c)
	}
}

// refBlockText is the definition of a block's text spelled out byte by
// byte: the tag letter of each 4-bit digit of splitmix64(id), then the
// corpus read cyclically from splitmix64(splitmix64(id)) mod its size.
func refBlockText(id uint64, n int) []byte {
	h := splitmix64(id)
	out := make([]byte, 0, n)
	for i := 0; i < n && i < tagLen; i++ {
		out = append(out, 'a'+byte(h>>(4*i))&0xf)
	}
	off := int(splitmix64(h) % corpusBytes)
	for i := 0; len(out) < n; i++ {
		out = append(out, corpus[(off+i)%corpusBytes])
	}
	return out
}

func TestBlockTextMatchesDefinition(t *testing.T) {
	for _, id := range []uint64{0, 1, 42, 1 << 40, ^uint64(0)} {
		for _, n := range []int{1, 15, 16, 17, 64, 2048, corpusBytes + tagLen, 2*corpusBytes + 100} {
			require.Equal(t, refBlockText(id, n), appendBlockText(nil, id, n), "id %d, %d bytes", id, n)
		}
	}
	// The prompt is the blocks' texts end to end, cut at the prompt length.
	p := newPromptText()
	var want []byte
	for _, id := range []uint64{5, 6, 7} {
		want = append(want, refBlockText(id, 64)...)
	}
	want = want[:40*BytesPerToken]
	assert.Equal(t, prefix.NewHasher(prefix.HashConfig{}).HashText(nil, "m", "a", want),
		p.hash(nil, "m", "a", []uint64{5, 6, 7}, 16, 40))
}

func TestPromptHashesShareLeadingBlocks(t *testing.T) {
	p := newPromptText()
	// 16-token content blocks are 64 bytes: one hash block each.
	a := p.hash(nil, "m", "", []uint64{1, 2, 3, 4}, 16, 64)
	b := p.hash(nil, "m", "", []uint64{1, 2, 9, 4}, 16, 64)
	require.Len(t, a, 4)
	require.Len(t, b, 4)
	assert.Equal(t, a[:2], b[:2], "shared leading blocks share hashes")
	assert.NotEqual(t, a[2], b[2])
	assert.NotEqual(t, a[3], b[3], "hashes are chained: a change propagates")

	// The adapter seeds the chain: nothing is shared across adapters.
	c := p.hash(nil, "m", "lora-1", []uint64{1, 2, 3, 4}, 16, 64)
	assert.NotEqual(t, a[0], c[0])

	// A 512-token block is 2048 bytes, 32 hash blocks; a prompt of 600
	// tokens over two such blocks is 2400 bytes: 37 full 64-byte blocks.
	d := p.hash(nil, "m", "", []uint64{7, 8}, 512, 600)
	assert.Len(t, d, 37)
}

// fleet returns n pods of the H100 profile.
func fleet(t testing.TB, n int) []Pod {
	pods, err := Fleet(0, repeat(n, H100)...)
	require.NoError(t, err)
	return pods
}

// poissonWorkload generates n single-turn requests at rate req/s with
// ShareGPT-like lengths.
func poissonWorkload(t testing.TB, n int, rate float64) *workload.Workload {
	w, err := workload.Generate(workload.GenConfig{
		Name: "test", Seed: 1, N: n,
		Arrivals: workload.Poisson{Rate: rate},
		Lengths:  ShareGPTLengths,
	})
	require.NoError(t, err)
	return w
}

func TestRunRoundRobinCompletesEverything(t *testing.T) {
	w := poissonWorkload(t, 400, 20)
	cfg := DefaultConfig(fleet(t, 4))
	m, err := New().Run(context.Background(), cfg, w, policy.NewRoundRobin)
	require.NoError(t, err)
	assert.Equal(t, "round-robin", m.Policy)
	assert.Equal(t, 400, m.Requests)
	assert.Equal(t, 400, m.Completed)
	assert.Equal(t, 0, m.Failed)
	assert.Equal(t, []int{100, 100, 100, 100}, m.PerPod, "round-robin spreads 400 requests evenly")
	assert.InDelta(t, 1.0, m.Imbalance, 1e-12)
	assert.Len(t, m.TTFTs, 400)
	assert.Greater(t, m.TTFTMean, 0.0)
	assert.LessOrEqual(t, m.TTFTP50, m.TTFTP99)
	assert.LessOrEqual(t, m.TPOTMean, m.TPOTP99*1.0001)
	// Every output token of the workload is counted once.
	var out int
	for _, r := range w.Requests {
		out += r.OutputTokens
	}
	assert.InDelta(t, float64(out)/m.Span, m.OutputTokensPerSec, 1e-6)
}

func TestRunIsDeterministic(t *testing.T) {
	w := poissonWorkload(t, 150, 40)
	cfg := DefaultConfig(fleet(t, 4))
	for _, name := range policy.Baselines() {
		t.Run(name, func(t *testing.T) {
			f, _ := policy.Default().Lookup(name)
			a, err := New().Run(context.Background(), cfg, w, f)
			require.NoError(t, err)
			s := New()
			// A Sim reused after other runs gives the same result too: one
			// that leaves the pods' caches warm with shared prompts and
			// LoRA adapters, and one cancelled with requests in flight.
			_, err = s.Run(context.Background(), cfg, warmWorkload(t), policy.NewRandom)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			cancelled := func(env policy.Env) (policy.Policy, error) {
				p, err := policy.NewRandom(env)
				return &cancelOnPick{Policy: p, cancel: cancel, at: 50}, err
			}
			_, err = s.Run(ctx, cfg, warmWorkload(t), cancelled)
			require.ErrorIs(t, err, context.Canceled)
			b, err := s.Run(context.Background(), cfg, w, f)
			require.NoError(t, err)
			assert.Equal(t, a, b)
		})
	}
}

// warmWorkload is a short multi-tenant workload with shared system
// prompts, multi-turn conversations and LoRA adapters.
func warmWorkload(t testing.TB) *workload.Workload {
	w, err := workload.Generate(workload.GenConfig{
		Name: "warm", Seed: 3, N: 300,
		Arrivals: workload.Poisson{Rate: 40},
		Lengths:  ShareGPTLengths,
		Tenants: []workload.Tenant{
			{Name: "a", Weight: 1, SystemPromptTokens: 512, SystemPrompts: 2},
			{Name: "b", Weight: 1, SystemPromptTokens: 256, SystemPrompts: 3},
		},
		Conversations: &workload.ConvConfig{Sessions: 20, TurnsMean: 3, ThinkTime: time.Second},
		LoRA:          &workload.LoRAConfig{Adapters: 4, ZipfS: 1.1, Fraction: 0.5},
	})
	require.NoError(t, err)
	return w
}

// cancelOnPick is a policy that calls cancel at its at-th pick.
type cancelOnPick struct {
	policy.Policy
	cancel    context.CancelFunc
	picks, at int
}

func (c *cancelOnPick) Pick(ctx context.Context, req *signals.Request, eps []*signals.Endpoint) (policy.Choice, error) {
	if c.picks++; c.picks == c.at {
		c.cancel()
	}
	return c.Policy.Pick(ctx, req, eps)
}

// TestLoneRequestTTFT checks the simulator's timing against the engine's
// own: one request on an idle fleet has the engine's TTFT plus the network
// delay, and the end-to-end latency likewise.
func TestLoneRequestTTFT(t *testing.T) {
	pods := fleet(t, 2)
	req := workload.Request{
		Arrival: 3 * time.Second, BlockTokens: 16, PromptTokens: 1000, OutputTokens: 20,
		Blocks: make([]uint64, 63),
	}
	for i := range req.Blocks {
		req.Blocks[i] = uint64(1000 + i)
	}
	w := &workload.Workload{Name: "one", Requests: []workload.Request{req}}

	// The engine alone.
	eng := engine.New(pods[0].Engine)
	er := engine.Request{ID: 1, Blocks: req.Blocks, BlockTokens: 16, PromptTokens: 1000, OutputTokens: 20}
	require.NoError(t, eng.Add(0, &er))
	var now, first, end time.Duration
	var evs []engine.Event
	for {
		d, ok := eng.StartStep(now)
		if !ok {
			break
		}
		now += d
		evs = eng.FinishStep(now, evs[:0])
		for _, ev := range evs {
			switch ev.Kind {
			case engine.FirstToken:
				first = ev.At
			case engine.Finished:
				end = ev.At
			}
		}
	}
	require.Positive(t, first)

	cfg := DefaultConfig(pods)
	cfg.NetworkDelay = 700 * time.Microsecond
	m, err := New().Run(context.Background(), cfg, w, policy.NewRoundRobin)
	require.NoError(t, err)
	require.Equal(t, 1, m.Completed)
	assert.InDelta(t, (first + 700*time.Microsecond).Seconds(), m.TTFTMean, 1e-9)
	assert.InDelta(t, (end + 700*time.Microsecond).Seconds(), m.E2EP99, 1e-9)
	assert.InDelta(t, (end-first).Seconds()/19, m.TPOTMean, 1e-9)
}

// probe is a round-robin policy that checks, at every pick, what the
// simulator promises about scrapes and the Inspector, and records every
// Done.
type probe struct {
	t        *testing.T
	env      policy.Env
	cfg      Config
	next     int
	dones    map[int]int
	picks    int
	snapshot int // picks that saw a published snapshot on the chosen pod
}

func (p *probe) Name() string { return "probe" }

func (p *probe) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (policy.Choice, error) {
	now := p.env.Clock.Now()
	ep := eps[p.next%len(eps)]
	p.next++
	id := p.picks
	p.picks++

	er := p.env.Inspector.EngineRequest(req)
	require.NotNil(p.t, er, "the Inspector knows the request being picked")
	require.Equal(p.t, req.PromptTokens, er.PromptTokens)
	view, ok := p.env.Inspector.Pod(ep)
	require.True(p.t, ok)
	require.NotNil(p.t, view.Engine)
	require.Equal(p.t, H100, view.Config.Profile.Name)
	require.Nil(p.t, p.env.Inspector.EngineRequest(&signals.Request{}), "only the request being picked")

	if m := ep.Metrics(); m != nil {
		p.snapshot++
		age := now.Sub(m.ScrapedAt)
		require.GreaterOrEqual(p.t, age, p.cfg.ScrapeLatencyMin, "a snapshot is published no earlier than the scrape latency")
		maxAge := time.Duration(float64(p.cfg.ScrapeInterval)*(1+p.cfg.ScrapeJitter)) + p.cfg.ScrapeLatencyMax
		require.LessOrEqual(p.t, age, maxAge, "a snapshot is replaced within one interval")
		c := ep.Counters()
		require.LessOrEqual(p.t, m.Baseline.Dispatched, c.Dispatched)
		require.True(p.t, m.Running.Known && m.Waiting.Known && m.KVCacheUtilization.Known)
		require.Positive(p.t, m.NumBlocks)
		require.Equal(p.t, 16, m.BlockSize)
	}
	ep.Dispatch(req.PromptTokens)
	tokens := req.PromptTokens
	return policy.Choice{Endpoint: ep, Done: func(o signals.Outcome) {
		p.dones[id]++
		require.NoError(p.t, o.Err)
		require.Positive(p.t, o.TTFT)
		require.GreaterOrEqual(p.t, o.Latency, o.TTFT)
		require.Equal(p.t, tokens, o.PromptTokens)
		require.Positive(p.t, o.CompletionTokens)
		ep.Complete(tokens)
	}}, nil
}

func TestRunScrapesDoneAndInspector(t *testing.T) {
	w := poissonWorkload(t, 300, 30)
	cfg := DefaultConfig(fleet(t, 3))
	var pr *probe
	f := func(env policy.Env) (policy.Policy, error) {
		assert.Len(t, env.Endpoints, 3)
		assert.Equal(t, cfg.Seed, env.Seed)
		pr = &probe{t: t, env: env, cfg: cfg, dones: map[int]int{}}
		return pr, nil
	}
	m, err := New().Run(context.Background(), cfg, w, f)
	require.NoError(t, err)
	assert.Equal(t, 300, m.Completed)
	require.Len(t, pr.dones, 300, "Done called for every request")
	for id, n := range pr.dones {
		require.Equal(t, 1, n, "Done called exactly once for request %d", id)
	}
	assert.Greater(t, pr.snapshot, 250, "after the first interval every pick sees a snapshot")
}

// TestRunUnlabelled: pods carry their profile as the GPU label, which
// gives the picker their speed, unless Config.Unlabelled.
func TestRunUnlabelled(t *testing.T) {
	w := poissonWorkload(t, 20, 30)
	for _, unlabelled := range []bool{false, true} {
		cfg := DefaultConfig(fleet(t, 2))
		cfg.Unlabelled = unlabelled
		var eps []*signals.Endpoint
		f := func(env policy.Env) (policy.Policy, error) {
			eps = env.Endpoints
			return policy.NewRoundRobin(env)
		}
		_, err := New().Run(context.Background(), cfg, w, f)
		require.NoError(t, err)
		require.Len(t, eps, 2)
		for i, ep := range eps {
			speed, labelled := ep.RelativeSpeed()
			if unlabelled {
				assert.Empty(t, ep.Labels, "pod %d", i)
				assert.False(t, labelled, "pod %d", i)
				continue
			}
			assert.Equal(t, cfg.Pods[i].Engine.Profile.Name, ep.Labels[GPULabel], "pod %d", i)
			want, ok := signals.GPURelativeSpeed(cfg.Pods[i].Engine.Profile.Name)
			assert.True(t, ok && labelled, "pod %d", i)
			assert.Equal(t, want, speed, "pod %d", i)
		}
	}
}

func TestRunFailsRequestsThatCannotFit(t *testing.T) {
	pods := fleet(t, 1)
	pods[0].Engine.NumBlocks = 10 // 160 tokens of KV cache
	w := &workload.Workload{Requests: []workload.Request{
		{Arrival: 0, BlockTokens: 16, PromptTokens: 50, OutputTokens: 10, Blocks: []uint64{1, 2, 3, 4}},
		{Arrival: time.Millisecond, BlockTokens: 16, PromptTokens: 5000, OutputTokens: 10, Blocks: []uint64{9}},
	}}
	m, err := New().Run(context.Background(), DefaultConfig(pods), w, policy.NewRoundRobin)
	require.NoError(t, err)
	assert.Equal(t, 1, m.Completed)
	assert.Equal(t, 1, m.Failed)
}

func TestRunErrors(t *testing.T) {
	_, err := New().Run(context.Background(), Config{}, &workload.Workload{}, policy.NewRoundRobin)
	require.ErrorIs(t, err, ErrNoPods)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = New().Run(ctx, DefaultConfig(fleet(t, 2)), poissonWorkload(t, 2000, 50), policy.NewRoundRobin)
	require.ErrorIs(t, err, context.Canceled)
}

func TestMeasureCapacity(t *testing.T) {
	w := poissonWorkload(t, 1200, 10)
	one, err := MeasureCapacity(fleet(t, 1), w)
	require.NoError(t, err)
	require.Positive(t, one.Rate)
	four, err := MeasureCapacity(fleet(t, 4), w)
	require.NoError(t, err)
	// Equal pods are measured once on the first round-robin share.
	assert.Len(t, four.PerPod, 4)
	for _, r := range four.PerPod {
		assert.Equal(t, four.PerPod[0], r)
	}
	assert.InDelta(t, 4*four.PerPod[0], four.Rate, 1e-9)

	mixed, err := Fleet(0, H100, L4)
	require.NoError(t, err)
	mc, err := MeasureCapacity(mixed, w)
	require.NoError(t, err)
	assert.Greater(t, mc.PerPod[0], 2*mc.PerPod[1], "an H100 serves an 8B model more than twice as fast as an L4")

	_, err = MeasureCapacity(nil, w)
	require.ErrorIs(t, err, ErrNoPods)
}

func TestFleet(t *testing.T) {
	pods, err := Fleet(4, H100, A100)
	require.NoError(t, err)
	require.Len(t, pods, 2)
	assert.Equal(t, "h100-0", pods[0].Name)
	assert.Equal(t, "a100-1", pods[1].Name)
	assert.Equal(t, 4, pods[0].Engine.MaxLoRAs)
	assert.Equal(t, 8, pods[0].Engine.MaxCPULoRAs)
	assert.True(t, pods[0].Engine.EnablePrefixCaching)
	_, err = Fleet(0, "tpu-v9")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown profile "tpu-v9"`)
}

func TestShareGPTLengths(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	var ps, os []int
	for range 20000 {
		p, o := ShareGPTLengths.Sample(r)
		require.GreaterOrEqual(t, p, 1)
		require.LessOrEqual(t, p, 7434)
		require.GreaterOrEqual(t, o, 1)
		require.LessOrEqual(t, o, 998)
		ps, os = append(ps, p), append(os, o)
	}
	slices.Sort(ps)
	slices.Sort(os)
	// The medians and 90th percentiles of PROVENANCE.md, within 5%.
	assert.InEpsilon(t, 1730, ps[10000], 0.05)
	assert.InEpsilon(t, 5696, ps[18000], 0.05)
	assert.InEpsilon(t, 415, os[10000], 0.05)
	assert.InEpsilon(t, 834, os[18000], 0.05)
}
