package picker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inferroute/inferroute/internal/metrictest"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/signalstest"
)

var epoch = time.Unix(1_700_000_000, 0)

func loadCfg(scorers ...Plugin) Config {
	return Config{
		Filters: []Plugin{{Name: scorer.FilterHealthy}, {Name: scorer.FilterSaturation}},
		Scorers: scorers,
	}
}

// assertBreakdownSane checks that every candidate's total in b is a
// number and every score in [0, 1]; it reports whether they all were.
func assertBreakdownSane(t *testing.T, b Breakdown) bool {
	t.Helper()
	ok := true
	for c := 0; c < b.Len(); c++ {
		ok = assert.False(t, math.IsNaN(b.Total(c)), "total of %s is NaN", b.Endpoint(c).Name) && ok
		for s := range b.Scorers() {
			v := b.Score(s, c)
			ok = assert.True(t, v >= 0 && v <= 1, "score %v of %s/%s", v, b.Scorers()[s], b.Endpoint(c).Name) && ok
		}
	}
	return ok
}

func newPicker(t *testing.T, cfg Config, eps []*signals.Endpoint, opts ...Option) (*Picker, *signalstest.Clock) {
	t.Helper()
	clk := signalstest.NewClock(epoch)
	p, err := New(cfg, append([]Option{WithClock(clk)}, opts...)...)
	require.NoError(t, err)
	p.SetEndpoints(eps)
	return p, clk
}

func ep(name string, running, waiting, kv float64) *signals.Endpoint {
	return signalstest.Endpoint(name, signalstest.Load{Running: running, Waiting: waiting, KV: kv, ScrapedAt: epoch})
}

func TestPickChoosesByScore(t *testing.T) {
	tests := []struct {
		name    string
		scorers []Plugin
		eps     []*signals.Endpoint
		want    string
	}{
		{
			name:    "shortest queue",
			scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}},
			eps:     []*signals.Endpoint{ep("a", 4, 9, 0.2), ep("b", 4, 1, 0.2), ep("c", 4, 5, 0.2)},
			want:    "b",
		},
		{
			name:    "emptiest kv cache",
			scorers: []Plugin{{Name: scorer.ScorerKVCache, Weight: 1}},
			eps:     []*signals.Endpoint{ep("a", 1, 0, 0.7), ep("b", 1, 0, 0.5), ep("c", 1, 0, 0.1)},
			want:    "c",
		},
		{
			name:    "weights decide between disagreeing scorers",
			scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}, {Name: scorer.ScorerKVCache, Weight: 5}},
			// a: shortest queue, fullest cache; b: longer queue, emptier cache.
			eps:  []*signals.Endpoint{ep("a", 1, 0, 0.9), ep("b", 1, 3, 0.1)},
			want: "b",
		},
		{
			name:    "single endpoint",
			scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}},
			eps:     []*signals.Endpoint{ep("only", 100, 100, 0.99)},
			want:    "only",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newPicker(t, loadCfg(tt.scorers...), tt.eps)
			res, err := p.Pick(context.Background(), &signals.Request{Model: "m"})
			require.NoError(t, err)
			assert.Equal(t, tt.want, res.Endpoint.Name)
			res.Done(DoneInfo{})
		})
	}
}

func TestPickEmptyPool(t *testing.T) {
	p, _ := newPicker(t, loadCfg(), nil)
	res, err := p.Pick(context.Background(), nil)
	require.ErrorIs(t, err, ErrNoEndpoints)
	var pe *Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "pool", pe.Stage)
	require.NotNil(t, res.Done, "Done is never nil")
	res.Done(DoneInfo{}) // a no-op, must not panic
}

func TestAllFilteredOut(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 3, 0)
	a.MarkDown()
	b.MarkDown()

	t.Run("fail open keeps the candidates", func(t *testing.T) {
		p, _ := newPicker(t, loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 1}), []*signals.Endpoint{a, b})
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		assert.Equal(t, "a", res.Endpoint.Name, "least-bad endpoint: shortest queue")
		res.Done(DoneInfo{})
	})
	t.Run("fail closed names the filter", func(t *testing.T) {
		a.MarkDown() // the success reported above brought a back
		cfg := loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 1})
		cfg.FailClosed = true
		p, _ := newPicker(t, cfg, []*signals.Endpoint{a, b})
		_, err := p.Pick(context.Background(), nil)
		require.ErrorIs(t, err, ErrNoEndpoints)
		var pe *Error
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "filter", pe.Stage)
		assert.Equal(t, scorer.FilterHealthy, pe.Plugin)
		assert.Equal(t, 2, pe.Candidates)
		assert.Zero(t, a.InFlight()+b.InFlight(), "nothing dispatched")
	})
}

func TestSaturationKeepsLeastSaturated(t *testing.T) {
	eps := []*signals.Endpoint{ep("a", 0, 100, 0.99), ep("b", 0, 70, 0.97), ep("c", 0, 200, 0.2)}
	p, _ := newPicker(t, Config{Filters: []Plugin{{Name: scorer.FilterSaturation}}}, eps)
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	// saturation = max(kv/0.95, queue/64): a 1.56, b 1.09, c 3.1.
	assert.Equal(t, "b", res.Endpoint.Name)
	assert.Equal(t, 1, res.Breakdown.Len())
	res.Done(DoneInfo{})
}

