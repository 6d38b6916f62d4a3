package prefix

import (
	"container/list"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refLRU is the reference model of lruTable: container/list in recency
// order (front: most recent) and a map from hash to element.
type refLRU struct {
	order *list.List // of *refEntry
	byH   map[uint64]*list.Element
}

type refEntry struct {
	h         uint64
	confirmed bool
	pending   int
}

// Pending returns the in-flight count of the entry in slot i, as counted
// by AddPending and DropPending (the index itself reads it only through
// DropPending).
func (t *lruTable) Pending(i int) int { return t.nodes[i].pending() }

func newRefLRU() *refLRU { return &refLRU{order: list.New(), byH: map[uint64]*list.Element{}} }

// check compares t with the reference: length, recency order, confirmed
// marks, and that every hash is found and an absent one is not.
func (r *refLRU) check(t *testing.T, tb *lruTable, absent uint64) {
	t.Helper()
	require.Equal(t, r.order.Len(), tb.Len())
	var want, got, found []refEntry
	for e := r.order.Front(); e != nil; e = e.Next() {
		en := *e.Value.(*refEntry)
		want = append(want, en)
		if i := tb.Find(en.h); i >= 0 {
			found = append(found, refEntry{h: tb.Hash(i), confirmed: tb.Confirmed(i), pending: tb.Pending(i)})
		}
	}
	require.Equal(t, want, found, "Find")
	tb.Each(func(h uint64) {
		i := tb.Find(h)
		got = append(got, refEntry{h: h, confirmed: tb.Confirmed(i), pending: tb.Pending(i)})
	})
	require.Equal(t, want, got, "Each")
	if r.order.Len() > 0 {
		require.Equal(t, r.order.Back().Value.(*refEntry).h, tb.Hash(tb.Oldest()))
	} else {
		require.Equal(t, -1, tb.Oldest())
	}
	require.Equal(t, -1, tb.Find(absent))
}

func TestLRUTableAgainstReference(t *testing.T) {
	tests := []struct {
		name  string
		keys  uint64 // key space: small spaces collide on homes and wrap
		limit int
		ops   int
	}{
		{"small keys, no limit", 40, 0, 3000},
		{"wide keys, limit", 1 << 62, 50, 3000},
		{"tiny table", 8, 6, 2000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			var tb lruTable
			ref := newRefLRU()
			absent := uint64(1) << 63 // outside every key space
			for op := 0; op < tc.ops; op++ {
				h := rng.Uint64N(tc.keys)
				e, present := ref.byH[h]
				switch k := rng.IntN(10); {
				case k < 5: // insert, or touch when present
					if present && rng.IntN(2) == 0 {
						// Behind another entry (itself: no change).
						mark := ref.byH[rng.Uint64N(tc.keys)]
						if mark == nil {
							mark = ref.order.Back()
						}
						ref.order.MoveAfter(e, mark)
						tb.TouchAfter(tb.Find(h), tb.Find(mark.Value.(*refEntry).h))
						break
					}
					if present {
						ref.order.MoveToFront(e)
						tb.Touch(tb.Find(h))
						break
					}
					if tc.limit > 0 && ref.order.Len() >= tc.limit {
						old := ref.order.Back()
						ref.order.Remove(old)
						delete(ref.byH, old.Value.(*refEntry).h)
						tb.Remove(tb.Oldest())
					}
					conf := rng.IntN(2) == 0
					pend := []int{0, 1, 2, 15, 16, 17, maxPending - 1, maxPending}[rng.IntN(8)] // nibble edges
					ref.byH[h] = ref.order.PushFront(&refEntry{h: h, confirmed: conf, pending: pend})
					tb.Insert(h, conf, pend, tc.limit)
				case k < 7: // remove
					if present {
						ref.order.Remove(e)
						delete(ref.byH, h)
						tb.Remove(tb.Find(h))
					}
				case k < 8: // confirm, or count a request in flight, or one fewer
					if !present {
						break
					}
					en := e.Value.(*refEntry)
					switch i := tb.Find(h); rng.IntN(3) {
					case 0:
						en.confirmed = true
						tb.Confirm(i)
					case 1:
						en.pending = min(en.pending+1, maxPending)
						tb.AddPending(i)
					default:
						if en.pending > 0 && en.pending < maxPending {
							en.pending--
						}
						require.Equal(t, en.pending, tb.DropPending(i))
					}
				case k < 9: // evict the oldest
					if old := ref.order.Back(); old != nil {
						ref.order.Remove(old)
						delete(ref.byH, old.Value.(*refEntry).h)
						tb.Remove(tb.Oldest())
					}
				default:
					tb.Shrink()
				}
				ref.check(t, &tb, absent)
				if tc.limit > 0 {
					require.LessOrEqual(t, len(tb.nodes), slotsFor(tc.limit), "growth overshoots the limit")
				}
			}
			tb.Reset()
			assert.Zero(t, tb.Len())
			assert.Zero(t, tb.Bytes())
			assert.Equal(t, -1, tb.Find(1))
		})
	}
}

