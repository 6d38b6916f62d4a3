package scorer_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

func TestPrefillScorer(t *testing.T) {
	newEP := func(name string, tokensPerSecond float64, queued ...int) *signals.Endpoint {
		e := signals.NewEndpoint(signals.EndpointSpec{Name: name})
		e.SetThroughput(tokensPerSecond)
		for _, q := range queued {
			e.StartPrefill(q)
		}
		return e
	}
	for _, tt := range []struct {
		name   string
		eps    []*signals.Endpoint
		cached []float64
		prompt int
		raw    []float64 // seconds
		want   []float64
	}{
		{
			// (queued + own) / rate: (0+1000)/10000, (2000+1000)/10000,
			// (0+1000)/2500 → 0.1, 0.3, 0.4 s; scores best/v.
			name:   "queue and speed",
			eps:    []*signals.Endpoint{newEP("idle", 10000), newEP("busy", 10000, 1500, 500), newEP("slow", 2500)},
			prompt: 1000,
			raw:    []float64{0.1, 0.3, 0.4},
			want:   []float64{1, 1.0 / 3, 0.25},
		},
		{
			// A prefix hit shortens the request's own part: 90% cached on
			// "warm" leaves 100 tokens: (500+100)/10000 = 0.06 s against
			// (0+1000)/10000 = 0.1 s.
			name:   "prefix hit",
			eps:    []*signals.Endpoint{newEP("cold", 10000), newEP("warm", 10000, 500)},
			cached: []float64{0, 0.9},
			prompt: 1000,
			raw:    []float64{0.1, 0.06},
			want:   []float64{0.6, 1},
		},
		{
			// Below the 10 ms floor, estimates count as the floor: 20 and 50
			// tokens at 10k tok/s are 2 and 5 ms, both 10 ms.
			name:   "floor",
			eps:    []*signals.Endpoint{newEP("a", 10000), newEP("b", 10000, 30)},
			prompt: 20,
			raw:    []float64{0.002, 0.005},
			want:   []float64{1, 1},
		},
		{
			// Unmeasured throughput falls back to DefaultPrefillRate.
			name:   "default rate",
			eps:    []*signals.Endpoint{newEP("a", 0, 10000), newEP("b", 0)},
			prompt: 0,
			raw:    []float64{10000 / signals.DefaultPrefillRate, 0},
			want:   []float64{0.01 / (10000 / signals.DefaultPrefillRate), 1},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
			require.NoError(t, err)
			in := &scorer.Input{Request: &signals.Request{PromptTokens: tt.prompt}, Endpoints: tt.eps,
				Cached: tt.cached, Raw: make([]float64, len(tt.eps))}
			out := make([]float64, len(tt.eps))
			s.Score(context.Background(), in, out)
			assert.InDeltaSlice(t, tt.raw, in.Raw, 1e-9)
			assert.InDeltaSlice(t, tt.want, out, 1e-9)
		})
	}
}

// TestPrefillSharedRate: candidates labelled with one speed share the
// mean of their measured rates, so that the pod with less work queued wins
// whatever its own measurement says; without labels, or with different
// speeds, each keeps its own rate.
func TestPrefillSharedRate(t *testing.T) {
	newEP := func(labels map[string]string, tokensPerSecond float64, queued int) *signals.Endpoint {
		e := signals.NewEndpoint(signals.EndpointSpec{Name: "ep", Labels: labels})
		e.SetThroughput(tokensPerSecond)
		e.StartPrefill(queued)
		return e
	}
	h100 := map[string]string{signals.LabelGPU: "h100"}
	a100 := map[string]string{signals.LabelGPU: "a100"}
	for _, tt := range []struct {
		name   string
		labels [2]map[string]string
		raw    []float64 // seconds
	}{
		// Own rates: 2000/4000 = 0.5 s against 1000/1000 = 1 s.
		{"unlabelled", [2]map[string]string{nil, nil}, []float64{0.5, 1}},
		// One GPU: both at the mean, 2500 tokens/s: 0.8 s against 0.4 s.
		{"one GPU", [2]map[string]string{h100, h100}, []float64{0.8, 0.4}},
		// Two speeds: own rates again.
		{"two GPUs", [2]map[string]string{h100, a100}, []float64{0.5, 1}},
		// One labelled, one not: own rates.
		{"one labelled", [2]map[string]string{h100, nil}, []float64{0.5, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eps := []*signals.Endpoint{newEP(tt.labels[0], 4000, 2000), newEP(tt.labels[1], 1000, 1000)}
			s, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
			require.NoError(t, err)
			in := &scorer.Input{Request: &signals.Request{}, Endpoints: eps, Raw: make([]float64, 2)}
			out := make([]float64, 2)
			s.Score(context.Background(), in, out)
			assert.InDeltaSlice(t, tt.raw, in.Raw, 1e-9)
			best := min(tt.raw[0], tt.raw[1])
			assert.InDeltaSlice(t, []float64{best / tt.raw[0], best / tt.raw[1]}, out, 1e-9)
		})
	}
	// An unmeasured pod among labelled ones takes the measured mean too.
	eps := []*signals.Endpoint{newEP(h100, 4000, 2000), newEP(h100, 0, 1000)}
	s, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
	require.NoError(t, err)
	in := &scorer.Input{Request: &signals.Request{}, Endpoints: eps, Raw: make([]float64, 2)}
	s.Score(context.Background(), in, make([]float64, 2))
	assert.InDeltaSlice(t, []float64{0.5, 0.25}, in.Raw, 1e-9)
}

func TestPrefillParams(t *testing.T) {
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		_, err := scorer.NewPrefillScorer(scorer.PrefillParams{FloorMs: bad})
		assert.Error(t, err, "%v", bad)
	}
	r := scorer.NewRegistry()
	_, err := r.NewScorer(scorer.ScorerPrefill, mustParams(t, "floorMs: 5"), scorer.Env{})
	assert.NoError(t, err)
	_, err = r.NewScorer(scorer.ScorerPrefill, mustParams(t, "floor: 5"), scorer.Env{})
	assert.ErrorContains(t, err, "floor")
}

func mustParams(t *testing.T, text string) scorer.Params {
	t.Helper()
	p, err := scorer.ParseParams(text)
	require.NoError(t, err)
	return p
}