func TestHostileMetricValues(t *testing.T) {
	bad := []*signals.Endpoint{
		ep("nan", math.NaN(), math.NaN(), math.NaN()),
		ep("inf", math.Inf(1), math.Inf(1), math.Inf(1)),
		ep("neg", -5, -5, -1),
		ep("huge", 1e308, 1e308, 1e308),
	}
	// signalstest treats negative counts as unreported; publish a real
	// negative reading too.
	neg := signals.NewEndpoint(signals.EndpointSpec{Name: "negative"})
	neg.SetMetrics(&signals.Metrics{ScrapedAt: epoch,
		Waiting: signals.Reading{Value: -3, Known: true}, Running: signals.Reading{Value: -1, Known: true},
		KVCacheUtilization: signals.Reading{Value: -0.5, Known: true}})
	bad = append(bad, neg)
	all := []Plugin{
		{Name: scorer.ScorerQueue, Weight: 2}, {Name: scorer.ScorerKVCache, Weight: 2},
		{Name: scorer.ScorerRunning, Weight: 1}, {Name: scorer.ScorerLoRA, Weight: 1},
		{Name: scorer.ScorerTokenLoad, Weight: 1},
	}
	p, _ := newPicker(t, loadCfg(all...), bad)
	for i := 0; i < 50; i++ {
		res, err := p.Pick(context.Background(), &signals.Request{Adapter: "x", PromptTokens: 100})
		require.NoError(t, err)
		if !assertBreakdownSane(t, res.Breakdown) {
			return
		}
		res.Done(DoneInfo{})
	}
}

func TestTieBreakIsRandomAndSeeded(t *testing.T) {
	run := func(seed uint64) map[string]int {
		eps := []*signals.Endpoint{ep("a", 1, 1, 0.5), ep("b", 1, 1, 0.5), ep("c", 1, 1, 0.5)}
		p, _ := newPicker(t, Config{}, eps, WithSeed(seed))
		got := map[string]int{}
		for i := 0; i < 3000; i++ {
			res, err := p.Pick(context.Background(), nil)
			require.NoError(t, err)
			got[res.Endpoint.Name]++
			res.Done(DoneInfo{})
		}
		return got
	}
	got := run(7)
	for _, name := range []string{"a", "b", "c"} {
		assert.InDelta(t, 1000, got[name], 150, "uniform tie-break, %s: %v", name, got)
	}
	assert.Equal(t, got, run(7), "same seed, same decisions")
}

func TestStrategies(t *testing.T) {
	// Queue scores: a 1, b 0.5, c 0 (InverseMinMax over 0, 2, 4).
	mk := func() []*signals.Endpoint {
		return []*signals.Endpoint{ep("a", 0, 0, 0), ep("b", 0, 2, 0), ep("c", 0, 4, 0)}
	}
	count := func(cfg Config) map[string]int {
		p, _ := newPicker(t, cfg, mk())
		got := map[string]int{}
		for i := 0; i < 6000; i++ {
			res, err := p.Pick(context.Background(), nil)
			require.NoError(t, err)
			got[res.Endpoint.Name]++
			res.Done(DoneInfo{}) // keep the queues as scraped
		}
		return got
	}
	queue := []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}

	t.Run("max-score", func(t *testing.T) {
		got := count(Config{Scorers: queue})
		assert.Equal(t, 6000, got["a"])
	})
	t.Run("weighted-random is proportional to the total", func(t *testing.T) {
		got := count(Config{Scorers: queue, Strategy: Strategy{Name: StrategyWeightedRandom}})
		assert.InDelta(t, 4000, got["a"], 200, "%v", got) // 1/(1+0.5)
		assert.InDelta(t, 2000, got["b"], 200, "%v", got)
		assert.Zero(t, got["c"], "zero total is never drawn")
	})
	t.Run("softmax follows exp(total/T)", func(t *testing.T) {
		got := count(Config{Scorers: queue, Strategy: Strategy{Name: StrategySoftmax, Temperature: 0.5}})
		// weights e^2, e^1, e^0 → 0.665, 0.245, 0.090
		assert.InDelta(t, 6000*0.665, got["a"], 200, "%v", got)
		assert.InDelta(t, 6000*0.245, got["b"], 150, "%v", got)
		assert.InDelta(t, 6000*0.090, got["c"], 100, "%v", got)
	})
}

func TestFallbacksAreRanked(t *testing.T) {
	eps := []*signals.Endpoint{ep("d", 0, 6, 0), ep("a", 0, 0, 0), ep("c", 0, 4, 0), ep("b", 0, 2, 0)}
	for _, tt := range []struct {
		fallbacks int
		want      []string
	}{{0, nil}, {1, []string{"b"}}, {2, []string{"b", "c"}}, {5, []string{"b", "c", "d"}}} {
		t.Run(fmt.Sprint(tt.fallbacks), func(t *testing.T) {
			cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}, Fallbacks: &tt.fallbacks}
			p, _ := newPicker(t, cfg, eps)
			res, err := p.Pick(context.Background(), nil)
			require.NoError(t, err)
			assert.Equal(t, "a", res.Endpoint.Name)
			var names []string
			for _, f := range res.Fallbacks {
				names = append(names, f.Name)
			}
			assert.Equal(t, tt.want, names)
			res.Done(DoneInfo{})
		})
	}
}

