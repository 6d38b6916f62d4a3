package picker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/inferroute/inferroute/internal/metrictest"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// edgeNoSources are the options that keep the default prefix index and
// latency predictor out of a test (neither publishes anything then).
func edgeNoSources() []Option {
	return []Option{WithPrefixMatcher(signals.NoPrefixMatcher{}), WithLatencyEstimator(signals.NoLatencyEstimator{})}
}

// assertFallbacksContract checks the documented Fallbacks contract: distinct,
// never the pick, at most k.
func assertFallbacksContract(t *testing.T, res Result, k int) bool {
	t.Helper()
	if !assert.LessOrEqual(t, len(res.Fallbacks), k, "fallbacks bounded by Config.Fallbacks") {
		return false
	}
	seen := map[*signals.Endpoint]bool{res.Endpoint: true}
	for i, f := range res.Fallbacks {
		if seen[f] {
			return assert.Fail(t, "fallbacks not distinct or hold the pick",
				"fallback %d (%s) repeats the pick or an earlier fallback: pick %s, fallbacks %v",
				i, f.Name, res.Endpoint.Name, edgeNames(res.Fallbacks))
		}
		seen[f] = true
	}
	return true
}

func edgeNames(eps []*signals.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

// TestSetEndpointsDuplicateFallbacks: a pool that lists the same
// endpoint twice (as a discovery source merging a static list with DNS
// answers can) holds it once, so a pick's Fallbacks never hold the pick
// itself or one endpoint twice, and no endpoint gets a double share of ties.
func TestSetEndpointsDuplicateFallbacks(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a, a, b}, edgeNoSources()...)
	for i := 0; i < 20; i++ {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		ok := assertFallbacksContract(t, res, DefaultFallbacks)
		res.Done(DoneInfo{})
		if !ok {
			break
		}
	}
	assert.Zero(t, a.InFlight()+b.InFlight())
}

// TestBurstNaNPicksWorstEndpoint: with the fleet's throughputs more than
// MaxFloat64 apart, the burst scorer (Normalized, so the picker does not
// clamp it) computed 0 × Inf = NaN for an endpoint with no recent
// dispatches, and a NaN total wins max-score whatever the other scorers say
// (nothing compares greater than NaN). The worst endpoint must not win.
func TestBurstNaNPicksWorstEndpoint(t *testing.T) {
	slow := ep("slow", 0, 50, 0.9) // long queue, nearly full cache
	fast := ep("fast", 0, 0, 0.1)
	other := ep("other", 0, 0, 0.1)
	slow.SetThroughput(1e-10)
	fast.SetThroughput(1e300)
	cfg := Config{Scorers: []Plugin{
		{Name: scorer.ScorerQueue, Weight: 5}, {Name: scorer.ScorerKVCache, Weight: 5}, {Name: scorer.ScorerBurst, Weight: 1},
	}}
	p, _ := newPicker(t, cfg, []*signals.Endpoint{slow, fast, other}, edgeNoSources()...)
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	assertBreakdownSane(t, res.Breakdown)
	assert.NotEqual(t, "slow", res.Endpoint.Name, "the endpoint with the longest queue and fullest cache won:\n%s", res.Breakdown)
	res.Done(DoneInfo{})
}

// TestBurstNaNDuplicatesFallbacks: with more than 8 fallbacks the
// ranking takes rankFallbacksSlow, which, given a NaN total, would compare
// every later candidate against NaN and choose the same NaN candidate again
// and again; the fallbacks must stay distinct.
func TestBurstNaNDuplicatesFallbacks(t *testing.T) {
	eps := []*signals.Endpoint{ep("best", 0, 0, 0)}
	for i := 1; i < 12; i++ {
		eps = append(eps, ep(fmt.Sprintf("e%d", i), 0, 5, 0))
	}
	eps[1].SetThroughput(1e-10) // burst score NaN
	eps[2].SetThroughput(1e300)
	k := 10
	cfg := Config{
		Scorers:   []Plugin{{Name: scorer.ScorerQueue, Weight: 1}, {Name: scorer.ScorerBurst, Weight: 1}},
		Fallbacks: &k,
	}
	p, _ := newPicker(t, cfg, eps, edgeNoSources()...)
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, "best", res.Endpoint.Name)
	assertFallbacksContract(t, res, k)
	assert.Len(t, res.Fallbacks, k)
	res.Done(DoneInfo{})
}

