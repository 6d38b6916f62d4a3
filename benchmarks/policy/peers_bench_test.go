package policy_test

import (
	"context"
	"testing"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

// BenchmarkPeerPick measures one pick and its Done for each peer on an
// 8-pod fleet with a 64-block prompt drawn from 16 shared prefixes.
func BenchmarkPeerPick(b *testing.B) {
	eps := endpoints(8)
	for _, ep := range eps {
		setScrape(ep, 2, 0.4)
	}
	reqs := make([]*signals.Request, 16)
	for i := range reqs {
		reqs[i] = &signals.Request{PromptTokens: 1024, PromptBlocks: blocks(uint64(i+1), 64)}
	}
	for _, name := range policy.Peers() {
		b.Run(name, func(b *testing.B) {
			p, err := policy.Default().New(name, policy.Env{Endpoints: eps, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ch, err := p.Pick(ctx, reqs[i%len(reqs)], eps)
				if err != nil {
					b.Fatal(err)
				}
				ch.Done(signals.Outcome{})
				i++
			}
		})
	}
}
