package latency

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// serveOnce runs one request through Dispatched and Completed as the
// picker does, with a fixed load.
func serveOnce(p *Predictor, ep *signals.Endpoint, clk *fakeClock, prompt int, out signals.Outcome) {
	req := &signals.Request{PromptTokens: prompt}
	ep.Dispatch(prompt)
	p.Dispatched(req, ep)
	clk.Advance(time.Millisecond)
	ep.Complete(prompt)
	p.Completed(req, ep, out)
}

// checkSane checks that p's predictions for ep, over prompt sizes and
// cached fractions, its confidence and its explanation are finite and in
// range.
func checkSane(t *testing.T, p *Predictor, ep *signals.Endpoint, msg string) {
	t.Helper()
	for _, prompt := range []int{0, 1, 1000, 100_000, math.MaxInt} {
		for _, c := range []float64{0, 0.5, 1, math.NaN()} {
			v, ok := p.PredictTTFT(&signals.Request{PromptTokens: prompt, Adapter: "a"}, ep, c)
			require.True(t, ok)
			finiteInRange(t, v, fmt.Sprintf("%s: TTFT prompt %d cached %v", msg, prompt, c))
		}
	}
	v, ok := p.PredictTPOT(&signals.Request{}, ep)
	require.True(t, ok)
	finiteInRange(t, v, msg+": TPOT")
	conf := p.Confidence(ep)
	require.True(t, conf >= 0 && conf <= 1, "%s: confidence %v", msg, conf)
	e := p.Explain(ep)
	for i, v := range []float64{e.Samples, e.TPOTSamples, e.Confidence, e.RelativeSpeed, e.Overhead, e.PerKiloToken,
		e.PerKiloQueuedToken, e.PerRunning, e.AtFullKVCache, e.LoRALoad, e.TPOTBase, e.TPOTPerSequence, e.TPOTAtFullKVCache} {
		require.False(t, math.IsNaN(v) || math.IsInf(v, 0), "%s: explanation field %d = %v", msg, i, v)
	}
}

// TestPathologicalConfigsAndOutcomes: every documented config corner
// (no forgetting, the lowest forgetting, a negligible or huge prior, tiny
// or huge prior throughput, a 1 ns confidence half-life) trained with
// zero, negative, huge, sub-floor durations, constant inputs and very few
// samples keeps predictions finite in [0, MaxSeconds] and confidence in
// [0, 1].
func TestPathologicalConfigsAndOutcomes(t *testing.T) {
	configs := []Config{
		{},
		{Forgetting: 1},
		{Forgetting: 0.5},
		{Forgetting: math.Inf(-1)},
		{PriorSamples: 1e-300},
		{PriorSamples: 1e300},
		{PriorThroughput: 1e-300},
		{PriorThroughput: 1e300},
		{FullConfidenceSamples: 1e-300, PriorConfidence: 5, ConfidenceHalfLife: 1},
		{ConfidenceHalfLife: -1, PriorConfidence: -3},
	}
	outcomes := []signals.Outcome{
		{TTFT: time.Nanosecond, Latency: 2 * time.Nanosecond, CompletionTokens: 2},
		{TTFT: time.Duration(math.MaxInt64), Latency: time.Duration(math.MaxInt64), CompletionTokens: 3},
		{TTFT: 0, Latency: time.Second, CompletionTokens: 10},
		{TTFT: -time.Second, Latency: time.Second, CompletionTokens: 10},
		{TTFT: time.Second, Latency: time.Duration(math.MaxInt64), CompletionTokens: 2},
		{TTFT: 500 * time.Millisecond, Latency: time.Second, CompletionTokens: math.MaxInt},
		{TTFT: 200 * time.Millisecond, Latency: 300 * time.Millisecond, CompletionTokens: 11, PromptTokens: 10, CachedTokens: 1 << 40},
	}
	for ci, cfg := range configs {
		t.Run(fmt.Sprintf("config=%d", ci), func(t *testing.T) {
			clk := newFakeClock()
			cfg.Clock = clk
			p := New(cfg)
			labelled := signals.NewEndpoint(signals.EndpointSpec{Name: "l", Labels: map[string]string{signals.LabelGPU: "h100"}})
			plain := signals.NewEndpoint(signals.EndpointSpec{Name: "p"})
			for _, ep := range []*signals.Endpoint{labelled, plain} {
				checkSane(t, p, ep, "cold")
				// One sample, then two.
				serveOnce(p, ep, clk, 1000, signals.Outcome{TTFT: 300 * time.Millisecond, Latency: time.Second, CompletionTokens: 50})
				checkSane(t, p, ep, "one sample")
				serveOnce(p, ep, clk, 1000, signals.Outcome{TTFT: 300 * time.Millisecond, Latency: time.Second, CompletionTokens: 50})
				checkSane(t, p, ep, "two samples")
				for round := 0; round < 200; round++ {
					for oi, out := range outcomes {
						serveOnce(p, ep, clk, []int{0, 1, 4000, math.MaxInt}[(round+oi)%4], out)
					}
				}
				checkSane(t, p, ep, "pathological")
				// A long stretch of identical requests: a singular design.
				for i := 0; i < 2000; i++ {
					serveOnce(p, ep, clk, 1000, signals.Outcome{TTFT: 700 * time.Millisecond})
				}
				checkSane(t, p, ep, "constant")
				clk.Advance(1000 * time.Hour)
				checkSane(t, p, ep, "much later")
				clk.t = clk.t.Add(-2000 * time.Hour) // the clock went back
				checkSane(t, p, ep, "clock went back")
			}
		})
	}
}

