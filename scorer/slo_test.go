package scorer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// sloFakeMatcher reports match[name] for every endpoint.
type sloFakeMatcher struct{ match map[string]float64 }

func (m sloFakeMatcher) Match(_ *signals.Request, eps []*signals.Endpoint, out []float64) {
	for i, ep := range eps {
		out[i] = m.match[ep.Name]
	}
}

func sloNames(eps []*signals.Endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = ep.Name
	}
	return out
}

// sloFakeEstimator predicts a 100 ms, b 300 ms, c 500 ms TTFT and a 30 ms,
// b 10 ms, c 20 ms TPOT.
func sloFakeEstimator() *latFakeEstimator {
	return &latFakeEstimator{
		ttft: map[string]float64{"a": 0.1, "b": 0.3, "c": 0.5},
		tpot: map[string]float64{"a": 0.03, "b": 0.01, "c": 0.02},
	}
}

func TestSLOFilter(t *testing.T) {
	tests := []struct {
		name    string
		params  func(*scorer.SLOParams)
		est     signals.LatencyEstimator
		matcher signals.PrefixMatcher
		slo     signals.SLO
		eps     []string
		want    []string
	}{
		{name: "no SLO keeps all", est: sloFakeEstimator(), eps: []string{"a", "b", "c"}, want: []string{"a", "b", "c"}},
		{name: "ttft", est: sloFakeEstimator(), slo: signals.SLO{TTFT: 350 * time.Millisecond},
			eps: []string{"c", "b", "a"}, want: []string{"b", "a"}},
		{name: "ttft boundary is met", est: sloFakeEstimator(), slo: signals.SLO{TTFT: 300 * time.Millisecond},
			eps: []string{"a", "b", "c"}, want: []string{"a", "b"}},
		{name: "slack", est: sloFakeEstimator(), params: func(p *scorer.SLOParams) { p.Slack = 2 },
			slo: signals.SLO{TTFT: 250 * time.Millisecond}, eps: []string{"a", "b", "c"}, want: []string{"a", "b", "c"}},
		{name: "tpot", est: sloFakeEstimator(), slo: signals.SLO{TPOT: 25 * time.Millisecond},
			eps: []string{"a", "b", "c"}, want: []string{"b", "c"}},
		{name: "ttft and tpot", est: sloFakeEstimator(), slo: signals.SLO{TTFT: 400 * time.Millisecond, TPOT: 25 * time.Millisecond},
			eps: []string{"a", "b", "c"}, want: []string{"b"}},
		{name: "tpot ignored without a TPOT estimator", est: latTTFTOnly{sloFakeEstimator()}, slo: signals.SLO{TPOT: time.Millisecond},
			eps: []string{"a", "b", "c"}, want: []string{"a", "b", "c"}},
		// a: 0.1/0.05 = 2×, b: 6×, c: 10× the objective → a.
		{name: "fails open to the best", est: sloFakeEstimator(), slo: signals.SLO{TTFT: 50 * time.Millisecond},
			eps: []string{"c", "a", "b"}, want: []string{"a"}},
		// TTFT ratios a 0.4, b 1.2; TPOT ratios a 3, b 1 → worst a 3, b 1.2 → b.
		{name: "fails open by the worst ratio", est: sloFakeEstimator(), slo: signals.SLO{TTFT: 250 * time.Millisecond, TPOT: 10 * time.Millisecond * 99 / 100},
			eps: []string{"a", "b"}, want: []string{"b"}},
		{name: "unconfident endpoints are kept", est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.3, "c": 0.5},
			conf: map[string]float64{"c": 0.1}}, slo: signals.SLO{TTFT: 200 * time.Millisecond},
			eps: []string{"a", "b", "c"}, want: []string{"a", "c"}},
		{name: "endpoints without a prediction are kept", est: &latFakeEstimator{ttft: map[string]float64{"a": 0.5}},
			slo: signals.SLO{TTFT: 200 * time.Millisecond}, eps: []string{"a", "b"}, want: []string{"b"}},
		{name: "no estimator keeps all", slo: signals.SLO{TTFT: time.Millisecond}, eps: []string{"a", "b"}, want: []string{"a", "b"}},
		{name: "empty", est: sloFakeEstimator(), slo: signals.SLO{TTFT: time.Millisecond}, eps: nil, want: []string{}},
		// c's 500 ms × (1 − 0.8) = 100 ms with its prefix cached.
		{name: "prefix match from the matcher", est: sloFakeEstimator(), matcher: sloFakeMatcher{match: map[string]float64{"c": 0.8}},
			slo: signals.SLO{TTFT: 150 * time.Millisecond}, eps: []string{"a", "b", "c"}, want: []string{"a", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := scorer.DefaultSLOParams()
			if tt.params != nil {
				tt.params(&p)
			}
			f, err := scorer.NewSLOFilter(p, scorer.Env{Estimator: tt.est, Matcher: tt.matcher})
			require.NoError(t, err)
			eps := latEndpoints(tt.eps...)
			req := &signals.Request{SLO: tt.slo, PromptBlocks: []uint64{1, 2}}
			got := f.Filter(context.Background(), &scorer.Input{Request: req, Endpoints: eps})
			assert.Equal(t, tt.want, sloNames(got))
		})
	}
}