func TestBurstSpreadsBeforeTheNextScrape(t *testing.T) {
	// Four idle endpoints, one stale scrape, and a burst of 40 requests that
	// arrive before any completes. Without local accounting all 40 would see
	// the same "emptiest" endpoint.
	eps := []*signals.Endpoint{ep("a", 0, 0, 0), ep("b", 0, 0, 0), ep("c", 0, 0, 0), ep("d", 0, 0, 0)}
	p, _ := newPicker(t, loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 1}, Plugin{Name: scorer.ScorerRunning, Weight: 1}), eps)
	var dones []func(DoneInfo)
	for i := 0; i < 40; i++ {
		res, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 100})
		require.NoError(t, err)
		dones = append(dones, res.Done)
	}
	for _, e := range eps {
		assert.EqualValues(t, 10, e.InFlight(), "%s", e.Name)
		assert.EqualValues(t, 1000, e.InFlightTokens(), "%s", e.Name)
	}
	for _, d := range dones {
		d(DoneInfo{})
	}
	for _, e := range eps {
		assert.Zero(t, e.InFlight())
		assert.Zero(t, e.InFlightTokens())
	}
}

func TestDoneTwiceIsANoOp(t *testing.T) {
	a := ep("a", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a})
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.InFlight())
	res.Done(DoneInfo{})
	res.Done(DoneInfo{})
	assert.EqualValues(t, 0, a.InFlight())
	c := a.Counters()
	assert.EqualValues(t, 1, c.Completed)

	// The record is recycled by the next pick; the old Done must not touch it.
	res2, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	res.Done(DoneInfo{})
	assert.EqualValues(t, 1, a.InFlight(), "stale Done must not complete the new pick")
	assert.Zero(t, res.Breakdown.Len(), "a breakdown reads empty after Done")
	res2.Done(DoneInfo{})
	assert.EqualValues(t, 0, a.InFlight())
}

func TestDoneReportsHealth(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 5, 0)
	p, _ := newPicker(t, loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 1}), []*signals.Endpoint{a, b})
	mustPick(t, p, "a").Done(DoneInfo{Err: errors.New("connection refused"), ConnectError: true})
	assert.False(t, a.Healthy())

	mustPick(t, p, "b").Done(DoneInfo{}) // a connect error takes the endpoint out at once

	a.ReportScrape(a.HealthMark(), nil, 3)
	assert.True(t, a.Healthy(), "a good scrape brings it back")
}

// TestStaleSuccessAfterConnectError: a request picked before another
// request's connect error to the same endpoint, and finishing well after
// it, does not bring the endpoint back: its success is older evidence than
// the failure. One picked after the failure does.
func TestStaleSuccessAfterConnectError(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 5, 0)
	p, _ := newPicker(t, loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 1}), []*signals.Endpoint{a, b})
	early := mustPick(t, p, "a")
	mustPick(t, p, "a").Done(DoneInfo{Err: errors.New("connection refused"), ConnectError: true})
	early.Done(DoneInfo{})
	assert.False(t, a.Healthy(), "the early request's success predates the connect error")

	mustPick(t, p, "b").Done(DoneInfo{})

	b.MarkDown() // a and b down: failing open, the picker tries a again
	mustPick(t, p, "a").Done(DoneInfo{})
	assert.True(t, a.Healthy(), "a request sent after the failure that succeeds brings it back")
}

// mustPick picks for a nil request and requires the endpoint named want.
func mustPick(t *testing.T, p *Picker, want string) Result {
	t.Helper()
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, want, res.Endpoint.Name)
	return res
}

// A cancelled request must still be reported: the caller owns Done.
func TestCancelledContextStillNeedsDone(t *testing.T) {
	a := ep("a", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a})
	ctx, cancel := context.WithCancel(context.Background())
	res, err := p.Pick(ctx, nil)
	require.NoError(t, err)
	cancel()
	assert.EqualValues(t, 1, a.InFlight(), "Pick does not watch the context after returning")
	res.Done(DoneInfo{Err: context.Canceled})
	assert.EqualValues(t, 0, a.InFlight())
	assert.True(t, a.Healthy(), "a cancelled request is not the endpoint's fault")
}