// TestAllZeroWeightsRejected: a configuration whose scorers all weigh
// 0 (a YAML list that forgot the weights, since weight is optional and
// defaults to 0) would score nothing, every pick a tie: it is refused.
func TestAllZeroWeightsRejected(t *testing.T) {
	cfg, err := ParseConfig([]byte("scorers:\n- name: queue\n- name: kv-cache\n"))
	require.NoError(t, err)
	_, err = New(cfg, edgeNoSources()...)
	assert.Error(t, err, "scorers whose weights are all zero should be rejected")
}

// TestParseConfigRejectsTrailingContent: JSON with trailing garbage, two
// concatenated JSON objects, or a second YAML document (with unknown
// fields, even) are errors, not silently ignored after the first.
func TestParseConfigRejectsTrailingContent(t *testing.T) {
	for _, text := range []string{
		`{"fallbacks": 1} trailing garbage`,
		"{\"fallbacks\": 1}\n{\"fallbacks\": 2}\n",
		"fallbacks: 1\n---\nbogusField: 2\n",
	} {
		c, err := ParseConfig([]byte(text))
		if assert.Error(t, err, "ParseConfig(%q) accepted trailing content", text) {
			continue
		}
		if c.Fallbacks != nil {
			t.Logf("parsed fallbacks = %d", *c.Fallbacks)
		}
	}
}

// TestConfigRejectsBadValues checks that the documented validation
// names the bad field.
func TestConfigRejectsBadValues(t *testing.T) {
	for text, want := range map[string]string{
		"scorers: [{name: queue, weight: .nan}]":                      "weight: NaN",
		"scorers: [{name: queue, weight: .inf}]":                      "weight: +Inf",
		"scorers: [{name: queue, weight: -0.5}]":                      "weight: -0.5",
		"fallbacks: 17":                                               "fallbacks: 17",
		"stalenessHalfLife: -1s":                                      "stalenessHalfLife: -1s is negative",
		"stalenessHalfLife: 100":                                      `"100" is not a duration`,
		"strategy: {tieBand: 1.5}":                                    "strategy.tieBand",
		"strategy: {tieBand: .nan}":                                   "strategy.tieBand",
		"strategy: {name: softmax, temperature: .inf}":                "strategy.temperature",
		"strategy: {name: softmax, temperature: -1}":                  "strategy.temperature",
		"filters: [{name: saturation, params: {kvThreshold: .nan}}]":  "kvThreshold",
		"scorers: [{name: prefill, weight: 1, params: {floorMs: 0}}]": "floorMs",
	} {
		cfg, err := ParseConfig([]byte(text))
		if err == nil {
			_, err = New(cfg, edgeNoSources()...)
		}
		if assert.Error(t, err, text) {
			assert.Contains(t, err.Error(), want, text)
		}
	}
}

// TestErrorPathsReleaseEverything: ErrNoEndpoints (empty pool, fail
// closed) and ErrSaturated leave no in-flight or prefill accounting behind,
// and their Done and FirstToken are no-ops.
func TestErrorPathsReleaseEverything(t *testing.T) {
	a := ep("a", 0, 0, 0)
	a.MarkDown()
	adm := admitFunc(func(_ context.Context, in *scorer.Input) (bool, string) {
		return in.Request.Priority >= 0, "shed"
	})
	cfg := Config{Filters: []Plugin{{Name: scorer.FilterHealthy}}, Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}, FailClosed: true}
	p, _ := newPicker(t, cfg, []*signals.Endpoint{a}, WithAdmitter(adm))
	res, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 100})
	require.ErrorIs(t, err, ErrNoEndpoints)
	res.Done(DoneInfo{})
	res.FirstToken()

	a.ReportSuccess(a.HealthMark())
	res, err = p.Pick(context.Background(), &signals.Request{PromptTokens: 100, Priority: -1})
	require.ErrorIs(t, err, ErrSaturated)
	res.Done(DoneInfo{})
	res.FirstToken()

	p.SetEndpoints(nil)
	res, err = p.Pick(context.Background(), &signals.Request{PromptTokens: 100})
	require.ErrorIs(t, err, ErrNoEndpoints)
	res.Done(DoneInfo{})

	assert.Zero(t, a.InFlight())
	assert.Zero(t, a.InFlightTokens())
	r, tok := a.Prefilling()
	assert.Zero(t, r)
	assert.Zero(t, tok)
	c := a.Counters()
	assert.Zero(t, c.Dispatched)
}