func TestSLOFilterAllocations(t *testing.T) {
	f, err := scorer.NewSLOFilter(scorer.DefaultSLOParams(), scorer.Env{Estimator: sloFakeEstimator(),
		Matcher: sloFakeMatcher{match: map[string]float64{"c": 0.8}}})
	require.NoError(t, err)
	base := latEndpoints("a", "b", "c")
	eps := make([]*signals.Endpoint, 3)
	req := &signals.Request{SLO: signals.SLO{TTFT: 150 * time.Millisecond}, PromptBlocks: []uint64{1}}
	in := &scorer.Input{Request: req}
	allocs := testing.AllocsPerRun(100, func() {
		copy(eps, base)
		in.Endpoints = eps
		f.Filter(context.Background(), in)
	})
	assert.Zero(t, allocs)
}

func TestSLOAdmitter(t *testing.T) {
	tests := []struct {
		name       string
		params     func(*scorer.SLOParams)
		est        signals.LatencyEstimator
		priority   int
		slo        signals.SLO
		eps        []string
		cached     []float64
		wantOK     bool
		wantReason string
	}{
		{name: "default priority is admitted", est: sloFakeEstimator(), slo: signals.SLO{TTFT: time.Millisecond},
			eps: []string{"a", "b"}, wantOK: true},
		{name: "critical is admitted", est: sloFakeEstimator(), priority: 5, slo: signals.SLO{TTFT: time.Millisecond},
			eps: []string{"a", "b"}, wantOK: true},
		{name: "sheddable with a reachable SLO", est: sloFakeEstimator(), priority: -1, slo: signals.SLO{TTFT: 150 * time.Millisecond},
			eps: []string{"b", "a"}, wantOK: true},
		{name: "sheddable with an unreachable SLO", est: sloFakeEstimator(), priority: -1, slo: signals.SLO{TTFT: 50 * time.Millisecond},
			eps: []string{"a", "b", "c"}, wantReason: "no endpoint predicted to meet its SLO (ttft 50ms, tpot 0s; best predicted TTFT 100ms, 2.00× the objective)"},
		{name: "sheddable with an unreachable TPOT", est: sloFakeEstimator(), priority: -1, slo: signals.SLO{TPOT: 5 * time.Millisecond},
			eps: []string{"a", "b"}, wantReason: "best predicted TTFT 100ms, 2.00× the objective"},
		{name: "prefix match makes it reachable", est: sloFakeEstimator(), priority: -1, slo: signals.SLO{TTFT: 50 * time.Millisecond},
			eps: []string{"a", "b"}, cached: []float64{0.6, 0}, wantOK: true},
		{name: "an unconfident candidate admits", est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.3}, conf: map[string]float64{"b": 0}},
			priority: -1, slo: signals.SLO{TTFT: 50 * time.Millisecond}, eps: []string{"a", "b"}, wantOK: true},
		{name: "a candidate without prediction admits", est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1}},
			priority: -1, slo: signals.SLO{TTFT: 50 * time.Millisecond}, eps: []string{"a", "b"}, wantOK: true},
		{name: "no SLO, no shed threshold", est: sloFakeEstimator(), priority: -1, eps: []string{"a"}, wantOK: true},
		{name: "no SLO, under the shed threshold", est: sloFakeEstimator(), priority: -1,
			params: func(p *scorer.SLOParams) { p.ShedTTFTMs = 200 }, eps: []string{"b", "a"}, wantOK: true},
		{name: "no SLO, over the shed threshold", est: sloFakeEstimator(), priority: -1,
			params: func(p *scorer.SLOParams) { p.ShedTTFTMs = 80 }, eps: []string{"b", "a", "c"},
			wantReason: "every endpoint's predicted TTFT exceeds 80ms (best 100ms)"},
		{name: "no estimator", priority: -1, slo: signals.SLO{TTFT: time.Nanosecond}, eps: []string{"a"}, wantOK: true},
		{name: "no candidates", est: sloFakeEstimator(), priority: -1, slo: signals.SLO{TTFT: time.Nanosecond}, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := scorer.DefaultSLOParams()
			if tt.params != nil {
				tt.params(&p)
			}
			a, err := scorer.NewSLOAdmitter(p, scorer.Env{Estimator: tt.est})
			require.NoError(t, err)
			eps := latEndpoints(tt.eps...)
			cached := tt.cached
			if cached == nil {
				cached = make([]float64, len(eps))
			}
			in := &scorer.Input{Request: &signals.Request{Priority: tt.priority, SLO: tt.slo}, Endpoints: eps, Cached: cached}
			ok, reason := a.Admit(context.Background(), in)
			assert.Equal(t, tt.wantOK, ok)
			if tt.wantOK {
				assert.Empty(t, reason)
			} else {
				assert.Contains(t, reason, tt.wantReason)
			}
		})
	}
}