func TestConfigErrors(t *testing.T) {
	neg := -1
	tests := []struct {
		name string
		yaml string
		cfg  *Config
		want string
	}{
		{name: "unknown scorer", yaml: "scorers:\n- name: queue\n  weight: 1\n- name: telepathy\n  weight: 2\n",
			want: `scorers[1]: scorer "telepathy": unknown plugin`},
		{name: "negative weight", yaml: "scorers:\n- name: queue\n  weight: -2\n",
			want: "scorers[0] (queue).weight: -2 must be a finite number >= 0"},
		{name: "unknown filter", yaml: `{"filters": [{"name": "nope"}]}`, want: `filters[0]: filter "nope": unknown plugin`},
		{name: "filter with weight", yaml: "filters:\n- name: healthy\n  weight: 1\n", want: "filters[0] (healthy).weight: filters take no weight"},
		{name: "bad param", yaml: "filters:\n- name: saturation\n  params: {kvThreshold: 2}\n", want: "kvThreshold: 2 is not in [0, 1]"},
		{name: "unknown param", yaml: "filters:\n- name: saturation\n  params: {kvThreshhold: 0.5}\n", want: "field kvThreshhold not found"},
		{name: "params to a scorer without any", yaml: "scorers:\n- name: queue\n  weight: 1\n  params: {x: 1}\n", want: "field x not found"},
		{name: "unknown strategy", yaml: "strategy: {name: best}\n", want: `strategy.name: unknown strategy "best"`},
		{name: "softmax without temperature", yaml: "strategy: {name: softmax}\n", want: "strategy.temperature: 0 must be a positive number"},
		{name: "duplicate scorer", yaml: "scorers: [{name: queue, weight: 1}, {name: queue, weight: 2}]", want: `scorers[1]: "queue" is listed twice`},
		{name: "negative fallbacks", cfg: &Config{Fallbacks: &neg}, want: "fallbacks: -1 is not in [0, 16]"},
		{name: "bad duration", yaml: "stalenessHalfLife: soon\n", want: `"soon" is not a duration`},
		{name: "unknown top-level field", yaml: "scorer: []\n", want: "field scorer not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			cfg := Config{}
			if tt.cfg != nil {
				cfg = *tt.cfg
			} else {
				cfg, err = ParseConfig([]byte(tt.yaml))
			}
			if err == nil {
				_, err = New(cfg)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestConfigRoundTripsThroughYAMLAndJSON(t *testing.T) {
	yamlText := `
filters:
  - name: healthy
  - name: saturation
    params: {kvThreshold: 0.8, queueThreshold: 10}
scorers:
  - name: queue
    weight: 2
  - name: kv-cache
    weight: 1.5
strategy: {name: softmax, temperature: 0.25}
fallbacks: 3
stalenessHalfLife: 100ms
failClosed: true
`
	jsonText := `{"filters":[{"name":"healthy"},{"name":"saturation","params":{"kvThreshold":0.8,"queueThreshold":10}}],
"scorers":[{"name":"queue","weight":2},{"name":"kv-cache","weight":1.5}],
"strategy":{"name":"softmax","temperature":0.25},"fallbacks":3,"stalenessHalfLife":"100ms","failClosed":true}`
	fromYAML, err := ParseConfig([]byte(yamlText))
	require.NoError(t, err)
	fromJSON, err := ParseConfig([]byte(jsonText))
	require.NoError(t, err)
	for _, c := range []Config{fromYAML, fromJSON} {
		assert.Equal(t, 3, *c.Fallbacks)
		assert.Equal(t, Duration(100*time.Millisecond), c.StalenessHalfLife)
		assert.True(t, c.FailClosed)
		assert.Equal(t, 1.5, c.Scorers[1].Weight)
		p, err := New(c)
		require.NoError(t, err)
		assert.Equal(t, 100*time.Millisecond, p.cfg.Load().halfLife)
	}
	out, err := fromYAML.Marshal()
	require.NoError(t, err)
	again, err := ParseConfig(out)
	require.NoError(t, err)
	out2, err := again.Marshal()
	require.NoError(t, err)
	assert.Equal(t, string(out), string(out2))
	assert.Contains(t, string(out), "kvThreshold: 0.8")
}

func TestAdmissionRejects(t *testing.T) {
	a := ep("a", 0, 0, 0)
	adm := admitFunc(func(_ context.Context, in *scorer.Input) (bool, string) {
		if in.Request.Priority < 0 {
			return false, "sheddable and the pool is busy"
		}
		return true, ""
	})
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a}, WithAdmitter(adm))
	_, err := p.Pick(context.Background(), &signals.Request{Priority: -1})
	require.ErrorIs(t, err, ErrSaturated)
	assert.Contains(t, err.Error(), "sheddable and the pool is busy")
	assert.Zero(t, a.InFlight())
	res, err := p.Pick(context.Background(), &signals.Request{Priority: 0})
	require.NoError(t, err)
	res.Done(DoneInfo{})
}

type admitFunc func(context.Context, *scorer.Input) (bool, string)

func (f admitFunc) Admit(ctx context.Context, in *scorer.Input) (bool, string) { return f(ctx, in) }

// fakeMatcher says endpoint "warm" holds half of every prompt.
type fakeMatcher struct {
	mu         sync.Mutex
	dispatched []string
	completed  []string
}

func (*fakeMatcher) Match(_ *signals.Request, eps []*signals.Endpoint, out []float64) {
	for i, e := range eps {
		out[i] = 0
		if e.Name == "warm" {
			out[i] = 0.5
		}
	}
}
func (m *fakeMatcher) Dispatched(_ *signals.Request, e *signals.Endpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dispatched = append(m.dispatched, e.Name)
}
func (m *fakeMatcher) Completed(_ *signals.Request, e *signals.Endpoint, _ signals.Outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.completed = append(m.completed, e.Name)
}

func TestMatcherFeedsScorersAndObservesOutcomes(t *testing.T) {
	warm, cold := ep("warm", 0, 0, 0), ep("cold", 0, 0, 0)
	m := &fakeMatcher{}
	reg := scorer.NewRegistry()
	require.NoError(t, reg.RegisterScorer("cached", func(scorer.Params, scorer.Env) (scorer.Scorer, error) {
		return scorer.ScorerFunc(func(_ context.Context, in *scorer.Input, out []float64) { copy(out, in.Cached) }), nil
	}))
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: "cached", Weight: 1}}}, []*signals.Endpoint{cold, warm},
		WithPrefixMatcher(m), WithRegistry(reg))
	res, err := p.Pick(context.Background(), &signals.Request{PromptBlocks: []uint64{1, 2}, PromptTokens: 1000})
	require.NoError(t, err)
	assert.Equal(t, "warm", res.Endpoint.Name)
	assert.EqualValues(t, 500, warm.InFlightTokens(), "only the uncached half is prefill work")
	res.Done(DoneInfo{TTFT: time.Second})
	assert.Equal(t, []string{"warm"}, m.dispatched)
	assert.Equal(t, []string{"warm"}, m.completed)
}

