package scorer_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
)

// latFakeEstimator predicts ttft[name] × (1 − cachedFraction) seconds and
// tpot[name]; a name missing from ttft has no prediction. conf[name] is the
// confidence (missing: 1).
type latFakeEstimator struct {
	ttft, tpot, conf map[string]float64
}

func (f *latFakeEstimator) PredictTTFT(_ *signals.Request, ep *signals.Endpoint, cached float64) (float64, bool) {
	v, ok := f.ttft[ep.Name]
	return v * (1 - cached), ok
}

func (f *latFakeEstimator) PredictTPOT(_ *signals.Request, ep *signals.Endpoint) (float64, bool) {
	v, ok := f.tpot[ep.Name]
	return v, ok
}

func (f *latFakeEstimator) Confidence(ep *signals.Endpoint) float64 {
	if c, ok := f.conf[ep.Name]; ok {
		return c
	}
	return 1
}

// latTTFTOnly hides the optional interfaces of an estimator.
type latTTFTOnly struct{ e signals.LatencyEstimator }

func (t latTTFTOnly) PredictTTFT(r *signals.Request, ep *signals.Endpoint, c float64) (float64, bool) {
	return t.e.PredictTTFT(r, ep, c)
}

func latEndpoints(names ...string) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, len(names))
	for i, n := range names {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: n, Address: n + ":8000"})
	}
	return eps
}

func latNaNs(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

func TestLatencyScorer(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name    string
		params  func(*scorer.LatencyParams)
		est     signals.LatencyEstimator
		cached  []float64
		want    []float64
		wantRaw []float64
	}{
		{
			name:    "ratio to best",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.4}},
			want:    []float64{1, 0.5, 0.25},
			wantRaw: []float64{0.1, 0.2, 0.4},
		},
		{
			name:    "minmax",
			params:  func(p *scorer.LatencyParams) { p.Normalize = scorer.NormalizeMinMax },
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.4}},
			want:    []float64{1, 2.0 / 3, 0},
			wantRaw: []float64{0.1, 0.2, 0.4},
		},
		{
			name:    "prefix match lowers the prediction",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.4, "b": 0.4, "c": 0.4}},
			cached:  []float64{0, 0.5, 0.75},
			want:    []float64{0.25, 0.5, 1},
			wantRaw: []float64{0.4, 0.2, 0.1},
		},
		{
			// best confident = 0.1; c (confidence 0) is blended fully to it,
			// so the scores are 0.1/0.1, 0.1/0.2 and 0.1/0.1: an unknown
			// endpoint ties with the best, whatever its guess (here 0.5).
			name: "unconfident candidate ties with the best",
			est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.5},
				conf: map[string]float64{"c": 0}},
			want:    []float64{1, 0.5, 1},
			wantRaw: []float64{0.1, 0.2, 0.5},
		},
		{
			// An unconfident guess below the best does not win either.
			name: "unconfident low guess is not the best",
			est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.01},
				conf: map[string]float64{"c": 0}},
			want:    []float64{1, 0.5, 1},
			wantRaw: []float64{0.1, 0.2, 0.01},
		},
		{
			// best = 0.1 (a); b → 0.5×0.4 + 0.5×0.1 = 0.25.
			name: "half confidence blends half way",
			est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.4},
				conf: map[string]float64{"b": 0.5}},
			want:    []float64{1, 0.1 / 0.25, scorer.Neutral},
			wantRaw: []float64{0.1, 0.4, nan},
		},
		{
			// best = 0.1 (a, confidence 0.5 > 0); a → 0.1,
			// b → 0.5×0.2 + 0.5×0.1 = 0.15, c → 0.5×0.6 + 0.5×0.1 = 0.35.
			name: "every confidence partial",
			est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.6},
				conf: map[string]float64{"a": 0.5, "b": 0.5, "c": 0.5}},
			want:    []float64{1, 0.1 / 0.15, 0.1 / 0.35},
			wantRaw: []float64{0.1, 0.2, 0.6},
		},
		{
			name: "ignore confidence",
			params: func(p *scorer.LatencyParams) {
				p.IgnoreConfidence = true
			},
			est: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.05},
				conf: map[string]float64{"c": 0}},
			want:    []float64{0.5, 0.25, 1},
			wantRaw: []float64{0.1, 0.2, 0.05},
		},
		{
			name:    "unknown prediction is neutral",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "c": 0.3}},
			want:    []float64{1, scorer.Neutral, 1.0 / 3},
			wantRaw: []float64{0.1, nan, 0.3},
		},
		{
			name:    "no confidence anywhere is neutral",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2, "c": 0.4}, conf: map[string]float64{"a": 0, "b": 0, "c": 0}},
			want:    []float64{scorer.Neutral, scorer.Neutral, scorer.Neutral},
			wantRaw: []float64{0.1, 0.2, 0.4},
		},
		{
			name:    "nil estimator is neutral",
			want:    []float64{scorer.Neutral, scorer.Neutral, scorer.Neutral},
			wantRaw: []float64{nan, nan, nan},
		},
		{
			name:    "NoLatencyEstimator is neutral",
			est:     signals.NoLatencyEstimator{},
			want:    []float64{scorer.Neutral, scorer.Neutral, scorer.Neutral},
			wantRaw: []float64{nan, nan, nan},
		},
		{
			name:    "below the floor is a tie",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": 0.001, "b": 0.005, "c": 0.02}},
			want:    []float64{1, 1, 0.5},
			wantRaw: []float64{0.001, 0.005, 0.02},
		},
		{
			name:    "bad predictions are unknown",
			est:     &latFakeEstimator{ttft: map[string]float64{"a": math.Inf(1), "b": -1, "c": 0.2}},
			want:    []float64{scorer.Neutral, scorer.Neutral, 1},
			wantRaw: []float64{nan, nan, 0.2},
		},
		{
			name:    "estimator without confidence is trusted",
			est:     latTTFTOnly{&latFakeEstimator{ttft: map[string]float64{"a": 0.2, "b": 0.1, "c": 0.4}, conf: map[string]float64{"a": 0, "b": 0, "c": 0}}},
			want:    []float64{0.5, 1, 0.25},
			wantRaw: []float64{0.2, 0.1, 0.4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := scorer.DefaultLatencyParams()
			if tt.params != nil {
				tt.params(&p)
			}
			s, err := scorer.NewLatencyScorer(p, scorer.Env{Estimator: tt.est})
			require.NoError(t, err)
			eps := latEndpoints("a", "b", "c")
			cached := tt.cached
			if cached == nil {
				cached = make([]float64, len(eps))
			}
			in := &scorer.Input{Request: &signals.Request{PromptTokens: 100}, Endpoints: eps, Cached: cached, Raw: latNaNs(len(eps))}
			out := make([]float64, len(eps))
			s.Score(context.Background(), in, out)
			require.Len(t, out, len(tt.want))
			for i := range tt.want {
				assert.InDelta(t, tt.want[i], out[i], 1e-12, "score %d", i)
				if math.IsNaN(tt.wantRaw[i]) {
					assert.True(t, math.IsNaN(in.Raw[i]), "raw %d = %v", i, in.Raw[i])
				} else {
					assert.InDelta(t, tt.wantRaw[i], in.Raw[i], 1e-12, "raw %d", i)
				}
			}
			// Without a Raw slice the scores are the same.
			in.Raw = nil
			s.Score(context.Background(), in, out)
			for i := range tt.want {
				assert.InDelta(t, tt.want[i], out[i], 1e-12, "score %d without Raw", i)
			}
		})
	}
	t.Run("no Raw or Cached slices", func(t *testing.T) {
		s, err := scorer.NewLatencyScorer(scorer.DefaultLatencyParams(),
			scorer.Env{Estimator: &latFakeEstimator{ttft: map[string]float64{"a": 0.1, "b": 0.2}}})
		require.NoError(t, err)
		out := make([]float64, 2)
		s.Score(context.Background(), &scorer.Input{Request: &signals.Request{}, Endpoints: latEndpoints("a", "b")}, out)
		assert.Equal(t, []float64{1, 0.5}, out)
	})
}

