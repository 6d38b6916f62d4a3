package scorer_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestNormalize(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		fn   func([]float64)
		in   []float64
		want []float64
	}{
		{"minmax", scorer.MinMax, []float64{2, 4, 3}, []float64{0, 1, 0.5}},
		{"minmax all equal", scorer.MinMax, []float64{7, 7}, []float64{1, 1}},
		{"minmax unknown is neutral", scorer.MinMax, []float64{nan, 1, 3}, []float64{0.5, 0, 1}},
		{"minmax all unknown", scorer.MinMax, []float64{nan, math.Inf(1)}, []float64{0.5, 0.5}},
		{"inverse", scorer.InverseMinMax, []float64{2, 4, 3}, []float64{1, 0, 0.5}},
		{"inverse all equal", scorer.InverseMinMax, []float64{0, 0, 0}, []float64{1, 1, 1}},
		{"inverse single", scorer.InverseMinMax, []float64{9}, []float64{1}},
		{"inverse empty", scorer.InverseMinMax, []float64{}, []float64{}},
		{"fixed range", func(v []float64) { scorer.FixedRange(v, 10, 20) }, []float64{5, 15, 25, nan}, []float64{0, 0.5, 1, 0.5}},
		{"fixed range degenerate", func(v []float64) { scorer.FixedRange(v, 1, 1) }, []float64{5}, []float64{1}},
		{"invert", scorer.Invert, []float64{0, 0.25, 1, 2, -1, nan}, []float64{1, 0.75, 0, 0, 1, 0.5}},
		{"relative to best", func(v []float64) { scorer.RelativeToBest(v, 0.001) }, []float64{1, 2, 4, nan}, []float64{1, 0.5, 0.25, 0.5}},
		{"relative to best with zero", func(v []float64) { scorer.RelativeToBest(v, 0.5) }, []float64{0, 1}, []float64{1, 0.5}},
		// Spreads whose reciprocal overflows, or which overflow themselves.
		{"minmax subnormal spread", scorer.MinMax, []float64{0, 5e-324, 1e-310}, []float64{0, 5e-324 / 1e-310, 1}},
		{"inverse subnormal spread", scorer.InverseMinMax, []float64{0, 5e-324, 1e-310}, []float64{1, 1 - 5e-324/1e-310, 0}},
		{"minmax overflowing spread", scorer.MinMax, []float64{-1e308, 0, 1e308, -math.MaxFloat64, math.MaxFloat64}, []float64{0.5 - 0.5e308/math.MaxFloat64, 0.5, 0.5 + 0.5e308/math.MaxFloat64, 0, 1}},
		{"inverse overflowing spread", scorer.InverseMinMax, []float64{-1e308, 0, 1e308}, []float64{1, 0.5, 0}},
		{"minmax smallest subnormals", scorer.MinMax, []float64{math.SmallestNonzeroFloat64, 2 * math.SmallestNonzeroFloat64}, []float64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := append([]float64(nil), tt.in...)
			tt.fn(v)
			require.Len(t, v, len(tt.want))
			for i := range v {
				assert.InDelta(t, tt.want[i], v[i], 1e-12, "index %d: %v", i, v)
			}
		})
	}
}

func TestClamp01(t *testing.T) {
	for in, want := range map[float64]float64{-1: 0, 0: 0, 0.3: 0.3, 1: 1, 5: 1, math.Inf(1): 1, math.Inf(-1): 0} {
		assert.Equal(t, want, scorer.Clamp01(in), "%v", in)
	}
	assert.Equal(t, 0.0, scorer.Clamp01(math.NaN()))
}

func input(req *signals.Request, eps ...*signals.Endpoint) *scorer.Input {
	n := len(eps)
	return &scorer.Input{Request: req, Endpoints: eps, Now: t0, Cached: make([]float64, n), Raw: make([]float64, n)}
}