func TestSLOAdmitterAllocations(t *testing.T) {
	a, err := scorer.NewSLOAdmitter(scorer.DefaultSLOParams(), scorer.Env{Estimator: sloFakeEstimator()})
	require.NoError(t, err)
	eps := latEndpoints("c", "b", "a")
	in := &scorer.Input{Request: &signals.Request{Priority: -1, SLO: signals.SLO{TTFT: 150 * time.Millisecond}},
		Endpoints: eps, Cached: make([]float64, 3)}
	allocs := testing.AllocsPerRun(100, func() {
		if ok, _ := a.Admit(context.Background(), in); !ok {
			t.Fatal("rejected")
		}
	})
	assert.Zero(t, allocs)
}

func TestSLOParams(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    scorer.SLOParams
		wantErr string
	}{
		{name: "defaults", want: scorer.SLOParams{Slack: 1, MinConfidence: 0.25}},
		{name: "all", yaml: `{"slack": 1.5, "minConfidence": 0, "shedTTFTMs": 2000}`,
			want: scorer.SLOParams{Slack: 1.5, ShedTTFTMs: 2000}},
		{name: "unknown", yaml: `{"slak": 1}`, wantErr: "slak"},
		{name: "zero slack", yaml: `slack: 0`, wantErr: "slack"},
		{name: "confidence over 1", yaml: `minConfidence: 2`, wantErr: "minConfidence"},
		{name: "negative shed", yaml: `shedTTFTMs: -1`, wantErr: "shedTTFTMs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			params, err := scorer.ParseParams(tt.yaml)
			require.NoError(t, err)
			f, err := scorer.NewSLOFilterFromParams(params, scorer.Env{})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				_, err = scorer.NewSLOAdmitter(scorer.SLOParams{Slack: -1}, scorer.Env{})
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, f.(*scorer.SLOFilter).Params())
			a, err := scorer.NewSLOAdmitter(tt.want, scorer.Env{})
			require.NoError(t, err)
			assert.Equal(t, tt.want, a.Params())
		})
	}
}
