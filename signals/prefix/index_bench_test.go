package prefix

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// benchIndex is an index with perEP blocks recorded on each of n endpoints:
// every endpoint holds one long shared chain (the first maxBlocks blocks of
// a 512 KB prompt, as a pool-wide system prompt or document would be) and
// fills the rest with conversations of 1000 blocks that share a 128-block
// system prompt, one distinct set per endpoint.
type benchIndex struct {
	ix     *Index
	eps    []*signals.Endpoint
	shared []uint64 // held by every endpoint
	own    []uint64 // held by endpoint 0 only
}

// benchEndpointCounts are the pool sizes of BenchmarkMatch.
var benchEndpointCounts = []int{64, 1024}

const (
	benchBlocksPerEP = 100_000
	benchLongBlocks  = 8192 // 512 KB of text in 64-byte blocks
)

func buildBenchIndex(b *testing.B, n int) *benchIndex {
	b.Helper()
	ix, err := NewIndex(IndexConfig{DefaultCapacity: benchBlocksPerEP})
	if err != nil {
		b.Fatal(err)
	}
	bi := &benchIndex{ix: ix, eps: newEndpoints(n), shared: chain(nil, benchLongBlocks, 1)}
	system := chain(nil, 128, 2)
	for e, ep := range bi.eps {
		ix.Dispatched(&signals.Request{PromptBlocks: bi.shared}, ep)
		for k := 0; benchLongBlocks+(k+1)*872 <= benchBlocksPerEP; k++ {
			conv := chain(system, 872, uint64(e)<<20|uint64(k)+3)
			if e == 0 && k == 0 {
				bi.own = conv
			}
			ix.Dispatched(&signals.Request{PromptBlocks: conv}, ep)
		}
	}
	return bi
}

// benchCell is one prompt of BenchmarkMatch and BenchmarkLookup.
type benchCell struct {
	name string // e.g. "32KB/one"
	kb   int    // prompt size
	req  *signals.Request
}

// benchCells returns the prompts of the Match and Lookup benchmarks for
// bi: 1 KB, 32 KB and 512 KB (16, 512 and 8192 blocks of 64 bytes). "all"
// is the worst case: every endpoint holds the whole prompt, so the holder
// bitsets are intersected along all of it. "one" is a conversation held by
// one endpoint behind a system prompt that every endpoint holds; "miss" is
// a prompt nobody holds.
func benchCells(bi *benchIndex) []benchCell {
	miss := chain(nil, benchLongBlocks, 99)
	var cells []benchCell
	for _, kb := range []int{1, 32, 512} {
		blocks := kb * 1024 / DefaultBlockBytes
		for _, c := range []struct {
			name   string
			blocks []uint64
		}{
			{"all", bi.shared[:blocks]},
			{"one", bi.own[:min(blocks, len(bi.own))]},
			{"miss", miss[:blocks]},
		} {
			cells = append(cells, benchCell{fmt.Sprintf("%dKB/%s", kb, c.name), kb, &signals.Request{PromptBlocks: c.blocks}})
		}
	}
	return cells
}

// BenchmarkMatch measures Match, the dense form the picker calls (Lookup
// then Fill over the whole pool), at 64 and 1024 endpoints, each holding
// 100K blocks, for the prompts of benchCells. x-hash is the match time
// over the time HashText takes for a prompt of the same size, measured in
// the same run (issue 4's target: at most 2).
func BenchmarkMatch(b *testing.B) {
	for _, n := range benchEndpointCounts {
		// The index is built inside the sub-benchmark so that -bench
		// filters skip building the pools they do not run.
		b.Run(fmt.Sprintf("eps=%d", n), func(b *testing.B) {
			bi := buildBenchIndex(b, n)
			s := bi.ix.Stats()
			b.Logf("%d endpoints: %d entries, %d distinct blocks, %.0f MB estimated", n, s.Entries, s.Blocks, float64(s.Bytes)/1e6)
			out := make([]float64, n)
			for _, c := range benchCells(bi) {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						bi.ix.Match(c.req, bi.eps, out)
					}
					b.ReportMetric(matchOverHash(c.kb<<10, func() { bi.ix.Match(c.req, bi.eps, out) }), "x-hash")
				})
			}
		})
	}
}

// BenchmarkLookup measures Lookup, the sparse search whose cost does not
// depend on the number of endpoints, over the cells of BenchmarkMatch,
// with the same x-hash ratio; and Fill, reading a Lookup's result out for
// the whole pool, in the cells where every endpoint matches ("all").
func BenchmarkLookup(b *testing.B) {
	for _, n := range benchEndpointCounts {
		b.Run(fmt.Sprintf("eps=%d", n), func(b *testing.B) {
			bi := buildBenchIndex(b, n)
			var m Matches
			for _, c := range benchCells(bi) {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						bi.ix.Lookup(c.req, &m)
					}
					b.ReportMetric(matchOverHash(c.kb<<10, func() { bi.ix.Lookup(c.req, &m) }), "x-hash")
				})
			}
			out := make([]float64, n)
			for _, c := range benchCells(bi) {
				if !strings.HasSuffix(c.name, "/all") && !strings.HasSuffix(c.name, "/one") {
					continue
				}
				b.Run("fill/"+c.name, func(b *testing.B) {
					bi.ix.Lookup(c.req, &m)
					b.ReportAllocs()
					for b.Loop() {
						m.Fill(bi.eps, out)
					}
				})
			}
		})
	}
}