func ep(name string, running, waiting, kv float64) *signals.Endpoint {
	return signalstest.Endpoint(name, signalstest.Load{Running: running, Waiting: waiting, KV: kv, ScrapedAt: t0})
}

func TestBuiltinScorers(t *testing.T) {
	tp := func(e *signals.Endpoint, v float64) *signals.Endpoint { e.SetThroughput(v); return e }
	busy := func(e *signals.Endpoint, tokens int) *signals.Endpoint {
		e.Dispatch(tokens)
		m := *e.Metrics()
		m.Baseline = e.Counters() // the scrape already saw it: only tokens count
		e.SetMetrics(&m)
		return e
	}
	recent := func(e *signals.Endpoint, n int) *signals.Endpoint {
		for i := 0; i < n; i++ {
			e.NoteDispatch(t0)
		}
		return e
	}
	lora := func(name string, running ...string) *signals.Endpoint {
		e := signals.NewEndpoint(signals.EndpointSpec{Name: name})
		e.SetMetrics(&signals.Metrics{ScrapedAt: t0, LoRAKnown: true, RunningAdapters: running, MaxLoRA: 1})
		return e
	}
	tests := []struct {
		name    string
		s       scorer.Scorer
		req     *signals.Request
		eps     []*signals.Endpoint
		want    []float64
		wantRaw []float64
	}{
		{"queue", &scorer.QueueScorer{}, &signals.Request{},
			[]*signals.Endpoint{ep("a", 0, 0, 0), ep("b", 0, 10, 0), ep("c", 0, 5, 0)},
			[]float64{1, 0, 0.5}, []float64{0, 10, 5}},
		{"running", &scorer.RunningScorer{}, &signals.Request{},
			[]*signals.Endpoint{ep("a", 8, 0, 0), ep("b", 4, 0, 0)},
			[]float64{0, 1}, []float64{8, 4}},
		{"kv fixed scale", &scorer.KVCacheScorer{}, &signals.Request{},
			[]*signals.Endpoint{ep("a", 0, 0, 0.9), ep("b", 0, 0, 0.8), ep("c", 0, 0, math.NaN())},
			[]float64{0.1, 0.2, 0.5}, []float64{0.9, 0.8, math.NaN()}},
		{"lora", scorer.LoRAScorer{}, &signals.Request{Adapter: "x"},
			[]*signals.Endpoint{lora("has", "x"), lora("full", "y"), lora("free"), ep("unknown", 0, 0, 0)},
			[]float64{1, 0, 0.6, 0.5}, []float64{4, 1, 2, 0}},
		{"lora base model", scorer.LoRAScorer{}, &signals.Request{},
			[]*signals.Endpoint{lora("full", "y")}, []float64{1}, []float64{4}},
		{"burst", scorer.BurstScorer{}, &signals.Request{},
			[]*signals.Endpoint{recent(ep("a", 0, 0, 0), 0), recent(ep("b", 0, 0, 0), 1), recent(ep("c", 0, 0, 0), 3)},
			[]float64{1, 0.5, 0.25}, []float64{0, 1, 3}},
		{"token load in seconds", scorer.TokenLoadScorer{}, &signals.Request{},
			// a: 1000 tokens at 1000/s = 1 s; b: 3000 at 6000/s = 0.5 s;
			// c: 2000 at the mean throughput 3500/s = 0.571 s.
			[]*signals.Endpoint{tp(busy(ep("a", 0, 0, 0), 1000), 1000), tp(busy(ep("b", 0, 0, 0), 3000), 6000), busy(ep("c", 0, 0, 0), 2000)},
			[]float64{0, 1, (1 - 2000.0/3500) / 0.5}, []float64{1, 0.5, 2000.0 / 3500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input(tt.req, tt.eps...)
			for i := range in.Raw {
				in.Raw[i] = math.NaN()
			}
			out := make([]float64, len(tt.eps))
			tt.s.Score(context.Background(), in, out)
			for i := range out {
				assert.InDelta(t, tt.want[i], out[i], 1e-9, "score %d: %v", i, out)
				if math.IsNaN(tt.wantRaw[i]) {
					assert.True(t, math.IsNaN(in.Raw[i]))
				} else {
					assert.InDelta(t, tt.wantRaw[i], in.Raw[i], 1e-9, "raw %d: %v", i, in.Raw)
				}
			}
		})
	}
}

