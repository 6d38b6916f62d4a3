package scorer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// BenchmarkPrefixScorer measures one Score call over 8, 64 and 1024
// candidates, in the hit case (some candidates hold the prefix) and the miss
// case (spread by load).
func BenchmarkPrefixScorer(b *testing.B) {
	s, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), scorer.Env{})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{8, 64, 1024} {
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		loads := make([]int, n)
		hit := make([]float64, n)
		for i := range loads {
			loads[i] = rng.IntN(10)
			if i%7 == 0 {
				hit[i] = 0.5 + rng.Float64()/2
			}
		}
		eps := pxEndpoints(loads...)
		for _, c := range []struct {
			name   string
			cached []float64
		}{{"hit", hit}, {"miss", make([]float64, n)}} {
			in := &scorer.Input{Endpoints: eps, Now: pxT0, Cached: c.cached, Raw: make([]float64, n)}
			out := make([]float64, n)
			b.Run(fmt.Sprintf("eps=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					s.Score(context.Background(), in, out)
				}
			})
		}
	}
}

// BenchmarkPrefixPick measures a whole pick through the real picker with the
// prefix index and scorer plus the queue scorer, over 8 and 64 pods that
// hold a shared 8 KB system prompt, for a 9 KB chat prompt (hashing the body
// included), with Done called at once.
func BenchmarkPrefixPick(b *testing.B) {
	for _, pods := range []int{8, 64} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			reg := &scorer.Registry{}
			if err := reg.RegisterScorer("prefix-affinity", scorer.NewPrefixScorerFromParams); err != nil {
				b.Fatal(err)
			}
			if err := reg.RegisterScorer("queue-depth", func(_ scorer.Params, env scorer.Env) (scorer.Scorer, error) {
				return &scorer.QueueScorer{HalfLife: env.HalfLife}, nil
			}); err != nil {
				b.Fatal(err)
			}
			ix, err := prefix.NewIndex(prefix.IndexConfig{})
			if err != nil {
				b.Fatal(err)
			}
			cfg := picker.Config{Scorers: []picker.Plugin{{Name: "prefix-affinity", Weight: 3}, {Name: "queue-depth", Weight: 2}}}
			p, err := picker.New(cfg, picker.WithRegistry(reg), picker.WithPrefixMatcher(ix),
				picker.WithClock(pxClock{pxT0}), picker.WithSeed(1))
			if err != nil {
				b.Fatal(err)
			}
			eps := make([]*signals.Endpoint, pods)
			for i := range eps {
				eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("pod-%d", i)})
			}
			p.SetEndpoints(eps)
			h := prefix.NewHasher(prefix.HashConfig{})
			rng := rand.New(rand.NewPCG(2, 3))
			system := pxWords(rng, 8192)
			bodies := make([][]byte, 64)
			for i := range bodies {
				bodies[i] = pxChat(system, fmt.Sprintf("question %d: %s", i, pxWords(rng, 1000)))
			}
			for i, ep := range eps { // warm: every pod holds the system prompt
				blocks, _, _ := h.HashBody(nil, "llama", "", bodies[i%len(bodies)])
				ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
			}
			req := &signals.Request{Model: "llama"}
			var blocks []uint64
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				var n int
				blocks, n, err = h.HashBody(blocks[:0], "llama", "", bodies[i%len(bodies)])
				if err != nil {
					b.Fatal(err)
				}
				req.PromptBlocks, req.PromptTokens = blocks, n/prefix.BytesPerToken
				res, err := p.Pick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				res.Done(picker.DoneInfo{})
				i++
			}
		})
	}
}
