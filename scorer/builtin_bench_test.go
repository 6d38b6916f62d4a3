package scorer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// BenchmarkBuiltins measures each built-in filter and scorer of the default
// chain over 512 candidates whose loads a previous stage already read, as
// in a pick: ns/op divided by 512 is its cost per candidate. The "loads"
// case is the first reading of every candidate's load.
func BenchmarkBuiltins(b *testing.B) {
	const n = 512
	t0 := time.Unix(1_700_000_000, 0)
	eps := make([]*signals.Endpoint, n)
	for i := range eps {
		eps[i] = signalstest.Endpoint(fmt.Sprintf("pod-%d", i), signalstest.Load{
			Running: float64(i % 17), Waiting: float64(i % 5), KV: float64(i%10) / 10, ScrapedAt: t0,
		})
		eps[i].SetThroughput(float64(5000 + i))
		eps[i].Dispatch(100)
		eps[i].StartPrefill(100)
		eps[i].NoteDispatch(t0)
	}
	req := &signals.Request{Model: "m", PromptTokens: 2000}
	now := t0.Add(150 * time.Millisecond)
	hl := 2 * time.Second
	cached := make([]float64, n)
	for i := range cached {
		cached[i] = float64(i%7) / 8
	}
	raw, out := make([]float64, n), make([]float64, n)
	cands := make([]*signals.Endpoint, n)
	var in scorer.Input
	reset := func() {
		copy(cands, eps)
		in.Reset(req, cands, now)
		in.Cached, in.Raw = cached, raw
	}
	prefix, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), scorer.Env{HalfLife: hl})
	if err != nil {
		b.Fatal(err)
	}
	prefill, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
	if err != nil {
		b.Fatal(err)
	}
	sat := scorer.DefaultSaturationFilter()
	sat.HalfLife = hl
	ctx := context.Background()
	b.Run("loads", func(b *testing.B) {
		for b.Loop() {
			reset()
			in.Loads(hl)
		}
	})
	for _, c := range []struct {
		name string
		s    scorer.Scorer
	}{
		{"queue", &scorer.QueueScorer{HalfLife: hl}},
		{"kv-cache", &scorer.KVCacheScorer{HalfLife: hl}},
		{"prefix", prefix},
		{"lora", scorer.LoRAScorer{}},
		{"prefill", prefill},
		{"burst", scorer.BurstScorer{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			reset()
			in.Loads(hl)
			for b.Loop() {
				c.s.Score(ctx, &in, out)
			}
		})
	}
	for _, c := range []struct {
		name string
		f    scorer.Filter
	}{
		{"model", scorer.ModelFilter{}},
		{"healthy", scorer.HealthyFilter{}},
		{"saturation", &sat},
	} {
		b.Run(c.name, func(b *testing.B) {
			reset()
			in.Loads(hl)
			for b.Loop() {
				c.f.Filter(ctx, &in)
			}
		})
	}
}
