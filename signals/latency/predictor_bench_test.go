package latency

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// benchPredictor returns a predictor trained on a synthetic endpoint that
// has a fresh scrape, so predictions read every feature.
func benchPredictor(b *testing.B) (*Predictor, *synthEndpoint, *fakeClock) {
	b.Helper()
	clk := newFakeClock()
	p := New(Config{Clock: clk, HalfLife: 5 * time.Second})
	fleet := newSynthFleet(2)
	rng := rand.New(rand.NewPCG(1, 1))
	trainFleet(p, clk, rng, fleet, 100)
	fleet[0].publish(synthLoad{prompt: 2000, waiting: 3, running: 12, kv: 0.4}, clk.Now())
	return p, fleet[0], clk
}

// BenchmarkPredict is one PredictTTFT on a trained endpoint: the cost per
// candidate on the pick path.
func BenchmarkPredict(b *testing.B) {
	p, s, _ := benchPredictor(b)
	req := &signals.Request{PromptTokens: 2000, Adapter: "a"}
	b.ReportAllocs()
	b.ResetTimer()
	var sink float64
	for i := 0; i < b.N; i++ {
		v, _ := p.PredictTTFT(req, s.ep, 0.25)
		sink += v
	}
	_ = sink
}

// BenchmarkPredictParallel is PredictTTFT from all Ps on one endpoint.
func BenchmarkPredictParallel(b *testing.B) {
	p, s, _ := benchPredictor(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := &signals.Request{PromptTokens: 2000}
		for pb.Next() {
			p.PredictTTFT(req, s.ep, 0.25)
		}
	})
}

// BenchmarkUpdate is one Dispatched plus one Completed (with TTFT and TPOT
// observations): the learning cost per request.
func BenchmarkUpdate(b *testing.B) {
	p, s, clk := benchPredictor(b)
	reqs := make([]signals.Request, 1024)
	for i := range reqs {
		reqs[i].PromptTokens = 500 + i
	}
	out := signals.Outcome{TTFT: 400 * time.Millisecond, Latency: 2 * time.Second, CompletionTokens: 80}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := &reqs[i%len(reqs)]
		s.ep.Dispatch(req.PromptTokens)
		p.Dispatched(req, s.ep)
		s.ep.Complete(req.PromptTokens)
		p.Completed(req, s.ep, out)
	}
	_ = clk
}

// benchModel returns the model and the feature vector of the model
// benchmarks.
func benchModel() (model, [maxDim]float64) {
	reg := [maxDim]float64{1, 1, 1, 1, 1, 1}
	prior := [maxDim]float64{0.05, 0.25, 0.25, 0.002, 0, 0.3}
	var m model
	m.reset(ttftDim, 0.97, 1e-3, 10, &reg, &prior)
	return m, [maxDim]float64{1, 1.5, 4, 12, 0.4, 0}
}

// updateModel folds n observations into m whose prompt size cycles
// through 0–4000 tokens, the other features as x holds them.
func updateModel(m *model, x *[maxDim]float64, n int) {
	for i := 0; i < n; i++ {
		x[fUncached] = float64(i%4000) / 1000
		m.update(x, 0.5+x[fUncached]*0.25)
	}
}

// BenchmarkModelUpdate is the bare model update: one rank-one accumulation
// and a 6×6 Cholesky solve.
func BenchmarkModelUpdate(b *testing.B) {
	m, x := benchModel()
	b.ReportAllocs()
	b.ResetTimer()
	updateModel(&m, &x, b.N)
}

// BenchmarkModelUpdateStale is BenchmarkModelUpdate on a model two of
// whose features went to zero long ago: the queue and the KV cache
// were busy for the first 1000 observations and have read zero since, as
// on a fleet that has gone quiet, or whose prompts are all cached. Their
// statistics have been forgotten for 200,000 observations, far past the
// point (about 23,000 at λ = 0.97) where exponential forgetting would
// have taken them below the smallest normal float64.
func BenchmarkModelUpdateStale(b *testing.B) {
	m, x := benchModel()
	updateModel(&m, &x, 1000)
	x[fQueued], x[fKV] = 0, 0
	updateModel(&m, &x, 200000)
	b.ReportAllocs()
	b.ResetTimer()
	updateModel(&m, &x, b.N)
}
