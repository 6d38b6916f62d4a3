package signals_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// benchLoadEndpoints returns n scraped endpoints with work dispatched since
// their scrape, as a pool looks between scrapes.
func benchLoadEndpoints(n int) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, n)
	for i := range eps {
		ep := signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("pod-%d", i)})
		ep.SetMetrics(&signals.Metrics{
			ScrapedAt: t0, Baseline: ep.Counters(),
			Waiting: signals.Known(float64(i % 5)), Running: signals.Known(float64(i % 17)),
			KVCacheUtilization: signals.Known(float64(i%10) / 10), BlockSize: 16, NumBlocks: 8192,
		})
		ep.SetThroughput(float64(5000 + i))
		for j := 0; j < i%4; j++ {
			ep.Dispatch(512)
			ep.StartPrefill(512)
			ep.NoteDispatch(t0.Add(10 * time.Millisecond))
		}
		eps[i] = ep
	}
	return eps
}

// BenchmarkReadLoad reads the Load of every endpoint of a pool once, as the
// first filter of a pick does; ns/op is per pool, so divide by the size for
// the cost per candidate.
func BenchmarkReadLoad(b *testing.B) {
	for _, n := range []int{8, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			eps := benchLoadEndpoints(n)
			dst := make([]signals.Load, n)
			now := t0.Add(700 * time.Millisecond)
			b.ReportAllocs()
			for b.Loop() {
				for i, ep := range eps {
					ep.ReadLoad(&dst[i], now, 2*time.Second)
				}
			}
		})
		b.Run(fmt.Sprintf("at/endpoints=%d", n), func(b *testing.B) {
			eps := benchLoadEndpoints(n)
			dst := make([]signals.Load, n)
			at := signals.NewInstant(t0.Add(700*time.Millisecond), 2*time.Second)
			b.ReportAllocs()
			for b.Loop() {
				for i, ep := range eps {
					ep.ReadLoadAt(&dst[i], &at)
				}
			}
		})
	}
}
