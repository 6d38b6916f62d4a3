package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

// benchWorkload returns n requests shaped like chat traffic: prompts of
// 200-2000 tokens in 64-token content blocks whose first 8 blocks are one
// of 8 shared system prompts, outputs of 50-450 tokens, a quarter of them
// on one of 4 LoRA adapters.
func benchWorkload(n int) []*Request {
	rng := rand.New(rand.NewPCG(11, 12))
	rs := make([]*Request, n)
	for i := range rs {
		prompt := 200 + rng.IntN(1800)
		bl := make([]uint64, (prompt+63)/64)
		sys := uint64(rng.IntN(8))
		for j := range bl {
			if j < 8 {
				bl[j] = sys<<8 | uint64(j)
			} else {
				bl[j] = uint64(i)<<20 | uint64(j)
			}
		}
		adapter := ""
		if rng.IntN(4) == 0 {
			adapter = []string{"a", "b", "c", "d"}[rng.IntN(4)]
		}
		rs[i] = &Request{ID: uint64(i), Blocks: bl, BlockTokens: 64, PromptTokens: prompt, OutputTokens: 50 + rng.IntN(400), Adapter: adapter}
	}
	return rs
}

// BenchmarkEngine measures requests per wall-clock second through one
// engine kept at 64 requests in flight (a closed loop): one b.N iteration
// is one finished request.
func BenchmarkEngine(b *testing.B) {
	for _, name := range []string{"h100-llama3-8b", "l4-llama3-8b"} {
		b.Run(name, func(b *testing.B) {
			p, _ := ProfileByName(name)
			cfg := DefaultConfig(p)
			cfg.MaxLoRAs = 4
			e := New(cfg)
			rs := benchWorkload(4096)
			var out []Event
			now := time.Duration(0)
			inFlight, next, done := 0, 0, 0
			b.ReportAllocs()
			b.ResetTimer()
			for done < b.N {
				for inFlight < 64 {
					if err := e.Add(now, rs[next%len(rs)]); err != nil {
						b.Fatal(err)
					}
					next++
					inFlight++
				}
				d, ok := e.StartStep(now)
				if !ok {
					b.Fatal("engine idle with requests in flight")
				}
				now += d
				out = e.FinishStep(now, out[:0])
				for i := range out {
					if out[i].Kind == Finished {
						done++
						inFlight--
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64(e.Stats().Steps)/float64(b.N), "steps/req")
		})
	}
}

// BenchmarkStepTime measures the step-time formula alone.
func BenchmarkStepTime(b *testing.B) {
	p, _ := ProfileByName("a100-llama3-8b")
	b.ReportAllocs()
	var sink time.Duration
	for i := 0; b.Loop(); i++ {
		sink += p.StepTime(64+i&1023, 1e6, 64*1500, 64)
	}
	_ = sink
}