func TestBreakdown(t *testing.T) {
	eps := []*signals.Endpoint{ep("a", 2, 4, 0.5), ep("b", 0, 0, 0.25)}
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 2}, {Name: scorer.ScorerKVCache, Weight: 1}}}, eps)
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	b := res.Breakdown
	require.Equal(t, 2, b.Len())
	assert.Equal(t, []string{"queue", "kv-cache"}, b.Scorers())
	assert.Equal(t, 1, b.Chosen())
	assert.Equal(t, "b", b.Endpoint(b.Chosen()).Name)
	assert.Equal(t, 4.0, b.Raw(0, 0), "raw queue depth of a")
	assert.Equal(t, 0.0, b.Contribution(0, 0))
	assert.Equal(t, 2.0, b.Contribution(0, 1))
	assert.InDelta(t, 0.5, b.Contribution(1, 0), 1e-12)
	assert.InDelta(t, 0.75, b.Contribution(1, 1), 1e-12)
	assert.InDelta(t, 2.75, b.Total(1), 1e-12)
	s := b.String()
	assert.Contains(t, s, "* b")
	assert.Contains(t, s, "2.000 (0)")
	for _, bad := range [][2]int{{-1, 0}, {2, 0}, {0, -1}, {0, 2}} {
		s, i := bad[0], bad[1]
		assert.Zero(t, b.Score(s, i), "Score(%d, %d) out of range", s, i)
		assert.True(t, math.IsNaN(b.Raw(s, i)), "Raw(%d, %d) out of range", s, i)
		assert.Zero(t, b.Contribution(s, i), "Contribution(%d, %d) out of range", s, i)
	}
	assert.Zero(t, b.Weight(2))
	assert.Nil(t, b.Endpoint(2))
	assert.Zero(t, b.Total(-1))
	res.Done(DoneInfo{})
	assertEmptyBreakdown(t, b)

	// The next pick recycles the record; the old breakdown still reads
	// empty rather than the new pick's data.
	res2, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, 2, res2.Breakdown.Len())
	assertEmptyBreakdown(t, b)
	res2.Done(DoneInfo{})

	assertEmptyBreakdown(t, Breakdown{})
}

// assertEmptyBreakdown checks that every accessor of b reads as empty
// without panicking.
func assertEmptyBreakdown(t *testing.T, b Breakdown) {
	t.Helper()
	assert.Zero(t, b.Len())
	assert.Nil(t, b.Scorers())
	assert.Equal(t, -1, b.Chosen())
	assert.Equal(t, "(no breakdown)", b.String())
	for i := 0; i < 2; i++ {
		assert.NotPanics(t, func() { assert.Nil(t, b.Endpoint(i)) })
		assert.NotPanics(t, func() { assert.Zero(t, b.Total(i)) })
		assert.NotPanics(t, func() { assert.Zero(t, b.Weight(i)) })
		for s := 0; s < 2; s++ {
			assert.NotPanics(t, func() { assert.Zero(t, b.Score(s, i)) })
			assert.NotPanics(t, func() { assert.True(t, math.IsNaN(b.Raw(s, i))) })
			assert.NotPanics(t, func() { assert.Zero(t, b.Contribution(s, i)) })
		}
	}
}

func TestStalenessFadesTowardLocalAccounting(t *testing.T) {
	// a's scrape says 10 waiting; b's says 0 but b has 4 requests in flight
	// from us. Fresh, a looks worse; once the scrapes are several half-lives
	// old, only the local counts remain and a (0 in flight) looks better.
	a, b := ep("a", 0, 10, 0), ep("b", 0, 0, 0)
	for i := 0; i < 4; i++ {
		b.Dispatch(0)
	}
	// Rebase b's scrape so the four are already in it.
	m := *b.Metrics()
	m.Baseline = b.Counters()
	b.SetMetrics(&m)

	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}, StalenessHalfLife: Duration(100 * time.Millisecond)}
	p, clk := newPicker(t, cfg, []*signals.Endpoint{a, b})
	pick := func() string {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		defer res.Done(DoneInfo{})
		return res.Endpoint.Name
	}
	assert.Equal(t, "b", pick())
	clk.Advance(time.Second) // 10 half-lives
	assert.Equal(t, "a", pick())
}