// TestConstantInputsLearnTheTarget: identical requests under
// identical load make the least-squares design singular; the ridge keeps
// it solvable and the predictions must still converge to what is observed,
// for every forgetting factor.
func TestConstantInputsLearnTheTarget(t *testing.T) {
	for _, lambda := range []float64{0.5, 0.9, 0.97, 0.999, 1} {
		t.Run(fmt.Sprint(lambda), func(t *testing.T) {
			clk := newFakeClock()
			p := New(Config{Clock: clk, Forgetting: lambda})
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
			for i := 0; i < 500; i++ {
				serveOnce(p, ep, clk, 2000, signals.Outcome{TTFT: 2 * time.Second})
			}
			v, ok := p.PredictTTFT(&signals.Request{PromptTokens: 2000}, ep, 0)
			require.True(t, ok)
			assert.InEpsilon(t, 2.0, v, 0.05)
		})
	}
}

// TestNoForgettingOutlierFirstSample: for every forgetting factor,
// including 1 (no forgetting) and factors close to it, no single
// observation dominates: the relative weights are divided by a running
// geometric mean that forgets as the samples do, so after one short first
// observation (a 1 ms TTFT, at the floor) 300 observations of 2 s bring
// the prediction to 2 s.
func TestNoForgettingOutlierFirstSample(t *testing.T) {
	for _, lambda := range []float64{0.97, 0.999, 1} {
		t.Run(fmt.Sprint(lambda), func(t *testing.T) {
			clk := newFakeClock()
			p := New(Config{Clock: clk, Forgetting: lambda})
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
			serveOnce(p, ep, clk, 2000, signals.Outcome{TTFT: time.Millisecond})
			for i := 0; i < 300; i++ {
				serveOnce(p, ep, clk, 2000, signals.Outcome{TTFT: 2 * time.Second})
			}
			v, ok := p.PredictTTFT(&signals.Request{PromptTokens: 2000}, ep, 0)
			require.True(t, ok)
			assert.InEpsilon(t, 2.0, v, 0.1, "after 300 observations of 2 s (and one of 1 ms) the prediction is %.3f s", v)
		})
	}
}

// TestSpeedUpIsTracked: the mirror of TestPredictorDetectsSlowdown:
// a 1× endpoint that becomes 4× must be ranked ahead of a 2× one within
// the documented horizon (half absorbed after ~23 observations).
func TestSpeedUpIsTracked(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clk := newFakeClock()
			p := New(Config{Clock: clk})
			fleet := newSynthFleet(1, 2)
			rng := rand.New(rand.NewPCG(seed, 9))
			trainFleet(p, clk, rng, fleet, 200)
			ref := synthLoad{prompt: 2000, waiting: 4, running: 8, kv: 0.3}
			require.Greater(t, fleet[0].predict(p, clk, ref), fleet[1].predict(p, clk, ref))
			fleet[0].speed = 4
			detected := -1
			for k := 1; k <= 150; k++ {
				trainFleet(p, clk, rng, fleet, 1)
				if detected < 0 && fleet[0].predict(p, clk, ref) < fleet[1].predict(p, clk, ref) {
					detected = k
				}
			}
			require.Positive(t, detected)
			assert.LessOrEqual(t, detected, 45)
			errs := make([]float64, 0, 300)
			for i := 0; i < 300; i++ {
				l := randomLoad(rng)
				errs = append(errs, math.Abs(fleet[0].predict(p, clk, l)-fleet[0].truth(l))/fleet[0].truth(l))
			}
			assert.LessOrEqual(t, median(errs), 0.08)
		})
	}
}

