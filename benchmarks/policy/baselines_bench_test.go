package policy_test

import (
	"context"
	"testing"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

func BenchmarkPick(b *testing.B) {
	eps := endpoints(8)
	for _, name := range policy.Baselines() {
		b.Run(name, func(b *testing.B) {
			p, err := policy.Default().New(name, policy.Env{Endpoints: eps, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			req := &signals.Request{Model: "m", PromptTokens: 1000}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				ch, err := p.Pick(ctx, req, eps)
				if err != nil {
					b.Fatal(err)
				}
				ch.Done(signals.Outcome{})
			}
		})
	}
}
