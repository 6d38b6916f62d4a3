package prefix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// modelEndpoint is the reference model's account of one endpoint's part of
// an index: whether the index has state for it, the generation its entries
// were recorded at, its capacity in entries and its entries in recency
// order, with their confirmations and in-flight counts.
type modelEndpoint struct {
	known bool
	gen   uint64
	lru   *touchRef
}

// modelIndex is a brute-force reference for an Index: the rules of its doc
// comments, applied with maps and lists, independently of its tables.
type modelIndex struct {
	stride, defaultCap, tokensPerBlock int
	eps                                map[*signals.Endpoint]*modelEndpoint
}

// capacity is the documented capacity in entries: the scraped KV blocks
// (else the default) over the stride, rounded up, at least 1.
func (m *modelIndex) capacity(ep *signals.Endpoint) int {
	blocks := m.defaultCap
	if t := ep.Metrics().CapacityTokens(); t > 0 {
		blocks = t / m.tokensPerBlock
	}
	return max((blocks+m.stride-1)/m.stride, 1)
}

// state is what a dispatch (or Retain of a restarted endpoint) makes of
// ep's state: created, emptied for a new generation, resized.
func (m *modelIndex) state(ep *signals.Endpoint) *modelEndpoint {
	e := m.eps[ep]
	if e == nil || !e.known {
		e = &modelEndpoint{known: true, gen: ep.Generation(), lru: &touchRef{lru: newRefLRU(), cap: m.capacity(ep)}}
		m.eps[ep] = e
		return e
	}
	if e.gen != ep.Generation() {
		e.gen = ep.Generation()
		e.lru.lru = newRefLRU()
	}
	c := m.capacity(ep)
	for e.lru.lru.order.Len() > c {
		old := e.lru.lru.order.Back()
		e.lru.lru.order.Remove(old)
		delete(e.lru.lru.byH, old.Value.(*refEntry).h)
	}
	e.lru.cap = c
	return e
}

func (m *modelIndex) dispatched(ep *signals.Endpoint, blocks []uint64) {
	m.state(ep).lru.dispatched(blocks, m.stride)
}

func (m *modelIndex) completed(ep *signals.Endpoint, blocks []uint64, gen uint64, ok bool) {
	e := m.eps[ep]
	if e == nil || !e.known || e.gen != ep.Generation() || gen != e.gen {
		return
	}
	e.lru.completed(blocks, m.stride, ok)
}

func (m *modelIndex) retain(keep []*signals.Endpoint) {
	kept := map[*signals.Endpoint]bool{}
	for _, ep := range keep {
		kept[ep] = true
	}
	for ep, e := range m.eps {
		switch {
		case !e.known:
		case !kept[ep]:
			e.known = false
		case e.gen != ep.Generation():
			m.state(ep)
		}
	}
}

// held returns the hashes ep holds as far as a match is concerned: none
// when the index has no state for it or its generation moved on.
func (m *modelIndex) held(ep *signals.Endpoint) map[uint64]bool {
	e := m.eps[ep]
	if e == nil || !e.known || e.gen != ep.Generation() {
		return nil
	}
	out := map[uint64]bool{}
	for h := range e.lru.lru.byH {
		out[h] = true
	}
	return out
}

// prefixOnly reports whether the indexed positions of query that held
// contains form a leading run: bisection over the positions (Lookup) then
// finds what walking them finds.
func prefixOnly(held map[uint64]bool, query []uint64, stride int) bool {
	gap := false
	for p := stride - 1; ; p += stride {
		p = min(p, len(query)-1)
		switch {
		case !held[query[p]]:
			gap = true
		case gap:
			return false
		}
		if p == len(query)-1 {
			return true
		}
	}
}