// swapInBackground swaps p's endpoints and configuration in a goroutine,
// setB with cfgs[0] then setA with cfgs[1] and so on, pausing between
// swaps, until the returned function is called; that function returns
// once the goroutine has ended.
func swapInBackground(t *testing.T, p *Picker, setA, setB []*signals.Endpoint, cfgs []Config, pause time.Duration) func() {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				p.SetEndpoints(setB)
			} else {
				p.SetEndpoints(setA)
			}
			assert.NoError(t, p.Reconfigure(cfgs[i%2]))
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	}()
	return func() {
		close(stop)
		wg.Wait()
	}
}

func TestConcurrentPickWithSwaps(t *testing.T) {
	mk := func(prefix string, n int) []*signals.Endpoint {
		eps := make([]*signals.Endpoint, n)
		for i := range eps {
			eps[i] = ep(fmt.Sprintf("%s%d", prefix, i), float64(i%3), float64(i%5), float64(i%4)/4)
		}
		return eps
	}
	setA, setB := mk("a", 8), mk("b", 3)
	p, _ := newPicker(t, loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 2}, Plugin{Name: scorer.ScorerKVCache, Weight: 1}), setA)
	cfgs := []Config{
		loadCfg(Plugin{Name: scorer.ScorerQueue, Weight: 2}),
		{Scorers: []Plugin{{Name: scorer.ScorerRunning, Weight: 1}}, Strategy: Strategy{Name: StrategyWeightedRandom}},
	}
	ctx := context.Background()
	stopSwaps := swapInBackground(t, p, setA, setB, cfgs, 0)
	var pickers sync.WaitGroup
	for g := 0; g < 8; g++ {
		pickers.Add(1)
		go func() {
			defer pickers.Done()
			for i := 0; i < 500; i++ {
				res, err := p.Pick(ctx, &signals.Request{PromptTokens: 10})
				if !assert.NoError(t, err) {
					return
				}
				_ = res.Breakdown.String()
				res.Done(DoneInfo{})
			}
		}()
	}
	pickers.Wait()
	stopSwaps()
	for _, e := range append(setA, setB...) {
		assert.Zero(t, e.InFlight(), "every Done released its endpoint: %s", e.Name)
	}
}

func TestWatchConfigFileHotReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "picker.yaml")
	write := func(s string) { // atomically, as WatchConfigFile asks
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(s), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	write("scorers: [{name: queue, weight: 1}]\n")
	// a: short queue, full cache. b: long queue, empty cache.
	eps := []*signals.Endpoint{ep("a", 0, 0, 0.9), ep("b", 0, 9, 0.0)}
	p, _ := newPicker(t, Config{}, eps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.WatchConfigFile(ctx, path, 5*time.Millisecond) }()
	pick := func() string {
		res, err := p.Pick(ctx, nil)
		require.NoError(t, err)
		defer res.Done(DoneInfo{})
		return res.Endpoint.Name
	}
	require.Eventually(t, func() bool { return pick() == "a" }, 5*time.Second, 5*time.Millisecond)
	// An outstanding Result survives the swap.
	held, err := p.Pick(ctx, nil)
	require.NoError(t, err)
	write("scorers: [{name: kv-cache, weight: 1}]\n")
	require.Eventually(t, func() bool { return pick() == "b" }, 5*time.Second, 5*time.Millisecond)
	held.Done(DoneInfo{})
	assert.Zero(t, eps[0].InFlight())
	// A broken file keeps the current configuration.
	write("scorers: [{name: kv-cache, weight: -1}]\n")
	time.Sleep(30 * time.Millisecond)
	assert.Equal(t, "b", pick())
	// So does an empty one (a writer that truncates first): it is not an
	// empty configuration, which would bring back the defaults.
	write("\n")
	time.Sleep(30 * time.Millisecond)
	res, err := p.Pick(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"kv-cache"}, res.Breakdown.Scorers())
	res.Done(DoneInfo{})
	cancel()
	require.NoError(t, <-errc)
}

func TestSubsetHint(t *testing.T) {
	a, b, c := ep("a", 0, 0, 0), ep("b", 0, 5, 0), ep("c", 0, 9, 0)
	c.Labels = map[string]string{"zone": "west"}
	p, _ := newPicker(t, Config{Filters: []Plugin{{Name: scorer.FilterSubset}}, Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}},
		[]*signals.Endpoint{a, b, c})
	for _, tt := range []struct {
		header, value, want string
	}{
		{"x-gateway-destination-endpoint-subset", "b:8000, c:8000", "b"},
		{"x-inferroute-labels", "zone=west", "c"},
		{"x-other", "zzz", "a"},
	} {
		h := http.Header{}
		h.Set(tt.header, tt.value)
		res, err := p.Pick(context.Background(), &signals.Request{Headers: h})
		require.NoError(t, err)
		assert.Equal(t, tt.want, res.Endpoint.Name, "%s: %s", tt.header, tt.value)
		res.Done(DoneInfo{})
	}
}