// TestPredictTTFTLoadMatchesSeparateCalls: "The values are those of
// the two calls it replaces."
func TestPredictTTFTLoadMatchesSeparateCalls(t *testing.T) {
	clk := newFakeClock()
	p := New(Config{Clock: clk, HalfLife: 3 * time.Second})
	fleet := newSynthFleet(1, 2.5)
	rng := rand.New(rand.NewPCG(4, 4))
	trainFleet(p, clk, rng, fleet, 50)
	for i := 0; i < 200; i++ {
		s := fleet[i%2]
		l := randomLoad(rng)
		s.publish(l, clk.Now())
		s.ep.Dispatch(rng.IntN(3000))
		s.ep.SetMetrics(&signals.Metrics{ScrapedAt: clk.Now().Add(-time.Duration(rng.IntN(5000)) * time.Millisecond),
			Baseline: signals.Counters{}, Waiting: signals.Known(float64(l.waiting)), Running: signals.Known(float64(l.running)),
			KVCacheUtilization: signals.Known(l.kv), BlockSize: 16, NumBlocks: 1000})
		now := clk.Now()
		req := &signals.Request{PromptTokens: l.prompt}
		load := s.ep.LoadAt(now, 3*time.Second)
		v, c, ok := p.PredictTTFTLoad(req, s.ep, &load, l.cached, now)
		require.True(t, ok)
		w, ok := p.PredictTTFTAt(req, s.ep, l.cached, now)
		require.True(t, ok)
		assert.InDelta(t, w, v, 1e-9*max(1, w))
		assert.InDelta(t, p.ConfidenceAt(s.ep, now), c, 1e-12)
		clk.Advance(time.Millisecond)
	}
}

// TestConcurrentEverything exercises predictions, dispatches,
// completions (with errors and pathological outcomes), Forget, Retain and
// sweeps from many goroutines (run with -race), then checks sanity.
func TestConcurrentEverything(t *testing.T) {
	p := New(Config{MaxPending: 64, StateTTL: time.Nanosecond})
	eps := newSynthFleet(1, 2, 4, 0.5)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for i := 0; i < 1500; i++ {
				s := eps[rng.IntN(len(eps))]
				req := &signals.Request{PromptTokens: rng.IntN(5000)}
				switch rng.IntN(40) {
				case 0:
					p.Forget(s.ep)
				case 1:
					p.Retain([]*signals.Endpoint{eps[0].ep, eps[1].ep})
				}
				v, _ := p.PredictTTFT(req, s.ep, rng.Float64())
				if math.IsNaN(v) || v < 0 || v > MaxSeconds {
					t.Errorf("prediction %v", v)
					return
				}
				if c := p.Confidence(s.ep); c < 0 || c > 1 {
					t.Errorf("confidence %v", c)
					return
				}
				l := s.ep.LoadAt(time.Now(), 0)
				p.PredictTTFTLoad(req, s.ep, &l, 0.3, time.Now())
				p.PredictTPOT(req, s.ep)
				p.Explain(s.ep)
				s.ep.Dispatch(req.PromptTokens)
				p.Dispatched(req, s.ep)
				s.ep.Complete(req.PromptTokens)
				var err error
				if rng.IntN(10) == 0 {
					err = errors.New("x")
				}
				p.Completed(req, s.ep, signals.Outcome{Err: err, TTFT: time.Duration(rng.IntN(2000)) * time.Millisecond,
					Latency: time.Duration(rng.IntN(5000)) * time.Millisecond, CompletionTokens: rng.IntN(300)})
			}
		}(g)
	}
	wg.Wait()
	assert.LessOrEqual(t, p.pending.len(), 64+8)
	for _, s := range eps {
		for _, c := range []float64{0, 1} {
			v, ok := p.PredictTTFT(&signals.Request{PromptTokens: 1000}, s.ep, c)
			require.True(t, ok)
			finiteInRange(t, v, "after the storm")
		}
	}
}

// TestPendingBoundUnderChurn: outstanding dispatches that never
// complete, across many requests and endpoints, stay within MaxPending,
// and the shards' slabs (each up to its own peak of live entries) stay
// within the shards times the bound. The test is sequential and its clock
// fake; only the shard of an entry depends on addresses, and the bounds
// checked hold whatever the shards: the count is exact after each put,
// and a shard's slab never exceeds the entries it held at once, at most
// the bound plus the one being put (in practice about 12 per shard, 170
// nodes in all).
func TestPendingBoundUnderChurn(t *testing.T) {
	clk := newFakeClock()
	p := New(Config{Clock: clk, MaxPending: 100})
	eps := make([]*signals.Endpoint, 50)
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprint(i)})
	}
	for i := 0; i < 50_000; i++ {
		ep := eps[i%len(eps)]
		p.Dispatched(&signals.Request{PromptTokens: 10}, ep)
		if i%1000 == 0 {
			p.Retain(eps[:1+(i/1000)%len(eps)])
		}
	}
	assert.LessOrEqual(t, p.pending.len(), 100)
	nodes := 0
	for i := range p.pending.shards {
		nodes += len(p.pending.shards[i].nodes)
	}
	assert.LessOrEqual(t, nodes, (100+1)*pendingShards, "slab nodes")
}