// TestConcurrentPickDoneSwap hammers Pick, double and concurrent Done,
// FirstToken racing Done, SetEndpoints and Reconfigure, then checks that
// every endpoint's in-flight and prefill accounting is back to zero and
// that dispatched equals completed (under -race).
func TestConcurrentPickDoneSwap(t *testing.T) {
	var all []*signals.Endpoint
	for i := 0; i < 10; i++ {
		e := ep(fmt.Sprintf("e%d", i), float64(i%3), float64(i%4), float64(i%5)/5)
		all = append(all, e)
	}
	setA, setB := all[:6], all[4:]
	p, _ := newPicker(t, DefaultConfig(), setA)
	cfgs := []Config{DefaultConfig(), {Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}, Strategy: Strategy{Name: StrategySoftmax, Temperature: 0.1}}}
	stopSwaps := swapInBackground(t, p, setA, setB, cfgs, 10*time.Microsecond)
	var failures atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				req := &signals.Request{PromptTokens: 100 + i, PromptBlocks: []uint64{uint64(g), uint64(i % 7)}}
				res, err := p.Pick(context.Background(), req)
				if err != nil {
					failures.Add(1)
					res.Done(DoneInfo{})
					continue
				}
				var inner sync.WaitGroup
				switch i % 4 {
				case 0:
					res.Done(DoneInfo{})
				case 1:
					inner.Add(3)
					go func() { defer inner.Done(); res.Done(DoneInfo{}) }()
					go func() { defer inner.Done(); res.Done(DoneInfo{Err: context.Canceled}) }()
					go func() { defer inner.Done(); res.FirstToken() }()
				case 2:
					res.FirstToken()
					res.FirstToken()
					res.Done(DoneInfo{})
					res.Done(DoneInfo{})
					res.FirstToken()
				case 3:
					inner.Add(2)
					go func() { defer inner.Done(); res.FirstToken() }()
					go func() { defer inner.Done(); res.Done(DoneInfo{}) }()
				}
				inner.Wait()
				res.FirstToken() // after Done, possibly after the record's reuse
			}
		}(g)
	}
	wg.Wait()
	stopSwaps()
	assert.Zero(t, failures.Load())
	for _, e := range all {
		assert.Zero(t, e.InFlight(), e.Name)
		assert.Zero(t, e.InFlightTokens(), e.Name)
		r, tok := e.Prefilling()
		assert.Zero(t, r, e.Name)
		assert.Zero(t, tok, e.Name)
		c := e.Counters()
		assert.Equal(t, c.Dispatched, c.Completed, e.Name)
		assert.Equal(t, c.DispatchedTokens, c.CompletedTokens, e.Name)
	}
}

// TestStaleFirstTokenDoesNotTouchNextPick: a FirstToken on a Result
// whose Done already ran, after its pooled record served another pick on
// the same endpoint, must not end that other pick's prefill.
func TestStaleFirstTokenDoesNotTouchNextPick(t *testing.T) {
	a := ep("a", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a}, edgeNoSources()...)
	old, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 10})
	require.NoError(t, err)
	old.Done(DoneInfo{})
	var live []Result
	for i := 0; i < 50; i++ {
		res, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 10})
		require.NoError(t, err)
		live = append(live, res)
	}
	old.FirstToken()
	old.Done(DoneInfo{})
	r, tok := a.Prefilling()
	assert.EqualValues(t, 50, r)
	assert.EqualValues(t, 500, tok)
	assert.EqualValues(t, 50, a.InFlight())
	for _, res := range live {
		res.Done(DoneInfo{})
	}
	assert.Zero(t, a.InFlight())
}

// TestSeededDecisionsAreDeterministic: two pickers with the same seed
// and pool make the same decisions under every strategy.
func TestSeededDecisionsAreDeterministic(t *testing.T) {
	strategies := []Strategy{{}, {Name: StrategyWeightedRandom}, {Name: StrategySoftmax, Temperature: 0.5}, {TieBand: 0.2}}
	for _, st := range strategies {
		run := func(seed uint64) []string {
			eps := []*signals.Endpoint{ep("a", 1, 1, 0.5), ep("b", 1, 1, 0.5), ep("c", 1, 2, 0.5), ep("d", 1, 1, 0.5)}
			cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}, Strategy: st}
			p, _ := newPicker(t, cfg, eps, append(edgeNoSources(), WithSeed(seed))...)
			var got []string
			for i := 0; i < 200; i++ {
				res, err := p.Pick(context.Background(), nil)
				require.NoError(t, err)
				got = append(got, res.Endpoint.Name)
				res.Done(DoneInfo{})
			}
			return got
		}
		assert.Equal(t, run(42), run(42), "strategy %+v", st)
	}
}