// check compares ix with the model: every endpoint's entries (recency
// order, confirmations, in-flight counts), Entries, the Stats counts
// (stale entries stay counted until the endpoint's next dispatch or
// Retain), and Match, Lookup+Fill and Fraction over cands for query. The
// fractions are checked against walking the model's entries when they hold
// a leading run of the query's positions; the documented approximations of
// the in-flight counts can leave holes, where Lookup's bisection may find
// any of the runs, so there only Match, Fill and Fraction must agree.
func (m *modelIndex) check(t *testing.T, ix *Index, pool, cands []*signals.Endpoint, query []uint64, mt *Matches, step int) {
	t.Helper()
	entries, endpoints := 0, 0
	blocks := map[uint64]bool{}
	for _, ep := range pool {
		e := m.eps[ep]
		st := ix.eps[ep]
		if e == nil || !e.known {
			require.Nil(t, st, "step %d: %s forgotten", step, ep.Name)
			require.Zero(t, ix.Entries(ep), "step %d: %s", step, ep.Name)
			continue
		}
		require.NotNil(t, st, "step %d: %s known", step, ep.Name)
		var want, got []refEntry
		for x := e.lru.lru.order.Front(); x != nil; x = x.Next() {
			want = append(want, *x.Value.(*refEntry))
			blocks[x.Value.(*refEntry).h] = true
		}
		st.lru.Each(func(h uint64) {
			i := st.lru.Find(h)
			got = append(got, refEntry{h: h, confirmed: st.lru.Confirmed(i), pending: st.lru.Pending(i)})
		})
		require.Equal(t, want, got, "step %d: %s's entries", step, ep.Name)
		endpoints++
		entries += len(want)
		if e.gen == ep.Generation() {
			require.Equal(t, len(want), ix.Entries(ep), "step %d: Entries(%s)", step, ep.Name)
		} else {
			require.Zero(t, ix.Entries(ep), "step %d: Entries(%s) of a stale endpoint", step, ep.Name)
		}
	}
	s := ix.Stats()
	require.Equal(t, endpoints, s.Endpoints, "step %d: Stats.Endpoints", step)
	require.Equal(t, entries, s.Entries, "step %d: Stats.Entries", step)
	require.Equal(t, len(blocks), s.Blocks, "step %d: Stats.Blocks", step)

	got := match(ix, query, cands)
	ix.Lookup(&signals.Request{PromptBlocks: query}, mt)
	filled := make([]float64, len(cands))
	mt.Fill(cands, filled)
	require.Equal(t, got, filled, "step %d: Match and Lookup+Fill", step)
	for i, c := range cands {
		require.Equal(t, got[i], mt.Fraction(c), "step %d: Fraction %d", step, i)
		held := m.held(c)
		if prefixOnly(held, query, m.stride) {
			require.InDelta(t, refFraction(held, query, m.stride), got[i], 1e-12, "step %d: Match of %s", step, c.Name)
		}
	}
}