// TestLabelledPrior: a labelled H100 starts 2.2× faster on prefill than
// an A100 (signals.GPURelativeSpeed's table).
func TestLabelledPrior(t *testing.T) {
	p := New(Config{})
	h := signals.NewEndpoint(signals.EndpointSpec{Name: "h", Labels: map[string]string{signals.LabelGPU: "H100"}})
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "a", Labels: map[string]string{signals.LabelGPU: "A100"}})
	assert.InDelta(t, 2.2, p.Explain(a).PerKiloToken/p.Explain(h).PerKiloToken, 1e-9)
}

// TestCompletionAfterForgetTeachesNothing: Forget and Retain drop what
// the predictor knows about an endpoint at once; the late completion of a
// request dispatched before does not bring its state back (to linger, and
// train, until the idle sweep), while a completion after the endpoint is
// dispatched to again trains its new state.
func TestCompletionAfterForgetTeachesNothing(t *testing.T) {
	for _, drop := range []string{"Forget", "Retain"} {
		t.Run(drop, func(t *testing.T) {
			clk := newFakeClock()
			p := New(Config{Clock: clk})
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
			other := signals.NewEndpoint(signals.EndpointSpec{Name: "b"})
			req := &signals.Request{PromptTokens: 1000}
			p.Dispatched(req, ep)
			if drop == "Forget" {
				p.Forget(ep)
			} else {
				p.Retain([]*signals.Endpoint{other})
			}
			p.Completed(req, ep, signals.Outcome{TTFT: time.Second})
			_, ok := p.lookup(ep)
			assert.False(t, ok, "a completion after %s recreated the endpoint's state", drop)

			serveOnce(p, ep, clk, 1000, signals.Outcome{TTFT: time.Second})
			_, ok = p.lookup(ep)
			require.True(t, ok)
			assert.Equal(t, 1.0, p.Explain(ep).Samples, "the endpoint back in use learns again, from its new samples only")
		})
	}
}

// TestSetHalfLife: after SetHalfLife a predictor reads scrapes as one built
// with that half-life does (what it learnt kept), and its one-call path
// (PredictTTFTLoad) takes a load corrected with the new half-life.
func TestSetHalfLife(t *testing.T) {
	build := func(hl time.Duration) (*Predictor, []*synthEndpoint, *fakeClock) {
		clk := newFakeClock()
		p := New(Config{Clock: clk, HalfLife: hl})
		fleet := newSynthFleet(1, 2.5)
		trainFleet(p, clk, rand.New(rand.NewPCG(9, 9)), fleet, 40)
		return p, fleet, clk
	}
	changed, fleetC, clk := build(3 * time.Second)
	changed.SetHalfLife(time.Second)
	assert.Equal(t, time.Second, changed.HalfLife())
	built, fleetB, _ := build(time.Second)
	kept, fleetK, _ := build(3 * time.Second)

	stale := func(fleet []*synthEndpoint) {
		for _, s := range fleet {
			s.ep.SetMetrics(&signals.Metrics{ScrapedAt: clk.Now().Add(-2 * time.Second),
				Waiting: signals.Known(6), Running: signals.Known(24), KVCacheUtilization: signals.Known(0.8),
				BlockSize: 16, NumBlocks: 1000})
		}
	}
	stale(fleetC)
	stale(fleetB)
	stale(fleetK)
	req := &signals.Request{PromptTokens: 1500}
	differs := false
	for i := range fleetC {
		now := clk.Now()
		c, ok := changed.PredictTTFTAt(req, fleetC[i].ep, 0.2, now)
		require.True(t, ok)
		b, _ := built.PredictTTFTAt(req, fleetB[i].ep, 0.2, now)
		k, _ := kept.PredictTTFTAt(req, fleetK[i].ep, 0.2, now)
		assert.InDelta(t, b, c, 1e-9*max(1, b), "as if built with the new half-life")
		differs = differs || math.Abs(k-c) > 1e-6
		load := fleetC[i].ep.LoadAt(now, time.Second)
		v, _, ok := changed.PredictTTFTLoad(req, fleetC[i].ep, &load, 0.2, now)
		require.True(t, ok)
		assert.InDelta(t, c, v, 1e-9*max(1, c))
	}
	assert.True(t, differs, "the old half-life reads a 2 s old scrape otherwise")

	changed.SetHalfLife(-time.Second)
	assert.Zero(t, changed.HalfLife(), "negative means 0: scrapes never age")
}