func names(eps []*signals.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Name)
	}
	return out
}

func TestFilters(t *testing.T) {
	mk := func(name, model string, adapters []string, labels map[string]string) *signals.Endpoint {
		return signals.NewEndpoint(signals.EndpointSpec{Name: name, Address: name + ":1", Model: model, Adapters: adapters, Labels: labels})
	}
	down := mk("down", "m", nil, nil)
	down.MarkDown()
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	subset := scorer.DefaultSubsetFilter()
	tests := []struct {
		name string
		f    scorer.Filter
		req  *signals.Request
		eps  []*signals.Endpoint
		want []string
	}{
		{"model", scorer.ModelFilter{}, &signals.Request{Model: "m"},
			[]*signals.Endpoint{mk("a", "m", nil, nil), mk("b", "other", nil, nil), mk("c", "", nil, nil)}, []string{"a", "c"}},
		{"model with adapter", scorer.ModelFilter{}, &signals.Request{Model: "m", Adapter: "x"},
			[]*signals.Endpoint{mk("a", "m", []string{"y"}, nil), mk("b", "m", []string{"y", "x"}, nil), mk("c", "m", nil, nil)}, []string{"b", "c"}},
		{"model: none serve", scorer.ModelFilter{}, &signals.Request{Model: "zzz"},
			[]*signals.Endpoint{mk("a", "m", nil, nil)}, nil},
		{"healthy", scorer.HealthyFilter{}, &signals.Request{},
			[]*signals.Endpoint{mk("a", "m", nil, nil), down, mk("b", "m", nil, nil)}, []string{"a", "b"}},
		{"subset by address", &subset, &signals.Request{Headers: hdr("x-gateway-destination-endpoint-subset", " b:1 ,c:1,")},
			[]*signals.Endpoint{mk("a", "", nil, nil), mk("b", "", nil, nil), mk("c", "", nil, nil)}, []string{"b", "c"}},
		{"subset by labels", &subset, &signals.Request{Headers: hdr("x-inferroute-labels", "zone=west, gpu")},
			[]*signals.Endpoint{mk("a", "", nil, map[string]string{"zone": "west"}), mk("b", "", nil, map[string]string{"zone": "west", "gpu": "h100"}),
				mk("c", "", nil, map[string]string{"zone": "east", "gpu": "h100"})}, []string{"b"}},
		{"subset without headers", &subset, &signals.Request{},
			[]*signals.Endpoint{mk("a", "", nil, nil)}, []string{"a"}},
		{"subset matching nothing", &subset, &signals.Request{Headers: hdr("x-gateway-destination-endpoint-subset", "nowhere:1")},
			[]*signals.Endpoint{mk("a", "", nil, nil)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]*signals.Endpoint(nil), tt.eps...)
			got := tt.f.Filter(context.Background(), input(tt.req, tt.eps...))
			assert.Equal(t, tt.want, names(got))
			if len(got) == 0 {
				assert.Equal(t, before, tt.eps, "a filter that keeps nothing leaves the candidates alone")
			}
		})
	}
}

func TestSaturationFilter(t *testing.T) {
	f := scorer.DefaultSaturationFilter()
	tests := []struct {
		name string
		eps  []*signals.Endpoint
		want []string
	}{
		{"drops the saturated", []*signals.Endpoint{ep("a", 0, 0, 0.99), ep("b", 0, 3, 0.5), ep("c", 0, 64, 0.1)}, []string{"b"}},
		{"all saturated keeps the least", []*signals.Endpoint{ep("a", 0, 0, 0.99), ep("b", 0, 80, 0.5), ep("c", 0, 200, 0.1)}, []string{"a"}},
		{"unknown kv does not saturate", []*signals.Endpoint{ep("a", 0, 0, math.NaN())}, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, names(f.Filter(context.Background(), input(&signals.Request{}, tt.eps...))))
		})
	}
	off := scorer.SaturationFilter{}
	assert.Len(t, off.Filter(context.Background(), input(&signals.Request{}, ep("a", 0, 1e9, 1))), 1, "zero thresholds disable the checks")
}