func TestTracingAndMetrics(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	a, b := ep("a", 0, 0, 0), ep("b", 0, 5, 0)
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 2}}}, []*signals.Endpoint{a, b},
		WithTracerProvider(tp), WithMeterProvider(mp))
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	res.Done(DoneInfo{})
	spans := rec.Ended()
	require.Len(t, spans, 1)
	for _, info := range []DoneInfo{{Err: errors.New("HTTP 500")}, {Err: errors.New("refused"), ConnectError: true}} {
		r, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		r.Done(info)
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range spans[0].Attributes() {
		attrs[kv.Key] = kv.Value
	}
	assert.Equal(t, "a", attrs["inferroute.endpoint"].AsString())
	assert.Equal(t, 2.0, attrs["inferroute.score.queue"].AsFloat64())

	p.SetEndpoints(nil)
	_, err = p.Pick(context.Background(), nil)
	require.Error(t, err)

	got := metrictest.Collect(t, reader)
	assert.Equal(t, int64(3), got["inferroute.picks{endpoint=a}"])
	assert.Equal(t, int64(1), got["inferroute.pick.errors{kind=no_endpoints}"])
	assert.Equal(t, int64(1), got["inferroute.requests.completed{endpoint=a,result=ok}"])
	assert.Equal(t, int64(1), got["inferroute.requests.completed{endpoint=a,result=error}"])
	assert.Equal(t, int64(1), got["inferroute.requests.completed{endpoint=a,result=connect_error}"])
	assert.Equal(t, int64(4), got["inferroute.pick.duration"])
}

// TestCountersSumAcrossPickers: pickers sharing a meter provider without
// WithMetricAttributes report into the same series, so an endpoint name that
// two of them count is exported with the sum of both counts, as the SDK's
// synchronous counters added them; and each collection reports the totals.
func TestCountersSumAcrossPickers(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}
	p1, _ := newPicker(t, cfg, []*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp))
	p2, _ := newPicker(t, cfg, []*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp))
	pick := func(p *Picker, n int, info DoneInfo) {
		for range n {
			res, err := p.Pick(context.Background(), nil)
			require.NoError(t, err)
			res.Done(info)
		}
	}
	pick(p1, 2, DoneInfo{})
	pick(p2, 3, DoneInfo{})
	pick(p2, 1, DoneInfo{Err: errors.New("HTTP 500")})
	want := map[string]int64{
		"inferroute.picks{endpoint=a}":                           6,
		"inferroute.requests.completed{endpoint=a,result=ok}":    5,
		"inferroute.requests.completed{endpoint=a,result=error}": 1,
		"inferroute.pick.duration":                               6,
	}
	assert.Equal(t, want, metrictest.Collect(t, reader))
	assert.Equal(t, want, metrictest.Collect(t, reader), "a second collection reports the same totals")
}

// TestMetricAttributes: pickers sharing a meter provider, each labelled
// with its pool (WithMetricAttributes), report apart, an endpoint name in
// both pools included; a pick error says which pool failed; and an
// attribute of a key the picker sets itself (endpoint) is left out.
func TestMetricAttributes(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}
	p1, _ := newPicker(t, cfg, []*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp),
		WithMetricAttributes(attribute.String("pool", "llama")))
	p2, _ := newPicker(t, cfg, []*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp),
		WithMetricAttributes(attribute.String("pool", "qwen"), attribute.String("endpoint", "spoofed")))
	for range 2 {
		res, err := p1.Pick(context.Background(), nil)
		require.NoError(t, err)
		res.Done(DoneInfo{})
	}
	res, err := p2.Pick(context.Background(), nil)
	require.NoError(t, err)
	res.Done(DoneInfo{Err: errors.New("HTTP 500")})
	p2.SetEndpoints(nil)
	_, err = p2.Pick(context.Background(), nil)
	require.ErrorIs(t, err, ErrNoEndpoints)

	assert.Equal(t, map[string]int64{
		"inferroute.picks{endpoint=a,pool=llama}":                          2,
		"inferroute.picks{endpoint=a,pool=qwen}":                           1,
		"inferroute.requests.completed{endpoint=a,pool=llama,result=ok}":   2,
		"inferroute.requests.completed{endpoint=a,pool=qwen,result=error}": 1,
		"inferroute.pick.errors{kind=no_endpoints,pool=qwen}":              1,
		"inferroute.pick.duration{pool=llama}":                             2,
		"inferroute.pick.duration{pool=qwen}":                              2,
	}, metrictest.Collect(t, reader))
}

// TestClose: a closed picker's per-endpoint counts leave the meter
// provider's collections; it still picks.
func TestClose(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}
	p, _ := newPicker(t, cfg, []*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp),
		WithMetricAttributes(attribute.String("pool", "gone")))
	res, err := p.Pick(context.Background(), nil)
	require.NoError(t, err)
	res.Done(DoneInfo{})
	require.Equal(t, int64(1), metrictest.Collect(t, reader)["inferroute.picks{endpoint=a,pool=gone}"])

	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "idempotent")
	res, err = p.Pick(context.Background(), nil)
	require.NoError(t, err, "a closed picker still picks")
	res.Done(DoneInfo{})
	got := metrictest.Collect(t, reader)
	assert.NotContains(t, got, "inferroute.picks{endpoint=a,pool=gone}")
	assert.NotContains(t, got, "inferroute.requests.completed{endpoint=a,pool=gone,result=ok}")
	assert.Equal(t, int64(2), got["inferroute.pick.duration{pool=gone}"], "a synchronous instrument's series stays")

	q, _ := newPicker(t, cfg, nil) // no meter provider
	assert.NoError(t, q.Close())
}