// matchOverHash returns the time match takes over the time HashText takes
// for a prompt of n bytes, the target ratio. It alternates batches
// of each and returns the median of the rounds' ratios, so that both sides
// of a ratio see the same load and a round disturbed by other work on a
// shared machine does not move the result.
func matchOverHash(n int, match func()) float64 {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	txt := text(n, 1)
	dst := make([]uint64, 0, n/DefaultBlockBytes+1)
	batch := max(1, (64<<10)/n)
	ratios := make([]float64, 101)
	for r := range ratios {
		start := time.Now()
		for range batch {
			dst = h.HashText(dst[:0], "meta-llama/Llama-3.1-8B-Instruct", "", txt)
		}
		mid := time.Now()
		for range batch {
			match()
		}
		ratios[r] = float64(time.Since(mid)) / float64(mid.Sub(start))
	}
	slices.Sort(ratios)
	return ratios[len(ratios)/2]
}

// BenchmarkMatchParallel measures Match from every CPU at once against 64
// endpoints (read-lock scalability).
func BenchmarkMatchParallel(b *testing.B) {
	bi := buildBenchIndex(b, 64)
	req := &signals.Request{PromptBlocks: bi.shared[:512]}
	b.ReportAllocs()
	b.ResetTimer() // RunParallel does not leave the index build out
	b.RunParallel(func(pb *testing.PB) {
		out := make([]float64, len(bi.eps))
		for pb.Next() {
			bi.ix.Match(req, bi.eps, out)
		}
	})
}

// BenchmarkDispatched measures recording a 32 KB prompt (512 blocks) whose
// first 128 blocks the endpoint already holds.
func BenchmarkDispatched(b *testing.B) {
	ix, err := NewIndex(IndexConfig{})
	if err != nil {
		b.Fatal(err)
	}
	eps := newEndpoints(8)
	system := chain(nil, 128, 1)
	reqs := make([]*signals.Request, 256)
	for i := range reqs {
		reqs[i] = &signals.Request{PromptBlocks: chain(system, 384, uint64(i)+2)}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ix.Dispatched(reqs[i%len(reqs)], eps[i%len(eps)])
		i++
	}
}

// BenchmarkIndexMemory measures the Go heap held by an index of one million
// indexed blocks spread over 64 endpoints (distinct conversations of 1000
// blocks behind a shared 128-block system prompt), and reports it per
// (block, endpoint) entry and per prompt block covered, next to the index's
// own estimate. With the default stride every fourth block is an entry. The
// last case spreads the same over 1024 endpoints with every conversation on
// 4 of them, the case where holder sets outgrow their inline form and
// bitsets are widest.
func BenchmarkIndexMemory(b *testing.B) {
	cases := []struct {
		name                string
		stride, eps, copies int
	}{
		{"stride=1", 1, 64, 1},
		{"stride=4", DefaultStride, 64, 1},
		{"stride=4/eps=1024/copies=4", DefaultStride, 1024, 4},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var heap, entries, covered, estimate float64
			for b.Loop() {
				eps := newEndpoints(c.eps) // not part of the index
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				ix, err := NewIndex(IndexConfig{Stride: c.stride, DefaultCapacity: 1 << 20})
				if err != nil {
					b.Fatal(err)
				}
				system := chain(nil, 128, 1)
				total, sent := 0, 0 // distinct (block, endpoint) pairs covered; dispatches
				for k := 0; total < 1_000_000; k++ {
					conv := chain(system, 872, uint64(k)+2)
					for range c.copies {
						ix.Dispatched(&signals.Request{PromptBlocks: conv}, eps[sent%len(eps)])
						total += 872
						if sent < len(eps) {
							total += len(system) // once per endpoint
						}
						sent++
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				s := ix.Stats()
				heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
				entries, covered, estimate = float64(s.Entries), float64(total), float64(s.Bytes)
				runtime.KeepAlive(ix)
			}
			b.ReportMetric(heap/entries, "B/entry")
			b.ReportMetric(heap/covered, "B/block")
			b.ReportMetric(estimate/entries, "est-B/entry")
			b.ReportMetric(heap/1e6, "MB-heap")
		})
	}
}

// BenchmarkDispatchedCompleted measures the index's bookkeeping for one
// request whose prompt the endpoint already holds, as the gateway of
// benchmarks/overhead does per request: Dispatched, then a successful
// Completed, for a 1 KB (16-block) and a 220 KB (3 437-block) prompt.
func BenchmarkDispatchedCompleted(b *testing.B) {
	for _, n := range []int{16, 3437} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			ix, err := NewIndex(IndexConfig{})
			if err != nil {
				b.Fatal(err)
			}
			ep := newEndpoints(1)[0]
			req := &signals.Request{PromptBlocks: chain(nil, n, 1)}
			ix.Dispatched(req, ep)
			ix.Completed(req, ep, signals.Outcome{})
			b.ReportAllocs()
			for b.Loop() {
				ix.Dispatched(req, ep)
				ix.Completed(req, ep, signals.Outcome{})
			}
		})
	}
}