func TestRegistry(t *testing.T) {
	var r scorer.Registry // the zero value is usable
	f := func(scorer.Params, scorer.Env) (scorer.Scorer, error) { return scorer.LoRAScorer{}, nil }
	require.NoError(t, r.RegisterScorer("mine", f))
	err := r.RegisterScorer("mine", f)
	require.ErrorIs(t, err, scorer.ErrDuplicatePlugin)
	assert.Contains(t, err.Error(), `"mine"`)
	require.Error(t, r.RegisterScorer("", f))
	require.Error(t, r.RegisterScorer("nil", nil))
	_, err = r.NewScorer("nope", scorer.Params{}, scorer.Env{})
	require.ErrorIs(t, err, scorer.ErrUnknownPlugin)
	assert.Contains(t, err.Error(), "[mine]", "the error lists what is registered")

	boom := errors.New("boom")
	require.NoError(t, r.RegisterFilter("bad", func(scorer.Params, scorer.Env) (scorer.Filter, error) { return nil, boom }))
	_, err = r.NewFilter("bad", scorer.Params{}, scorer.Env{})
	require.ErrorIs(t, err, boom)

	def := scorer.NewRegistry()
	assert.Subset(t, def.Scorers(), []string{"queue", "kv-cache", "running", "lora", "token-load", "burst", "prefix", "latency"})
	assert.Subset(t, def.Filters(), []string{"model", "healthy", "saturation", "subset", "slo"})
	require.ErrorIs(t, def.RegisterScorer("queue", f), scorer.ErrDuplicatePlugin)
	assert.NotSame(t, def, scorer.NewRegistry())
}

func TestParams(t *testing.T) {
	p, err := scorer.ParseParams(`{"kvThreshold": 0.5}`)
	require.NoError(t, err)
	sat := scorer.DefaultSaturationFilter()
	require.NoError(t, p.Decode(&sat))
	assert.Equal(t, 0.5, sat.KVThreshold)
	assert.Equal(t, scorer.DefaultSaturationFilter().QueueThreshold, sat.QueueThreshold, "unmentioned fields keep their defaults")

	p, err = scorer.ParseParams("kvThreshold: lots\n")
	require.NoError(t, err)
	err = p.Decode(&sat)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lots")

	var zero scorer.Params
	assert.True(t, zero.IsZero())
	require.NoError(t, zero.Decode(&sat))
}

// TestSubsetFilterFromRegistryDoesNotAllocate checks that the subset filter
// the registry builds reads its headers without allocating (http.Header.Get
// canonicalizes a lowercase name, allocating, on every call) and still
// reads headers set under the names as configured.
func TestSubsetFilterFromRegistryDoesNotAllocate(t *testing.T) {
	f, err := scorer.NewRegistry().NewFilter(scorer.FilterSubset, scorer.Params{}, scorer.Env{})
	require.NoError(t, err)
	h := http.Header{}
	h.Set("x-gateway-destination-endpoint-subset", "b:1")
	h.Set("x-inferroute-labels", "zone=west")
	eps := []*signals.Endpoint{
		signals.NewEndpoint(signals.EndpointSpec{Address: "a:1", Labels: map[string]string{"zone": "west"}}),
		signals.NewEndpoint(signals.EndpointSpec{Address: "b:1", Labels: map[string]string{"zone": "west"}}),
	}
	in := &scorer.Input{Request: &signals.Request{Headers: h}, Endpoints: eps, Now: t0}
	var got []*signals.Endpoint
	scratch := make([]*signals.Endpoint, len(eps))
	allocs := testing.AllocsPerRun(100, func() {
		in.Endpoints = scratch[:copy(scratch, eps)] // Filter keeps in place
		got = f.Filter(context.Background(), in)
	})
	require.Len(t, got, 1)
	assert.Equal(t, "b:1", got[0].Address)
	assert.Zero(t, allocs, "allocations per Filter")
}