// TestLRUTableLead checks Lead against the reference list: for prompts
// whose indexed positions lead the list in part, in whole or not at all,
// with every stride and length class, it must pass exactly the positions
// that match the list's front in order, count the request on each of
// those entries at every nibble edge of the in-flight count, confirm them
// when done, and leave every other entry and the order alone.
func TestLRUTableLead(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	for trial := 0; trial < 2000; trial++ {
		stride := 1 + rng.IntN(5)
		n := 1 + rng.IntN(40)
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = rng.Uint64() >> 1
		}
		var pos []int // indexed positions in prompt order
		for p := stride - 1; ; p += stride {
			p = min(p, n-1)
			pos = append(pos, p)
			if p == n-1 {
				break
			}
		}
		// The list: the first `match` positions in order at the front,
		// then (sometimes) a stranger, then the other positions and
		// unrelated entries.
		match := rng.IntN(len(pos) + 1)
		var tb lruTable
		ref := newRefLRU()
		var order []uint64
		for _, p := range pos[:match] {
			order = append(order, hs[p])
		}
		if match < len(pos) && rng.IntN(2) == 0 {
			order = append(order, 1<<63|rng.Uint64()) // breaks the lead
		}
		for _, p := range pos[match:] {
			if rng.IntN(2) == 0 {
				order = append(order, hs[p])
			}
		}
		for range rng.IntN(4) {
			order = append(order, 1<<63|rng.Uint64())
		}
		seen := map[uint64]bool{}
		for i := len(order) - 1; i >= 0; i-- { // inserted oldest first
			h := order[i]
			if seen[h] {
				continue
			}
			seen[h] = true
			conf := rng.IntN(2) == 0
			pend := []int{0, 1, 2, 14, 15, 16, 17, 31, maxPending - 1, maxPending}[rng.IntN(10)]
			ref.byH[h] = ref.order.PushFront(&refEntry{h: h, confirmed: conf, pending: pend})
			tb.Insert(h, conf, pend, 0)
		}
		done := rng.IntN(2) == 0
		// The reference: walk the reference list from its front.
		wantK, wantLast := 0, uint64(0)
		e := ref.order.Front()
		for _, p := range pos {
			if e == nil || e.Value.(*refEntry).h != hs[p] {
				break
			}
			en := e.Value.(*refEntry)
			if done {
				if en.pending > 0 && en.pending < maxPending {
					en.pending--
				}
				en.confirmed = true
			} else {
				en.pending = min(en.pending+1, maxPending)
			}
			wantK, wantLast = wantK+1, en.h
			e = e.Next()
		}
		k, last := tb.Lead(hs, stride, done)
		require.Equal(t, wantK, k, "trial %d: positions passed", trial)
		if wantK == 0 {
			require.Equal(t, -1, last, "trial %d", trial)
		} else {
			require.Equal(t, wantLast, tb.Hash(last), "trial %d: last entry", trial)
		}
		ref.check(t, &tb, 1<<62)
	}
	var empty lruTable
	k, last := empty.Lead([]uint64{1, 2, 3}, 1, false)
	assert.Equal(t, 0, k)
	assert.Equal(t, -1, last)
}

func TestLRUTableLoad(t *testing.T) {
	// Growing a quarter at a time keeps the load within [3/5, 3/4] once
	// past the first allocation.
	var tb lruTable
	for i := 0; i < 100_000; i++ {
		tb.Insert(uint64(i), false, 0, 0)
		if i >= 1000 && i%97 == 0 {
			load := float64(tb.Len()) / float64(len(tb.nodes))
			require.GreaterOrEqual(t, load, 0.59, "at %d entries", tb.Len())
			require.LessOrEqual(t, load, 0.75, "at %d entries", tb.Len())
		}
	}
	// Shrink gives memory back after a capacity decrease.
	for tb.Len() > 1000 {
		tb.Remove(tb.Oldest())
	}
	tb.Shrink()
	assert.Equal(t, slotsFor(1250), len(tb.nodes))
	assert.Equal(t, uint64(99_999), tb.Hash(tb.head-1), "recency order survives the rehash")
	assert.Equal(t, uint64(99_000), tb.Hash(tb.Oldest()))
}

func TestBlockTableAgainstMap(t *testing.T) {
	for _, keys := range []uint64{50, 5000, 1 << 62} {
		t.Run(fmt.Sprintf("keys=%d", keys), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, keys))
			var tb blockTable
			ref := map[uint64]uint64{}
			for op := 0; op < 40_000; op++ {
				h := rng.Uint64N(keys)
				// Grow for the first half, then drain so shards shrink.
				if rng.IntN(4) > 0 == (op < 20_000) {
					v := rng.Uint64() | 1
					ref[h] = v
					tb.Put(h, v)
				} else {
					delete(ref, h)
					tb.Delete(h)
				}
				require.Equal(t, len(ref), tb.Len())
				if op%1999 == 0 {
					for k, v := range ref {
						require.Equal(t, v, tb.Get(k), "key %d", k)
					}
					require.Zero(t, tb.Get(keys+1))
				}
			}
			for k, v := range ref {
				require.Equal(t, v, tb.Get(k))
			}
			for k := range ref {
				tb.Delete(k)
			}
			assert.Zero(t, tb.Len())
			assert.Equal(t, int64(blockShards*32), tb.Bytes(), "empty shards release their slots")
		})
	}
}
