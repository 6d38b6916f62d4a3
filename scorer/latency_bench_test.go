package scorer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
)

// latBenchFleet returns n endpoints and a latency.Predictor trained on them
// (20 observations each), with fresh scrapes.
func latBenchFleet(b *testing.B, n int) ([]*signals.Endpoint, *latency.Predictor) {
	b.Helper()
	clk := &latClock{t: time.Unix(1_700_000_000, 0)}
	pred := latency.New(latency.Config{Clock: clk, HalfLife: 5 * time.Second})
	eps := make([]*signals.Endpoint, n)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("ep%d", i)})
		eps[i].SetMetrics(&signals.Metrics{ScrapedAt: clk.t, Waiting: signals.Known(float64(i % 5)),
			Running: signals.Known(float64(i % 17)), KVCacheUtilization: signals.Known(0.3)})
		for k := 0; k < 20; k++ {
			req := &signals.Request{PromptTokens: 500 + rng.IntN(2000)}
			eps[i].Dispatch(req.PromptTokens)
			pred.Dispatched(req, eps[i])
			eps[i].Complete(req.PromptTokens)
			pred.Completed(req, eps[i], signals.Outcome{TTFT: time.Duration(100+rng.IntN(900)) * time.Millisecond})
		}
	}
	return eps, pred
}

// BenchmarkLatencyScorer scores 16 candidates with the real predictor.
func BenchmarkLatencyScorer(b *testing.B) {
	eps, pred := latBenchFleet(b, 16)
	s, err := scorer.NewLatencyScorer(scorer.DefaultLatencyParams(), scorer.Env{Estimator: pred})
	if err != nil {
		b.Fatal(err)
	}
	in := &scorer.Input{Request: &signals.Request{PromptTokens: 2000}, Endpoints: eps,
		Cached: make([]float64, len(eps)), Raw: make([]float64, len(eps))}
	out := make([]float64, len(eps))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Score(ctx, in, out)
	}
}

// BenchmarkSLOFilter filters 16 candidates against a TTFT objective that
// about half of them meet.
func BenchmarkSLOFilter(b *testing.B) {
	eps, pred := latBenchFleet(b, 16)
	f, err := scorer.NewSLOFilter(scorer.DefaultSLOParams(), scorer.Env{Estimator: pred})
	if err != nil {
		b.Fatal(err)
	}
	req := &signals.Request{PromptTokens: 2000, SLO: signals.SLO{TTFT: 600 * time.Millisecond}}
	cands := make([]*signals.Endpoint, len(eps))
	in := &scorer.Input{Request: req}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(cands, eps)
		in.Endpoints = cands
		f.Filter(ctx, in)
	}
}

// BenchmarkSLOAdmitter admits a sheddable request with a TTFT objective.
func BenchmarkSLOAdmitter(b *testing.B) {
	eps, pred := latBenchFleet(b, 16)
	a, err := scorer.NewSLOAdmitter(scorer.DefaultSLOParams(), scorer.Env{Estimator: pred})
	if err != nil {
		b.Fatal(err)
	}
	in := &scorer.Input{Request: &signals.Request{PromptTokens: 2000, Priority: -1, SLO: signals.SLO{TTFT: 2 * time.Second}},
		Endpoints: eps, Cached: make([]float64, len(eps))}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.Admit(ctx, in)
	}
}
