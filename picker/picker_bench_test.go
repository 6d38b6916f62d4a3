package picker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// benchEndpoints returns n endpoints with varied scraped load, as a fleet
// looks between scrapes.
func benchEndpoints(n int) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, n)
	for i := range eps {
		eps[i] = signalstest.Endpoint(fmt.Sprintf("pod-%d", i), signalstest.Load{
			Running: float64(i % 17), Waiting: float64(i % 5), KV: float64(i%10) / 10, ScrapedAt: epoch,
		})
	}
	return eps
}

// BenchmarkPick measures one Pick plus its Done with the default
// configuration, prompt hashes already computed. Targets: ≤ 2 µs at 8
// endpoints, ≤ 25 µs at 512, ≤ 1 allocation per pick.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			clk := signalstest.NewClock(epoch.Add(20 * time.Millisecond))
			p, err := New(benchConfig(), WithClock(clk))
			if err != nil {
				b.Fatal(err)
			}
			p.SetEndpoints(benchEndpoints(n))
			req := &signals.Request{Model: "m", PromptTokens: 2000, PromptBlocks: make([]uint64, 125)}
			for i := range req.PromptBlocks {
				req.PromptBlocks[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := p.Pick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				res.Done(DoneInfo{TTFT: 100 * time.Millisecond})
			}
		})
	}
}
