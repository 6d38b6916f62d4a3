package latency_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
)

type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

// TestPickerLearnsFastestEndpoint runs the predictor and the latency scorer
// inside the real picker on an idle fleet of unlabelled 1×, 2× and 4×
// endpoints (TTFT = 30 ms + prompt / (4000 tokens/s × speed), no noise).
// The predictor learns only through the picker's Dispatched and Done. At
// first every score is neutral and ties are broken at random, so every
// endpoint is sampled; once the models are confident, every pick of an idle
// fleet must go to the 4× endpoint, and the pick breakdown must carry each
// candidate's predicted TTFT. (The scorer's optimism toward unconfident
// endpoints is what gets the 4× endpoint sampled at all: blending them
// toward the mean instead left it unsampled in this very test.)
func TestPickerLearnsFastestEndpoint(t *testing.T) {
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	pred := latency.New(latency.Config{Clock: clk})
	reg := scorer.NewRegistry()
	const name = "latency-under-test"
	require.NoError(t, reg.RegisterScorer(name, scorer.NewLatencyScorerFromParams))
	p, err := picker.New(picker.Config{Scorers: []picker.Plugin{{Name: name, Weight: 1}}},
		picker.WithClock(clk), picker.WithSeed(3), picker.WithRegistry(reg), picker.WithLatencyEstimator(pred))
	require.NoError(t, err)

	speeds := map[string]float64{"x1": 1, "x2": 2, "x4": 4}
	eps := []*signals.Endpoint{
		signals.NewEndpoint(signals.EndpointSpec{Name: "x1"}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "x2"}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "x4"}),
	}
	p.SetEndpoints(eps)

	picks := map[string]int{}
	for i := 0; i < 300; i++ {
		req := &signals.Request{PromptTokens: 500 + (i*977)%3000}
		res, err := p.Pick(context.Background(), req)
		require.NoError(t, err)
		ep := res.Endpoint
		if i >= 200 {
			picks[ep.Name]++
		}
		if i == 299 {
			b := res.Breakdown
			require.Equal(t, 3, b.Len())
			raw := map[string]float64{}
			for k := 0; k < b.Len(); k++ {
				raw[b.Endpoint(k).Name] = b.Raw(0, k)
			}
			// The fleet is idle at pick time: x4's well-trained prediction
			// is the truth for this request within 10%; the others, sampled
			// only while exploring, at least rank right.
			want := 0.03 + float64(req.PromptTokens)/(4000*4)
			assert.InDelta(t, want, raw["x4"], 0.1*want, "breakdown raw is x4's predicted TTFT")
			assert.Less(t, raw["x4"], raw["x2"])
			assert.Less(t, raw["x2"], raw["x1"])
		}
		ttft := 0.03 + float64(req.PromptTokens)/(4000*speeds[ep.Name])
		clk.t = clk.t.Add(time.Duration(ttft * float64(time.Second)))
		res.Done(signals.Outcome{TTFT: time.Duration(ttft * float64(time.Second))})
	}
	assert.Equal(t, map[string]int{"x4": 100}, picks, "an idle fleet's picks go to the fastest endpoint")
	for _, ep := range eps {
		e := pred.Explain(ep)
		assert.Positive(t, e.Samples, "%s was sampled", ep.Name)
		tp, ok := ep.Throughput()
		if e.Samples >= 10 {
			require.True(t, ok)
			assert.InDelta(t, 4000*speeds[ep.Name], tp, 0.1*4000*speeds[ep.Name], "%s throughput", ep.Name)
		}
		assert.False(t, math.IsNaN(e.PerKiloToken))
	}
}

// TestPickerSLO wires the SLO filter and the SLO admitter into the real
// picker after the predictor has learned a 1×/4× fleet (TTFT = 30 ms +
// prompt / (4000 tokens/s × speed); for 2000 tokens 0.53 s and 0.155 s).
func TestPickerSLO(t *testing.T) {
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	pred := latency.New(latency.Config{Clock: clk})
	slow := signals.NewEndpoint(signals.EndpointSpec{Name: "slow"})
	fast := signals.NewEndpoint(signals.EndpointSpec{Name: "fast"})
	speeds := map[*signals.Endpoint]float64{slow: 1, fast: 4}
	for i := 0; i < 50; i++ {
		for ep, speed := range speeds {
			r := &signals.Request{PromptTokens: 500 + 60*i}
			ep.Dispatch(r.PromptTokens)
			pred.Dispatched(r, ep)
			ep.Complete(r.PromptTokens)
			ttft := 0.03 + float64(r.PromptTokens)/(4000*speed)
			pred.Completed(r, ep, signals.Outcome{TTFT: time.Duration(ttft * float64(time.Second))})
			clk.t = clk.t.Add(10 * time.Millisecond)
		}
	}

	reg := scorer.NewRegistry()
	require.NoError(t, reg.RegisterFilter("slo-under-test", scorer.NewSLOFilterFromParams))
	admit, err := scorer.NewSLOAdmitter(scorer.DefaultSLOParams(), scorer.Env{Estimator: pred})
	require.NoError(t, err)
	p, err := picker.New(picker.Config{Filters: []picker.Plugin{{Name: "slo-under-test"}}},
		picker.WithClock(clk), picker.WithRegistry(reg), picker.WithLatencyEstimator(pred), picker.WithAdmitter(admit))
	require.NoError(t, err)
	p.SetEndpoints([]*signals.Endpoint{slow, fast})

	tests := []struct {
		name     string
		priority int
		slo      time.Duration
		want     string // endpoint name, or "" for a rejection
	}{
		{name: "no SLO", priority: -1},
		{name: "met by the fast endpoint only", priority: -1, slo: 300 * time.Millisecond, want: "fast"},
		{name: "met by nobody, default priority: fail open to the best", priority: 0, slo: 50 * time.Millisecond, want: "fast"},
		{name: "met by nobody, sheddable: rejected", priority: -1, slo: 50 * time.Millisecond, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &signals.Request{PromptTokens: 2000, Priority: tt.priority, SLO: signals.SLO{TTFT: tt.slo}}
			res, err := p.Pick(context.Background(), req)
			defer res.Done(signals.Outcome{Err: errors.New("not sent")})
			if tt.slo == 0 {
				// Without an SLO nothing is filtered or shed: either may win.
				require.NoError(t, err)
				return
			}
			if tt.want == "" {
				require.ErrorIs(t, err, picker.ErrSaturated)
				var pe *picker.Error
				require.ErrorAs(t, err, &pe)
				assert.Contains(t, pe.Reason, "no endpoint predicted to meet its SLO")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, res.Endpoint.Name)
		})
	}
}