// TestPickerNotHeldByMeterProvider: the meter provider outlives a picker
// it was given; its callback must not keep the dropped picker, with its
// endpoints, alive.
func TestPickerNotHeldByMeterProvider(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	collected := make(chan struct{})
	func() {
		p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}},
			[]*signals.Endpoint{ep("a", 0, 0, 0)}, WithMeterProvider(mp))
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		res.Done(DoneInfo{})
		runtime.AddCleanup(p, func(ch chan struct{}) { close(ch) }, collected)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-collected:
			runtime.KeepAlive(mp)
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the picker is still reachable after 10 s of garbage collections")
		}
	}
}

func TestSetEndpointsFreesPrefixStateOfDepartedEndpoints(t *testing.T) {
	idx, err := prefix.NewIndex(prefix.IndexConfig{Stride: 1})
	require.NoError(t, err)
	a, b := ep("a", 0, 0, 0), ep("b", 0, 5, 0)
	p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}, []*signals.Endpoint{a, b}, WithPrefixMatcher(idx))
	req := &signals.Request{PromptBlocks: []uint64{11, 22, 33}, PromptTokens: 48}
	res, err := p.Pick(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "a", res.Endpoint.Name)
	res.Done(DoneInfo{TTFT: time.Millisecond})
	require.Positive(t, idx.Entries(a))
	p.SetEndpoints([]*signals.Endpoint{b})
	assert.Zero(t, idx.Entries(a), "a left the pool: its prefix entries are freed")
}

func TestTieBandRotates(t *testing.T) {
	// Queue scores a 1, b 0, c 1, weighted 2. A band of the whole weight
	// ties all three, and they are taken in turn.
	eps := []*signals.Endpoint{ep("a", 0, 0, 0), ep("b", 0, 1, 0), ep("c", 0, 0, 0)}
	cfg := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 2}}, Strategy: Strategy{TieBand: 1}}
	p, _ := newPicker(t, cfg, eps)
	var got []string
	for i := 0; i < 6; i++ {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		got = append(got, res.Endpoint.Name)
		res.Done(DoneInfo{})
	}
	assert.Equal(t, []string{"b", "c", "a", "b", "c", "a"}, got)

	// A narrower band: b (2 below the best) is out, a and c alternate.
	cfg.Strategy.TieBand = 0.1
	require.NoError(t, p.Reconfigure(cfg))
	got = got[:0]
	for i := 0; i < 4; i++ {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		got = append(got, res.Endpoint.Name)
		res.Done(DoneInfo{})
	}
	assert.NotContains(t, got, "b")
	assert.Contains(t, got, "a")
	assert.Contains(t, got, "c")

	cfg.Strategy.TieBand = 2
	require.ErrorContains(t, p.Reconfigure(cfg), "strategy.tieBand: 2 is not in [0, 1]")
}

// TestCheckDoesNotApply: Check gives Reconfigure's verdict and leaves the
// running configuration alone, valid or not.
func TestCheckDoesNotApply(t *testing.T) {
	// Queue prefers b (depth 0); kv-cache prefers a (0% used).
	eps := []*signals.Endpoint{ep("a", 0, 5, 0), ep("b", 0, 0, 0.9)}
	queue := Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 1}}}
	p, _ := newPicker(t, queue, eps)
	pick := func() string {
		res, err := p.Pick(context.Background(), nil)
		require.NoError(t, err)
		res.Done(DoneInfo{})
		return res.Endpoint.Name
	}
	require.Equal(t, "b", pick())

	kv := Config{Scorers: []Plugin{{Name: scorer.ScorerKVCache, Weight: 1}}}
	require.NoError(t, p.Check(kv))
	assert.Equal(t, "b", pick(), "Check applied the configuration")

	bad := Config{Scorers: []Plugin{{Name: "no-such-scorer", Weight: 1}}}
	assert.Equal(t, p.Reconfigure(bad), p.Check(bad))
	require.Error(t, p.Check(bad))
	assert.Equal(t, "b", pick())

	require.NoError(t, p.Reconfigure(kv))
	assert.Equal(t, "a", pick())
}

// TestInstrumentedPickDoneAllocations holds a metered Pick and Done to the
// allocations of an unmetered one: the per-endpoint attribute options are
// built once, and recording them must not allocate the variadic option
// slice on every Add (it escapes through the instrument's interface).
func TestInstrumentedPickDoneAllocations(t *testing.T) {
	count := func(opts ...Option) float64 {
		a, b := ep("a", 0, 0, 0), ep("b", 0, 5, 0)
		p, _ := newPicker(t, Config{Scorers: []Plugin{{Name: scorer.ScorerQueue, Weight: 2}}}, []*signals.Endpoint{a, b}, opts...)
		ctx := context.Background()
		return testing.AllocsPerRun(200, func() {
			res, err := p.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			res.Done(DoneInfo{})
		})
	}
	plain := count()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	metered := count(WithMeterProvider(mp))
	if !raceEnabled {
		assert.Equal(t, plain, metered, "allocations per Pick and Done: %v unmetered, %v metered", plain, metered)
	}
}