func TestLatencyParams(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    scorer.LatencyParams
		wantErr string
	}{
		{name: "defaults", yaml: "", want: scorer.LatencyParams{FloorMs: 10, Normalize: "ratio"}},
		{name: "json", yaml: `{"floorMs": 5, "normalize": "minmax", "ignoreConfidence": true}`,
			want: scorer.LatencyParams{FloorMs: 5, Normalize: "minmax", IgnoreConfidence: true}},
		{name: "unknown field", yaml: `{"floor": 5}`, wantErr: "floor"},
		{name: "bad normalize", yaml: `normalize: zscore`, wantErr: "zscore"},
		{name: "zero floor", yaml: `floorMs: 0`, wantErr: "floorMs"},
		{name: "zero floor is fine for minmax", yaml: `{floorMs: 0, normalize: minmax}`,
			want: scorer.LatencyParams{Normalize: "minmax"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			params, err := scorer.ParseParams(tt.yaml)
			require.NoError(t, err)
			s, err := scorer.NewLatencyScorerFromParams(params, scorer.Env{})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, s.(*scorer.LatencyScorer).Params())
		})
	}
}

// TestLatencyScorerWithPredictor drives the scorer with the real
// latency.Predictor on three endpoints of 1×, 2× and 4× prefill speed (TTFT
// = 30 ms + prompt / (4000 tokens/s × speed), 5% noise), 100 observations
// each: the 4× endpoint must score 1, the others by their speed ratio
// within 15%.
func TestLatencyScorerWithPredictor(t *testing.T) {
	clk := &latClock{t: time.Unix(1_700_000_000, 0)}
	pred := latency.New(latency.Config{Clock: clk})
	eps := latEndpoints("x1", "x2", "x4")
	speeds := []float64{1, 2, 4}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100; i++ {
		for k, ep := range eps {
			req := &signals.Request{PromptTokens: 500 + rng.IntN(3000)}
			ep.Dispatch(req.PromptTokens)
			pred.Dispatched(req, ep)
			ttft := (0.03 + float64(req.PromptTokens)/(4000*speeds[k])) * math.Exp(0.05*rng.NormFloat64())
			ep.Complete(req.PromptTokens)
			pred.Completed(req, ep, signals.Outcome{TTFT: time.Duration(ttft * float64(time.Second))})
			clk.t = clk.t.Add(10 * time.Millisecond)
		}
	}
	s, err := scorer.NewLatencyScorer(scorer.DefaultLatencyParams(), scorer.Env{Estimator: pred})
	require.NoError(t, err)
	in := &scorer.Input{Request: &signals.Request{PromptTokens: 4000}, Endpoints: eps,
		Cached: make([]float64, 3), Raw: latNaNs(3)}
	out := make([]float64, 3)
	s.Score(context.Background(), in, out)
	// True TTFTs: 1.03 s, 0.53 s, 0.28 s → ratios to best 0.272, 0.528, 1.
	want := []float64{0.28 / 1.03, 0.28 / 0.53, 1}
	for i := range want {
		assert.InDelta(t, want[i], out[i], 0.15*want[i], "score of %s", eps[i].Name)
	}
	assert.InDelta(t, 1.03, in.Raw[0], 0.15*1.03, "raw is the predicted TTFT in seconds")
}

type latClock struct{ t time.Time }

func (c *latClock) Now() time.Time { return c.t }
