package scorer_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// TestNormalizedPromise checks, for every built-in scorer that implements
// scorer.Normalized, the promise that lets the picker skip clamping and
// pre-filling Raw: on hostile pools (values NaN, infinite, negative, over
// 1, unscraped endpoints, unmeasured throughputs, cached fractions at the
// edges) every score is in [0, 1] and every Raw entry is written.
func TestNormalizedPromise(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	nan, inf := math.NaN(), math.Inf(1)
	scorers := normalizedScorers(t)
	values := []float64{nan, inf, -inf, -3, 0, 0.5, 1, 1.7, 40, 1e300}
	pools := []struct {
		name   string
		n      int
		metric func(i int) *signals.Metrics // nil: never scraped
		tp     func(i int) float64
		cached func(i int) float64
	}{
		{"hostile values", 10, func(i int) *signals.Metrics {
			v := values[i%len(values)]
			return &signals.Metrics{Waiting: signals.Reading{Value: v, Known: true}, Running: signals.Reading{Value: -v, Known: true},
				KVCacheUtilization: signals.Reading{Value: v, Known: true}, BlockSize: 16, NumBlocks: i}
		}, func(i int) float64 { return values[(i+3)%len(values)] }, func(i int) float64 { return float64(i%3) / 2 }},
		{"never scraped", 4, func(int) *signals.Metrics { return nil }, func(int) float64 { return 0 }, func(int) float64 { return 0 }},
		{"all equal", 5, func(int) *signals.Metrics {
			return &signals.Metrics{Waiting: signals.Known(2), Running: signals.Known(2), KVCacheUtilization: signals.Known(0.3)}
		}, func(int) float64 { return 8000 }, func(int) float64 { return 1 }},
		{"single", 1, func(int) *signals.Metrics { return &signals.Metrics{Waiting: signals.Known(1e9)} },
			func(int) float64 { return 1e-300 }, func(int) float64 { return 0.9 }},
	}
	for _, pool := range pools {
		eps := make([]*signals.Endpoint, pool.n)
		for i := range eps {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("e%d", i), Adapters: []string{"a"}})
			if m := pool.metric(i); m != nil {
				m.ScrapedAt = t0.Add(-time.Duration(i) * time.Second)
				m.Baseline = ep.Counters()
				ep.SetMetrics(m)
			}
			ep.SetThroughput(pool.tp(i))
			for j := 0; j < i%3; j++ {
				ep.Dispatch(1 << 20)
				ep.StartPrefill(1 << 20)
				ep.NoteDispatch(t0)
			}
			eps[i] = ep
		}
		for _, req := range []*signals.Request{{Model: "m", PromptTokens: 3000}, {Model: "m", Adapter: "a"}, {Model: "m", PromptTokens: math.MaxInt32}} {
			for name, s := range scorers {
				t.Run(fmt.Sprintf("%s/%s/adapter=%q", pool.name, name, req.Adapter), func(t *testing.T) {
					var in scorer.Input
					in.Reset(req, append([]*signals.Endpoint(nil), eps...), t0)
					in.Cached = make([]float64, pool.n)
					for i := range in.Cached {
						in.Cached[i] = pool.cached(i)
					}
					const unwritten = -12345.0
					in.Raw = make([]float64, pool.n)
					out := make([]float64, pool.n)
					for i := range out {
						in.Raw[i], out[i] = unwritten, nan
					}
					s.Score(context.Background(), &in, out)
					for i := range out {
						assert.True(t, out[i] >= 0 && out[i] <= 1, "score %d = %v", i, out[i])
						assert.NotEqual(t, unwritten, in.Raw[i], "raw %d not written", i)
					}
				})
			}
		}
	}
}

// normalizedScorers returns every built-in scorer that implements
// scorer.Normalized, by name.
func normalizedScorers(t *testing.T) map[string]scorer.Normalized {
	t.Helper()
	env := scorer.Env{HalfLife: 2 * time.Second}
	prefix, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), env)
	require.NoError(t, err)
	prefill, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
	require.NoError(t, err)
	return map[string]scorer.Normalized{
		"queue":      &scorer.QueueScorer{HalfLife: env.HalfLife},
		"kv-cache":   &scorer.KVCacheScorer{HalfLife: env.HalfLife},
		"running":    &scorer.RunningScorer{HalfLife: env.HalfLife},
		"lora":       scorer.LoRAScorer{},
		"token-load": scorer.TokenLoadScorer{},
		"burst":      scorer.BurstScorer{},
		"prefill":    prefill,
		"prefix":     prefix,
	}
}

// TestNormalizedPromiseExtremeSpreads is TestNormalizedPromise for pools
// whose raw values are fresh scrapes with a spread so small that its
// reciprocal overflows (subnormal queue and batch sizes), or throughputs
// that make the token loads' spread so: every score is still in [0, 1].
func TestNormalizedPromiseExtremeSpreads(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	pools := map[string][]float64{
		"subnormal":        {0, 5e-324, 1e-310},
		"smallest":         {5e-324, 1e-323},
		"huge and tiny":    {math.MaxFloat64, 0, 1e-310},
		"normal and equal": {1e-310, 1e-310},
	}
	for pool, values := range pools {
		eps := make([]*signals.Endpoint, len(values))
		for i, v := range values {
			eps[i] = signalstest.Endpoint(fmt.Sprintf("e%d", i), signalstest.Load{Running: v, Waiting: v, KV: 0.5, ScrapedAt: t0})
			eps[i].Dispatch(1)
			m := *eps[i].Metrics()
			m.Baseline = eps[i].Counters() // the scrape already counts the dispatch
			eps[i].SetMetrics(&m)
			eps[i].SetThroughput(1 / v) // token loads 1/(1/v): the same spread
		}
		for name, s := range normalizedScorers(t) {
			t.Run(pool+"/"+name, func(t *testing.T) {
				var in scorer.Input
				in.Reset(&signals.Request{Model: "m", PromptTokens: 100}, append([]*signals.Endpoint(nil), eps...), t0)
				in.Cached = make([]float64, len(eps))
				in.Raw = make([]float64, len(eps))
				out := make([]float64, len(eps))
				s.Score(context.Background(), &in, out)
				for i := range out {
					assert.True(t, out[i] >= 0 && out[i] <= 1, "score %d = %v (raw %v)", i, out[i], in.Raw)
				}
			})
		}
	}
}
