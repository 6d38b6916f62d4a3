package sim

import (
	"context"
	"testing"

	"github.com/inferroute/inferroute/benchmarks/policy"
)

// BenchmarkSim measures the simulator's speed in simulated requests per
// wall-clock second: 8 H100 pods, 4,000 ShareGPT-like Poisson requests at
// 70% of the fleet's measured capacity, for each baseline policy. The target
// is ≥ 50,000 req/s on one core (run with -cpu 1). It also reports requests
// per second of the process's CPU time (req/cpu-s), which stays meaningful
// on a machine shared with other jobs.
func BenchmarkSim(b *testing.B) {
	const n = 4000
	pods := fleet(b, 8)
	w := poissonWorkload(b, n, 10)
	c, err := MeasureCapacity(pods, w)
	if err != nil {
		b.Fatal(err)
	}
	w = w.Scale(0.7 * c.Rate)
	cfg := DefaultConfig(pods)
	for _, name := range policy.Baselines() {
		b.Run(name, func(b *testing.B) {
			f, _ := policy.Default().Lookup(name)
			s := New()
			b.ReportAllocs()
			cpu0, cpuOK := cpuTime()
			for b.Loop() {
				m, err := s.Run(context.Background(), cfg, w, f)
				if err != nil {
					b.Fatal(err)
				}
				if m.Completed != n {
					b.Fatalf("completed %d of %d", m.Completed, n)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "req/s")
			if cpu1, ok := cpuTime(); ok && cpuOK && cpu1 > cpu0 {
				b.ReportMetric(float64(n)*float64(b.N)/(cpu1-cpu0).Seconds(), "req/cpu-s")
			}
		})
	}
}

// BenchmarkPromptHash measures materialising and hashing the synthetic text
// of a 2,000-token prompt of 16-token blocks (8 KB).
func BenchmarkPromptHash(b *testing.B) {
	p := newPromptText()
	blocks := make([]uint64, 125)
	for i := range blocks {
		blocks[i] = uint64(i) * 7919
	}
	var dst []uint64
	b.SetBytes(2000 * BytesPerToken)
	b.ReportAllocs()
	for b.Loop() {
		dst = p.hash(dst[:0], DefaultModel, "", blocks, 16, 2000)
	}
}