// TestIndexAgainstModel drives indexes through random sequences of every
// operation that changes them (dispatches, completions that succeed, fail
// or come from an earlier generation, restarts, outages, capacity changes
// up and down, Forget, Retain) and after each compares matches, entry
// counts and stats with modelIndex, and the index's internal consistency.
func TestIndexAgainstModel(t *testing.T) {
	tests := []struct{ stride, capacity, eps int }{
		{1, 40, 3}, {4, 64, 5}, {7, 3, 4}, {1, 2, 3}, {5, 20, 65}, {3, 30, 70}, {2, 24, 300}, {1, 1 << 20, 6}, {4, 1 << 20, 130},
	}
	for _, tc := range tests {
		for seed := uint64(0); seed < 3; seed++ {
			t.Run(fmt.Sprintf("stride=%d/cap=%d/eps=%d/seed=%d", tc.stride, tc.capacity, tc.eps, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(tc.stride)*7+seed, uint64(tc.eps)))
				ix := newIndex(t, IndexConfig{Stride: tc.stride, DefaultCapacity: tc.capacity})
				model := &modelIndex{stride: tc.stride, defaultCap: tc.capacity, tokensPerBlock: DefaultTokenBlock,
					eps: map[*signals.Endpoint]*modelEndpoint{}}
				pool := newEndpoints(tc.eps)
				// Requests go to a few endpoints of the pool, so that they
				// share blocks; the rest keep the bitsets wide.
				active := pool[:min(len(pool), 6)]
				for _, ep := range pool[len(active):] {
					ix.Dispatched(&signals.Request{PromptBlocks: chain(nil, 2, 5)}, ep)
					model.dispatched(ep, chain(nil, 2, 5))
				}
				systems := [][]uint64{chain(nil, 30, 1), chain(nil, 12, 2)}
				var convs [][]uint64
				type inflight struct {
					ep     *signals.Endpoint
					blocks []uint64
					gen    uint64
				}
				var open []inflight
				var mt Matches
				for step := 0; step < 800; step++ {
					ep := active[rng.IntN(len(active))]
					switch op := rng.IntN(40); {
					case op < 16 || len(convs) == 0:
						var blocks []uint64
						switch k := rng.IntN(len(convs) + 2); {
						case k < len(convs) && rng.IntN(3) == 0:
							blocks = convs[k]
						case k < len(convs) && len(convs[k]) < 60:
							convs[k] = chain(convs[k], 1+rng.IntN(10), uint64(step)+100)
							blocks = convs[k]
						case k < len(convs):
							blocks = convs[k]
						default:
							sys := systems[rng.IntN(len(systems))]
							blocks = chain(sys[:1+rng.IntN(len(sys))], rng.IntN(16), uint64(step)+100)
							convs = append(convs, blocks)
						}
						ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
						model.dispatched(ep, blocks)
						open = append(open, inflight{ep, blocks, ep.Generation()})
					case op < 30:
						if len(open) == 0 {
							continue
						}
						k := rng.IntN(len(open))
						f := open[k]
						open[k] = open[len(open)-1]
						open = open[:len(open)-1]
						out := signals.Outcome{Generation: f.gen}
						ok := rng.IntN(4) != 0
						if !ok {
							out.Err = fmt.Errorf("refused")
						}
						ix.Completed(&signals.Request{PromptBlocks: f.blocks}, f.ep, out)
						model.completed(f.ep, f.blocks, f.gen, ok)
					case op < 32:
						ep.MarkRestarted()
					case op < 34:
						ep.MarkDown()
						ep.ReportSuccess(ep.HealthMark())
					case op < 36:
						// A new scraped KV size, in tokens: smaller or
						// larger than the default, or unknown again.
						if rng.IntN(3) == 0 {
							ep.SetMetrics(nil)
						} else {
							ep.SetMetrics(&signals.Metrics{BlockSize: 16, NumBlocks: 1 + rng.IntN(2*tc.capacity)})
						}
					case op < 37:
						ix.Forget(ep)
						if e := model.eps[ep]; e != nil {
							e.known = false
						}
					case op < 39:
						keep := make([]*signals.Endpoint, 0, len(pool))
						for _, e := range pool {
							if e != ep || rng.IntN(2) == 0 {
								keep = append(keep, e)
							}
						}
						ix.Retain(keep)
						model.retain(keep)
					default:
						ix.Retain(pool)
						model.retain(pool)
					}
					cands := make([]*signals.Endpoint, 0, len(active)+1)
					for _, i := range rng.Perm(len(active))[:1+rng.IntN(len(active))] {
						cands = append(cands, active[i])
					}
					var query []uint64
					if len(convs) > 0 {
						c := convs[rng.IntN(len(convs))]
						query = c[:1+rng.IntN(len(c))]
					} else {
						query = systems[0]
					}
					model.check(t, ix, pool, cands, query, &mt, step)
					if step%8 == 0 {
						checkIndexConsistent(t, ix)
					}
				}
			})
		}
	}
}

// TestIndexMemoryReturnsWhenEmptied: once every endpoint has left, the
// index holds no entries and no blocks, so its memory must come back to
// the bookkeeping of the endpoint slots it has handed out, whatever holder
// sets (inline, lists, bitsets) its shared blocks used meanwhile: checked
// against Stats and against the Go heap.
func TestIndexMemoryReturnsWhenEmptied(t *testing.T) {
	eps := newEndpoints(300) // over 256 slots: lists and bitsets of 8 words
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ix := newIndex(t, IndexConfig{Stride: 1, DefaultCapacity: 1 << 20})
	for k := 0; k < 60; k++ {
		p := chain(nil, 200, uint64(k)+1)
		holders := 6 // a list
		if k%2 == 0 {
			holders = 12 // a bitset
		}
		for j := range holders {
			ix.Dispatched(&signals.Request{PromptBlocks: p}, eps[(k*7+j*23)%len(eps)])
		}
	}
	require.Greater(t, ix.Stats().Bytes, int64(300_000))
	ix.Forget(eps...)
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	s := ix.Stats()
	runtime.KeepAlive(ix)
	require.Zero(t, s.Entries)
	require.Zero(t, s.Blocks)
	// What is left: per slot its bookkeeping (the slot's pointer, its
	// stamp, its free-list entry), and the index's fixed parts (shard
	// headers, live bitset, maps): far below 64 KB.
	const left = 64 << 10
	require.Less(t, heap, int64(left), "heap held by an emptied index")
	require.Less(t, s.Bytes-int64(len(eps))*endpointBytes, int64(left), "Stats.Bytes of an emptied index: %d", s.Bytes)
}