// TestHostileSignalsKeepScoresFinite: endpoints never scraped, scraped
// long ago, with negative, huge and overflowing readings, with throughputs
// far apart (but not so far apart that their ratio overflows, which
// TestBurstNaNPicksWorstEndpoint covers): every score in [0, 1], every total
// finite, fallbacks distinct, in-flight back to zero.
func TestHostileSignalsKeepScoresFinite(t *testing.T) {
	mk := func(name string, m *signals.Metrics, tp float64) *signals.Endpoint {
		e := signals.NewEndpoint(signals.EndpointSpec{Name: name, Address: name + ":1"})
		if m != nil {
			m.Baseline = e.Counters()
			e.SetMetrics(m)
		}
		e.SetThroughput(tp)
		return e
	}
	old := epoch.Add(-time.Hour)
	eps := []*signals.Endpoint{
		mk("never", nil, 0),
		mk("stale-huge", &signals.Metrics{ScrapedAt: old, Waiting: signals.Known(1e308), Running: signals.Known(1e308),
			KVCacheUtilization: signals.Known(2), BlockSize: 1 << 30, NumBlocks: 1 << 30}, 1e-100),
		mk("neg", &signals.Metrics{ScrapedAt: epoch, Waiting: signals.Known(-5), Running: signals.Known(-5),
			KVCacheUtilization: signals.Known(-1)}, 1e200),
		mk("future", &signals.Metrics{ScrapedAt: epoch.Add(time.Hour), Waiting: signals.Known(3)}, 5000),
		mk("zero-time", &signals.Metrics{Waiting: signals.Known(1e300)}, math.Inf(1)),
	}
	k := MaxFallbacks
	cfg := DefaultConfig()
	cfg.Fallbacks = &k
	for _, name := range []string{scorer.ScorerRunning, scorer.ScorerTokenLoad, scorer.ScorerLatency} {
		cfg.Scorers = append(cfg.Scorers, Plugin{Name: name, Weight: 1})
	}
	p, _ := newPicker(t, cfg, eps)
	for i := 0; i < 30; i++ {
		res, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 1000, Adapter: "x", PromptBlocks: []uint64{1, 2, 3},
			SLO: signals.SLO{TTFT: time.Millisecond}})
		require.NoError(t, err)
		b := res.Breakdown
		for c := 0; c < b.Len(); c++ {
			tot := b.Total(c)
			assert.False(t, math.IsNaN(tot) || math.IsInf(tot, 0), "total %v of %s", tot, b.Endpoint(c).Name)
			for s := range b.Scorers() {
				v := b.Score(s, c)
				assert.True(t, v >= 0 && v <= 1, "score %v of %s/%s", v, b.Scorers()[s], b.Endpoint(c).Name)
			}
		}
		assertFallbacksContract(t, res, k)
		if i%2 == 0 {
			res.FirstToken()
		}
		res.Done(DoneInfo{TTFT: time.Duration(i) * time.Millisecond, Latency: time.Second, PromptTokens: 1000, CompletionTokens: 10})
	}
	for _, e := range eps {
		assert.Zero(t, e.InFlight(), e.Name)
	}
}

// TestHugeWeightsOverflowTotals: weights whose sum exceeds
// math.MaxFloat64 would overflow the weighted totals to +Inf, so that
// candidates the scorers tell apart tie and are chosen at random: they
// are refused.
func TestHugeWeightsOverflowTotals(t *testing.T) {
	w := 0.7 * math.MaxFloat64
	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: w}, {Name: scorer.ScorerKVCache, Weight: w}}}
	b, a := ep("b", 0, 0, 0.4), ep("a", 0, 0, 0)
	p, err := New(cfg, edgeNoSources()...)
	if err != nil {
		return // rejecting such weights is a fix too
	}
	p.SetEndpoints([]*signals.Endpoint{b, a})
	wins := map[string]int{}
	for i := 0; i < 40; i++ {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		wins[res.Endpoint.Name]++
		if i == 0 {
			for c := 0; c < res.Breakdown.Len(); c++ {
				assert.False(t, math.IsInf(res.Breakdown.Total(c), 0), "total of %s overflows", res.Breakdown.Endpoint(c).Name)
			}
		}
		res.Done(DoneInfo{})
	}
	assert.Equal(t, 40, wins["a"], "a has the emptier cache and the same queue: %v", wins)
}

