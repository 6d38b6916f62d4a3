package picker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
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

// benchPicker returns a picker with the default configuration over n
// endpoints, its prefix index warmed with 2n requests, and a 2000-token
// request (125 blocks of 16 tokens) whose first 64 blocks are held around
// the fleet: prompt hashes already computed, as the target says.
func benchPicker(b *testing.B, n int) (*Picker, *signals.Request) {
	clk := signalstest.NewClock(epoch.Add(20 * time.Millisecond))
	idx, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		b.Fatal(err)
	}
	pred := latency.New(latency.Config{Clock: clk, HalfLife: DefaultHalfLife})
	p, err := New(DefaultConfig(), WithClock(clk), WithPrefixMatcher(idx), WithLatencyEstimator(pred))
	if err != nil {
		b.Fatal(err)
	}
	p.SetEndpoints(benchEndpoints(n))
	h := prefix.NewHasher(prefix.HashConfig{})
	ctx := context.Background()
	text := make([]byte, 8000)
	for i := range text {
		text[i] = byte('a' + i*7%26)
	}
	warm := &signals.Request{Model: "m", PromptTokens: 1024}
	warm.PromptBlocks = h.HashText(nil, "m", "", text[:4096])
	for i := 0; i < 2*n; i++ {
		res, err := p.Pick(ctx, warm)
		if err != nil {
			b.Fatal(err)
		}
		res.Done(DoneInfo{TTFT: 80 * time.Millisecond, Latency: time.Second, PromptTokens: 1024})
	}
	req := &signals.Request{Model: "m", PromptTokens: 2000}
	req.PromptBlocks = h.HashText(nil, "m", "", text)
	return p, req
}

// BenchmarkPick measures Pick alone with the default configuration, prompt
// hashes already computed: the routing decision a request waits for,
// including the dispatch bookkeeping and the observers' Dispatched. The
// Done of each pick, which runs after the response, is called outside the
// timer in batches of 64 (BenchmarkPickDone measures both together). With
// 64 picks awaiting their Done, as in a busy gateway, each pick's record
// (its breakdown rows: 48 KB at 512 candidates) was last touched 64 picks
// ago and is cold, which BenchmarkPickDone's single record never is.
// Targets: ≤ 2 µs at 8 endpoints, ≤ 25 µs at 512, ≤ 1 allocation per pick.
func BenchmarkPick(b *testing.B) {
	const batch = 64
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			p, req := benchPicker(b, n)
			ctx := context.Background()
			pending := make([]func(DoneInfo), 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := p.Pick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				pending = append(pending, res.Done)
				if len(pending) == batch || i == b.N-1 {
					b.StopTimer()
					for _, done := range pending {
						done(DoneInfo{TTFT: 100 * time.Millisecond})
					}
					pending = pending[:0]
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkPickDone measures one Pick plus its Done: the picker's whole
// cost per request, including the observers' Completed (the prefix index
// confirming the blocks, the latency model's update).
func BenchmarkPickDone(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			p, req := benchPicker(b, n)
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

// BenchmarkNew measures building a picker with the default configuration
// and its default prefix index and latency predictor: a router builds one
// per model, hundreds at a time.
func BenchmarkNew(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := New(DefaultConfig()); err != nil {
			b.Fatal(err)
		}
	}
}