// labelled returns an endpoint with the given labels and a fresh scrape of
// waiting requests and KV-cache utilisation.
func labelled(name string, labels map[string]string, waiting, kv float64) *signals.Endpoint {
	e := signals.NewEndpoint(signals.EndpointSpec{Name: name, Address: name + ":8000", Labels: labels})
	e.SetMetrics(&signals.Metrics{ScrapedAt: t0, Baseline: e.Counters(), Waiting: signals.Known(waiting), KVCacheUtilization: signals.Known(kv)})
	return e
}

// TestQueuesInFastestTerms: the saturation filter and the queue scorer
// count a request waiting on a slower pod as the time it holds that pod,
// in the fastest candidate's requests: an L4 (0.39 of an A100) behind an
// H100 (2.2) weighs 2.2/0.39 = 5.64 per waiting request. On a fleet of one
// speed, labelled or not, nothing changes.
func TestQueuesInFastestTerms(t *testing.T) {
	gpu := func(g string) map[string]string { return map[string]string{signals.LabelGPU: g} }
	ctx := context.Background()
	f := scorer.DefaultSaturationFilter() // queue threshold 10
	filter := func(eps ...*signals.Endpoint) []string {
		return names(f.Filter(ctx, input(&signals.Request{}, eps...)))
	}

	// 3 waiting on the L4 is 16.9 in H100 terms: saturated, though under 10.
	assert.Equal(t, []string{"h100"}, filter(labelled("h100", gpu("h100"), 5, 0.5), labelled("l4", gpu("l4"), 3, 0.5)))
	assert.Equal(t, []string{"h100", "l4"}, filter(labelled("h100", nil, 5, 0.5), labelled("l4", nil, 3, 0.5)), "without labels")
	// Everything saturated: the least saturated is the H100 at 12/10, not
	// the L4 at 16.9/10 (without labels the L4, at 3/10).
	assert.Equal(t, []string{"h100"}, filter(labelled("h100", gpu("h100"), 12, 0.5), labelled("l4", gpu("l4"), 3, 0.5)))
	assert.Equal(t, []string{"l4"}, filter(labelled("h100", nil, 12, 0.5), labelled("l4", nil, 3, 0.5)), "without labels")
	// One speed: the threshold is the configured one.
	assert.Equal(t, []string{"a"}, filter(labelled("a", gpu("l4"), 9, 0.5), labelled("b", gpu("l4"), 10, 0.5)))
	// An explicit speed label counts as well: half as fast, twice the weight.
	assert.Equal(t, []string{"fast"}, filter(labelled("fast", nil, 9, 0.5), labelled("half", map[string]string{signals.LabelRelativeSpeed: "0.5"}, 5, 0.5)))

	q := &scorer.QueueScorer{}
	in := input(&signals.Request{}, labelled("h100", gpu("h100"), 4, 0.5), labelled("l4", gpu("l4"), 1, 0.5))
	out := make([]float64, 2)
	q.Score(ctx, in, out)
	assert.InDeltaSlice(t, []float64{4, 2.2 / 0.39}, in.Raw, 1e-9, "raw: waiting in H100 terms")
	assert.Equal(t, []float64{1, 0}, out)

	in = input(&signals.Request{}, labelled("a", gpu("l4"), 4, 0.5), labelled("b", gpu("l4"), 1, 0.5))
	q.Score(ctx, in, out)
	assert.Equal(t, []float64{4, 1}, in.Raw, "one speed: the depths themselves")
	assert.Equal(t, []float64{0, 1}, out)
}