// TestOutcomeCarriesDispatchGeneration: the picker reports each outcome to
// its observers with the generation of the endpoint when the request was
// dispatched, whatever the caller gave Done, so that a prefix index tells
// the late failure of a request sent before the server restarted from a
// failure of its new generation: the placement of the request dispatched
// since stays.
func TestOutcomeCarriesDispatchGeneration(t *testing.T) {
	a := ep("a", 0, 0, 0)
	ix, err := prefix.NewIndex(prefix.IndexConfig{Stride: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ix.Close()) })
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}, []*signals.Endpoint{a},
		WithPrefixMatcher(ix), WithLatencyEstimator(signals.NoLatencyEstimator{}))
	blocks := []uint64{0x11, 0x22, 0x33, 0x44}
	cached := func() float64 {
		out := make([]float64, 1)
		ix.Match(&signals.Request{PromptBlocks: blocks}, []*signals.Endpoint{a}, out)
		return out[0]
	}

	old, err := p.Pick(context.Background(), &signals.Request{PromptBlocks: blocks, PromptTokens: 64})
	require.NoError(t, err)
	a.MarkRestarted()
	fresh, err := p.Pick(context.Background(), &signals.Request{PromptBlocks: blocks, PromptTokens: 64})
	require.NoError(t, err)
	require.Same(t, a, fresh.Endpoint)
	// The caller's Generation (here the current one) is replaced by the
	// one the request was dispatched to.
	old.Done(DoneInfo{Err: errors.New("connection reset by the restart"), Generation: a.Generation()})
	assert.Equal(t, 1.0, cached(), "the late failure took away the placement of the request in flight")
	fresh.Done(DoneInfo{TTFT: time.Millisecond})
	assert.Equal(t, 1.0, cached())
}

// TestAssignFeedsTheSignals: a request sent to an endpoint without a pick
// (a router's retry on a fallback) is accounted as a pick's: in flight and
// prefilling on that endpoint until FirstToken and Done, less the share
// of the prompt cached there, and recorded by the prefix index, so that
// the next request with the prompt goes where it was served.
func TestAssignFeedsTheSignals(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 0, 0)
	ix, err := prefix.NewIndex(prefix.IndexConfig{Stride: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ix.Close()) })
	reader := sdkmetric.NewManualReader()
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerPrefix, Weight: 1}}}, []*signals.Endpoint{a, b},
		WithPrefixMatcher(ix), WithLatencyEstimator(signals.NoLatencyEstimator{}),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	req := &signals.Request{PromptBlocks: []uint64{0x11, 0x22, 0x33, 0x44}, PromptTokens: 64}

	res := p.Assign(context.Background(), req, b)
	require.Same(t, b, res.Endpoint)
	assert.Empty(t, res.Fallbacks)
	assert.Equal(t, 0, res.Breakdown.Len())
	assert.Equal(t, int64(1), b.InFlight())
	assert.Equal(t, int64(64), b.InFlightTokens(), "nothing of the prompt is cached on b yet")
	n, tokens := b.Prefilling()
	assert.Equal(t, [2]int64{1, 64}, [2]int64{n, tokens})
	res.FirstToken()
	n, tokens = b.Prefilling()
	assert.Equal(t, [2]int64{0, 0}, [2]int64{n, tokens}, "FirstToken ends the prefill")
	res.Done(DoneInfo{TTFT: time.Millisecond})
	res.Done(DoneInfo{Err: errors.New("a second Done is a no-op")})
	assert.Equal(t, int64(0), b.InFlight())
	assert.Equal(t, int64(0), a.InFlight())

	for range 5 {
		next, err := p.Pick(context.Background(), req)
		require.NoError(t, err)
		assert.Same(t, b, next.Endpoint, "the prompt is cached where the assigned request was served")
		next.Done(DoneInfo{})
	}
	again := p.Assign(context.Background(), req, b)
	assert.Equal(t, int64(0), b.InFlightTokens(), "the whole prompt is cached on b now")
	again.Done(DoneInfo{})

	got := metrictest.Collect(t, reader)
	assert.Equal(t, int64(7), got["inferroute.picks{endpoint=b}"], "five picks and two assignments to b")
	assert.Zero(t, got["inferroute.picks{endpoint=a}"])
	assert.Equal(t, int64(5), got["inferroute.pick.duration"], "assignments are not picks' durations")
}
