package prefix

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/inferroute/inferroute/internal/metrictest"
	"github.com/inferroute/inferroute/signals"
)

// chain returns prefix followed by n new block hashes derived from seed.
// Hashes are chained like a Hasher's, so distinct seeds never collide.
func chain(prefix []uint64, n int, seed uint64) []uint64 {
	out := append([]uint64(nil), prefix...)
	prev := seed*0x9e3779b97f4a7c15 + 1
	if len(prefix) > 0 {
		prev = prefix[len(prefix)-1]
	}
	for i := 0; i < n; i++ {
		prev = mum(prev^p0, seed^p1^uint64(i))
		out = append(out, prev)
	}
	return out
}

func newEndpoints(n int) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, n)
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("pod-%d", i)})
	}
	return eps
}

func newIndex(t testing.TB, cfg IndexConfig) *Index {
	t.Helper()
	ix, err := NewIndex(cfg)
	require.NoError(t, err)
	return ix
}

func match(ix *Index, blocks []uint64, eps []*signals.Endpoint) []float64 {
	out := make([]float64, len(eps))
	ix.Match(&signals.Request{PromptBlocks: blocks}, eps, out)
	return out
}

func TestMatchLongestPrefix(t *testing.T) {
	eps := newEndpoints(3)
	base := chain(nil, 16, 1)
	long := chain(base, 16, 2) // 32 blocks, first 16 shared with base
	other := chain(nil, 32, 3)
	tests := []struct {
		name   string
		stride int
		query  []uint64
		want   []float64
	}{
		{"exact", 1, base, []float64{1, 1, 0}},
		{"extension", 1, long, []float64{0.5, 1, 0}},
		{"unrelated", 1, other, []float64{0, 0, 0}},
		{"stride 4 exact", 4, base, []float64{1, 1, 0}},
		{"stride 4 extension", 4, long, []float64{0.5, 1, 0}},
		{"stride 4 partial", 4, long[:22], []float64{16.0 / 22, 20.0 / 22, 0}},
		{"stride 5 extension", 5, long, []float64{15.0 / 32, 1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: tc.stride})
			ix.Dispatched(&signals.Request{PromptBlocks: base}, eps[0])
			ix.Dispatched(&signals.Request{PromptBlocks: long}, eps[1])
			assert.InDeltaSlice(t, tc.want, match(ix, tc.query, eps), 1e-12)
		})
	}
}

func TestMatchManyHolders(t *testing.T) {
	// 200 endpoints: endpoint i holds the first 8+i blocks of one chain, so
	// block sets are bitsets, then shrink to a short list at the tail.
	eps := newEndpoints(200)
	full := chain(nil, 300, 9)
	ix := newIndex(t, IndexConfig{Stride: 1})
	for i, ep := range eps {
		ix.Dispatched(&signals.Request{PromptBlocks: full[:8+i]}, ep)
	}
	got := match(ix, full, eps)
	for i := range eps {
		assert.InDelta(t, float64(8+i)/300, got[i], 1e-12, "endpoint %d", i)
	}
	// Reordered and partial candidate lists are answered alike.
	sub := []*signals.Endpoint{eps[150], eps[3], eps[199], signals.NewEndpoint(signals.EndpointSpec{Name: "new"})}
	assert.InDeltaSlice(t, []float64{158.0 / 300, 11.0 / 300, 207.0 / 300, 0}, match(ix, full, sub), 1e-12)
	// A query shorter than most holdings.
	got = match(ix, full[:10], eps[:4])
	assert.InDeltaSlice(t, []float64{0.8, 0.9, 1, 1}, got, 1e-12)
}

func TestRestartEmptiesEntries(t *testing.T) {
	eps := newEndpoints(2)
	ix := newIndex(t, IndexConfig{})
	blocks := chain(nil, 40, 1)
	for _, ep := range eps {
		ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
	}
	require.Equal(t, []float64{1, 1}, match(ix, blocks, eps))
	before := ix.Stats()
	assert.Equal(t, 2*10, before.Entries) // blocks 3, 7, …, 39 per endpoint

	eps[0].MarkRestarted()
	assert.Equal(t, []float64{0, 1}, match(ix, blocks, eps), "a restarted pod holds nothing at once")
	ix.Retain(eps)
	s := ix.Stats()
	assert.Equal(t, 10, s.Entries, "its entries are gone")
	assert.Equal(t, 10, s.Blocks)

	eps[1].MarkDown() // down also starts a new generation
	assert.Equal(t, []float64{0, 0}, match(ix, blocks, eps))
	ix.Dispatched(&signals.Request{PromptBlocks: blocks[:4]}, eps[1])
	assert.Equal(t, 1, ix.Stats().Entries, "stale entries dropped lazily on the next dispatch")
	assert.Equal(t, []float64{0, 0.1}, match(ix, blocks, eps))
}

func TestForgetAndRetain(t *testing.T) {
	eps := newEndpoints(4)
	ix := newIndex(t, IndexConfig{Stride: 1})
	blocks := chain(nil, 10, 1)
	for _, ep := range eps {
		ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
	}
	assert.Equal(t, 40, ix.Stats().Entries)
	ix.Forget(eps[0])
	ix.Retain(eps[1:3])
	s := ix.Stats()
	assert.Equal(t, 2, s.Endpoints)
	assert.Equal(t, 20, s.Entries)
	assert.Equal(t, 10, s.Blocks)
	assert.Equal(t, []float64{0, 1, 1, 0}, match(ix, blocks, eps))
	// Freed slots are reused without stale bits.
	fresh := newEndpoints(2)
	ix.Dispatched(&signals.Request{PromptBlocks: blocks[:5]}, fresh[0])
	assert.Equal(t, []float64{0.5, 0}, match(ix, blocks, fresh))
	ix.Forget(eps...)
	ix.Forget(fresh...)
	s = ix.Stats()
	assert.Equal(t, IndexStats{Bytes: s.Bytes}, s)
}

func TestCapacityEvictsTailFirst(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "small"})
	// 64 KV blocks of 16 tokens: 64 hash blocks of 16 tokens.
	ep.SetMetrics(&signals.Metrics{BlockSize: 16, NumBlocks: 64})
	ix := newIndex(t, IndexConfig{Stride: 1})
	eps := []*signals.Endpoint{ep}
	long := chain(nil, 100, 1)
	ix.Dispatched(&signals.Request{PromptBlocks: long}, ep)
	assert.Equal(t, 64, ix.Stats().Entries)
	assert.InDeltaSlice(t, []float64{0.64}, match(ix, long, eps), 1e-12, "the head survives, the tail is evicted")

	// Least recently used prompts go first.
	ix2 := newIndex(t, IndexConfig{Stride: 1})
	a, b, c := chain(nil, 30, 2), chain(nil, 30, 3), chain(nil, 30, 4)
	ix2.Dispatched(&signals.Request{PromptBlocks: a}, ep)
	ix2.Dispatched(&signals.Request{PromptBlocks: b}, ep)
	ix2.Dispatched(&signals.Request{PromptBlocks: a}, ep) // touch a
	ix2.Dispatched(&signals.Request{PromptBlocks: c}, ep) // 90 > 64: b loses 26 blocks
	assert.InDeltaSlice(t, []float64{1}, match(ix2, a, eps), 1e-12)
	assert.InDeltaSlice(t, []float64{4.0 / 30}, match(ix2, b, eps), 1e-12)
	assert.InDeltaSlice(t, []float64{1}, match(ix2, c, eps), 1e-12)

	// A capacity beyond what a table can index is held to maxEntries.
	huge := signals.NewEndpoint(signals.EndpointSpec{Name: "huge"})
	huge.SetMetrics(&signals.Metrics{BlockSize: 1 << 20, NumBlocks: 1 << 30})
	assert.Equal(t, maxEntries, newIndex(t, IndexConfig{Stride: 1}).capacity(huge))

	// Capacity follows the scrape; the default applies without one.
	ep.SetMetrics(&signals.Metrics{BlockSize: 16, NumBlocks: 8})
	ix2.Dispatched(&signals.Request{PromptBlocks: a[:1]}, ep)
	assert.Equal(t, 8, ix2.Stats().Entries)
	ix3 := newIndex(t, IndexConfig{Stride: 2, DefaultCapacity: 10})
	ix3.Dispatched(&signals.Request{PromptBlocks: long}, signals.NewEndpoint(signals.EndpointSpec{Name: "x"}))
	assert.Equal(t, 5, ix3.Stats().Entries)
}

func TestCompletedConfirmsOrUnconfirms(t *testing.T) {
	eps := newEndpoints(1)
	ep := eps[0]
	blocks := chain(nil, 8, 1)
	more := chain(blocks, 8, 2)
	failed := signals.Outcome{Err: errors.New("boom")}
	// failAfter dispatches n requests for more, then fails them all.
	failAfter := func(n int) func(ix *Index) {
		return func(ix *Index) {
			for range n {
				ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			}
			for range n {
				ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
			}
		}
	}
	tests := []struct {
		name string
		run  func(ix *Index)
		want float64
	}{
		{"success keeps", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{})
		}, 1},
		{"failure before first token removes", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
		}, 0},
		{"failure after first token keeps", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{Err: failed.Err, TTFT: 1})
		}, 1},
		{"failure keeps what an earlier success confirmed", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
			ix.Completed(&signals.Request{PromptBlocks: blocks}, ep, signals.Outcome{})
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
		}, 0.5},
		{"a failure keeps what another request in flight recorded", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
		}, 1},
		{"the last failure in flight removes", failAfter(3), 0},
		{"a failure in flight with a shorter prompt keeps the shared head", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
		}, 0.5},
		{"a success in flight protects from a later failure", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{})
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, failed)
		}, 1},
		{"a saturated in-flight count keeps its entries", failAfter(maxPending + 1), 1},
		{"one short of saturation counts exactly", failAfter(maxPending - 1), 0},
		{"success re-adds what was evicted", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Dispatched(&signals.Request{PromptBlocks: chain(nil, 16, 9)}, ep) // evicts more
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{})
		}, 1},
		{"a forgotten endpoint is not brought back", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ix.Forget(ep)
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{})
		}, 0},
		{"a completion after a restart is ignored", func(ix *Index) {
			ix.Dispatched(&signals.Request{PromptBlocks: more}, ep)
			ep.MarkRestarted()
			ix.Completed(&signals.Request{PromptBlocks: more}, ep, signals.Outcome{})
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: 1, DefaultCapacity: 16})
			tc.run(ix)
			assert.InDeltaSlice(t, []float64{tc.want}, match(ix, more, eps), 1e-12)
		})
	}
}

func TestMatchEdgeCases(t *testing.T) {
	ix := newIndex(t, IndexConfig{})
	eps := newEndpoints(2)
	out := []float64{7, 7}
	ix.Match(&signals.Request{}, eps, out)
	assert.Equal(t, []float64{0, 0}, out, "no blocks")
	ix.Dispatched(&signals.Request{}, eps[0])
	ix.Completed(&signals.Request{}, eps[0], signals.Outcome{})
	assert.Equal(t, 0, ix.Stats().Endpoints)
	out = []float64{7, 7}
	ix.Match(&signals.Request{PromptBlocks: chain(nil, 3, 1)}, eps, out)
	assert.Equal(t, []float64{0, 0}, out, "empty index")
	ix.Match(&signals.Request{PromptBlocks: chain(nil, 3, 1)}, nil, nil)
}

func TestMatchDoesNotAllocate(t *testing.T) {
	eps := newEndpoints(100)
	ix := newIndex(t, IndexConfig{})
	shared := chain(nil, 128, 1)
	for i, ep := range eps {
		ix.Dispatched(&signals.Request{PromptBlocks: chain(shared, 64, uint64(i+2))}, ep)
	}
	req := &signals.Request{PromptBlocks: chain(shared, 64, 5)}
	out := make([]float64, len(eps))
	ix.Match(req, eps, out)
	allocs := testing.AllocsPerRun(100, func() { ix.Match(req, eps, out) })
	if !raceEnabled {
		assert.Zero(t, allocs)
	}
	assert.InDelta(t, 1, out[3], 1e-12) // chain seed 5 was dispatched to eps[3]
	assert.InDelta(t, 128.0/192, out[0], 1e-12)
}

func TestIndexConcurrentUse(t *testing.T) {
	eps := newEndpoints(16)
	ix := newIndex(t, IndexConfig{DefaultCapacity: 256})
	shared := chain(nil, 32, 1)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			out := make([]float64, len(eps))
			for i := 0; i < 300; i++ {
				req := &signals.Request{PromptBlocks: chain(shared, 16, uint64(g*1000+i%50))}
				ix.Match(req, eps, out)
				ep := eps[(g+i)%len(eps)]
				ix.Dispatched(req, ep)
				ix.Completed(req, ep, signals.Outcome{})
				if i%97 == 0 {
					ix.Retain(eps)
					ep.MarkRestarted()
				}
			}
		}(g)
	}
	wg.Wait()
	s := ix.Stats()
	assert.LessOrEqual(t, s.Entries, len(eps)*256/DefaultStride)
	assert.Positive(t, s.Entries)
}

func TestIndexGauges(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	ix := newIndex(t, IndexConfig{Stride: 1, Meter: mp.Meter("test")})
	eps := newEndpoints(2)
	blocks := chain(nil, 10, 1)
	ix.Dispatched(&signals.Request{PromptBlocks: blocks}, eps[0])
	ix.Dispatched(&signals.Request{PromptBlocks: blocks[:4]}, eps[1])

	got := metrictest.Collect(t, reader)
	// 14 entries, 10 distinct blocks, 2 endpoints in 2 slots.
	mem := ix.MemoryBytes()
	assert.Equal(t, map[string]int64{
		"inferroute.prefix.index.memory":    mem,
		"inferroute.prefix.index.entries":   14,
		"inferroute.prefix.index.blocks":    10,
		"inferroute.prefix.index.endpoints": 2,
	}, got)
	// Each endpoint's first table has 16 slots of 16 bytes; the 10 blocks
	// sit in one to ten shards of 16 slots; every shard has a 32-byte header.
	lo := int64(2*16*16 + 1*16*16 + blockShards*32 + 2*endpointBytes)
	assert.GreaterOrEqual(t, mem, lo)
	assert.LessOrEqual(t, mem, lo+9*16*16)
	require.NoError(t, ix.Close())
}

// TestIndexGaugesPerPool: indexes sharing a meter provider, labelled by
// IndexConfig.Attributes, export one series each with that index's own
// figures; a gauge keeps one value per attribute set, so without the
// labels the idle index, observed last, hid the busy one's.
func TestIndexGaugesPerPool(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	busy := newIndex(t, IndexConfig{Stride: 1, Meter: mp.Meter("test"), Attributes: []attribute.KeyValue{attribute.String("pool", "busy")}})
	idle := newIndex(t, IndexConfig{Stride: 1, Meter: mp.Meter("test"), Attributes: []attribute.KeyValue{attribute.String("pool", "idle")}})
	eps := newEndpoints(2)
	blocks := chain(nil, 10, 1)
	busy.Dispatched(&signals.Request{PromptBlocks: blocks}, eps[0])
	busy.Dispatched(&signals.Request{PromptBlocks: blocks[:4]}, eps[1])

	got := metrictest.Collect(t, reader)
	assert.Equal(t, map[string]int64{
		"inferroute.prefix.index.memory{pool=busy}":    busy.MemoryBytes(),
		"inferroute.prefix.index.entries{pool=busy}":   14,
		"inferroute.prefix.index.blocks{pool=busy}":    10,
		"inferroute.prefix.index.endpoints{pool=busy}": 2,
		"inferroute.prefix.index.memory{pool=idle}":    idle.MemoryBytes(),
		"inferroute.prefix.index.entries{pool=idle}":   0,
		"inferroute.prefix.index.blocks{pool=idle}":    0,
		"inferroute.prefix.index.endpoints{pool=idle}": 0,
	}, got)
	require.NoError(t, busy.Close())
	require.NoError(t, idle.Close())
}

// TestMatchAgainstReference compares Match with a direct computation from
// what was dispatched: endpoint e holds probe position p of a chain when p
// is a stride position below a dispatched length L, or p == L-1.
func TestMatchAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, tc := range []struct{ stride, eps int }{{1, 70}, {3, 70}, {4, 70}, {1, 300}, {4, 300}} {
		stride := tc.stride
		t.Run(fmt.Sprintf("stride=%d/eps=%d", stride, tc.eps), func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: stride, DefaultCapacity: 1 << 20})
			eps := newEndpoints(tc.eps)
			chains := [][]uint64{chain(nil, 300, 1), chain(nil, 300, 2)}
			held := make([][][]int, len(eps)) // endpoint → chain → dispatched lengths
			for e, ep := range eps {
				held[e] = make([][]int, len(chains))
				for k := rng.IntN(4); k > 0; k-- {
					c, l := rng.IntN(len(chains)), 1+rng.IntN(300)
					ix.Dispatched(&signals.Request{PromptBlocks: chains[c][:l]}, ep)
					held[e][c] = append(held[e][c], l)
				}
			}
			for q := 0; q < 200; q++ {
				c, n := rng.IntN(len(chains)), 1+rng.IntN(300)
				got := match(ix, chains[c][:n], eps)
				for e := range eps {
					holds := func(p int) bool {
						for _, l := range held[e][c] {
							if ((p+1)%stride == 0 && p < l) || p == l-1 {
								return true
							}
						}
						return false
					}
					want := 0
					for p := stride - 1; ; p += stride {
						p = min(p, n-1)
						if !holds(p) {
							break
						}
						want = p + 1
						if p == n-1 {
							break
						}
					}
					require.InDelta(t, float64(want)/float64(n), got[e], 1e-12, "endpoint %d chain %d n %d", e, c, n)
				}
			}
		})
	}
}

func TestMatchReusesResolutionSafely(t *testing.T) {
	ix := newIndex(t, IndexConfig{Stride: 1})
	eps := newEndpoints(3)
	blocks := chain(nil, 10, 1)
	ix.Dispatched(&signals.Request{PromptBlocks: blocks}, eps[0])
	ix.Dispatched(&signals.Request{PromptBlocks: blocks[:5]}, eps[1])
	out := make([]float64, 3)
	req := &signals.Request{PromptBlocks: blocks}
	steps := []struct {
		name string
		do   func()
		eps  []*signals.Endpoint
		want []float64
	}{
		{"first", func() {}, eps, []float64{1, 0.5, 0}},
		{"same list", func() {}, eps, []float64{1, 0.5, 0}},
		{"same length, other order", func() {}, []*signals.Endpoint{eps[2], eps[1], eps[0]}, []float64{0, 0.5, 1}},
		{"after forget", func() { ix.Forget(eps[0]) }, eps, []float64{0, 0.5, 0}},
		{"after a new endpoint state", func() { ix.Dispatched(req, eps[2]) }, eps, []float64{0, 0.5, 1}},
		{"after a restart", func() { eps[1].MarkRestarted() }, eps, []float64{0, 0, 1}},
		{"an endpoint listed twice", func() {}, []*signals.Endpoint{eps[2], eps[0], eps[2]}, []float64{1, 0, 1}},
		{"the same list again", func() {}, []*signals.Endpoint{eps[2], eps[0], eps[2]}, []float64{1, 0, 1}},
		{"one position changed", func() {}, []*signals.Endpoint{eps[2], eps[0], eps[1]}, []float64{1, 0, 0}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do()
			ix.Match(req, st.eps, out)
			assert.Equal(t, st.want, out)
		})
	}
}

// TestMemoryBytesMatchesHeap checks the index's memory report against the
// Go heap it really holds: an index of 300 thousand entries over 32
// endpoints, most blocks held by one endpoint and a shared prefix by all.
func TestMemoryBytesMatchesHeap(t *testing.T) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ix := newIndex(t, IndexConfig{Stride: 1, DefaultCapacity: 1 << 20})
	eps := newEndpoints(32)
	system := chain(nil, 128, 1)
	for k := 0; ix.Stats().Entries < 300_000; k++ {
		ix.Dispatched(&signals.Request{PromptBlocks: chain(system, 500, uint64(k)+2)}, eps[k%len(eps)])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	s := ix.Stats()
	runtime.KeepAlive(ix)
	assert.InEpsilon(t, heap, float64(s.Bytes), 0.2, "heap %.0f bytes, reported %d", heap, s.Bytes)
	assert.Less(t, heap/float64(s.Entries), 64.0, "bytes per (block, endpoint) entry")
}

// TestHolderSetForms moves blocks through every holder-set form (inline,
// list, bitset) and back out, in pools with narrow and wide bitsets.
func TestHolderSetForms(t *testing.T) {
	tests := []struct {
		name    string
		pool    int // endpoints: 300 makes bitsets wider than lists
		holders int
		form    string // of the blocks' holder sets
	}{
		{"inline, narrow pool", 70, 3, "inline"},
		{"bitset, narrow pool", 70, 6, "bitset"},
		{"inline, wide pool", 300, 2, "inline"},
		{"list, wide pool", 300, 4, "list"},
		{"full list, wide pool", 300, listLen, "list"},
		{"list overflows to bitset", 300, 40, "bitset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: 1})
			eps := newEndpoints(tc.pool)
			for i, ep := range eps { // a slot for every endpoint, and a block of its own
				ix.Dispatched(&signals.Request{PromptBlocks: chain(nil, 1, uint64(1000+i))}, ep)
			}
			blocks := chain(nil, 12, 7)
			// Holders are spread over the pool: endpoint i·step for i < holders.
			step := tc.pool / tc.holders
			want := make([]float64, tc.pool)
			for i := 0; i < tc.holders; i++ {
				ix.Dispatched(&signals.Request{PromptBlocks: blocks}, eps[i*step])
				want[i*step] = 1
			}
			require.Equal(t, want, match(ix, blocks, eps))
			assert.Equal(t, tc.pool*1+tc.holders*len(blocks), ix.Stats().Entries)
			for _, h := range blocks {
				require.Equal(t, tc.form, holderForm(ix.blocks.Get(h)))
			}

			// A failed request removes one holder's pending entries.
			last := eps[(tc.holders-1)*step]
			ix.Completed(&signals.Request{PromptBlocks: blocks}, last, signals.Outcome{Err: errors.New("refused")})
			want[(tc.holders-1)*step] = 0
			require.Equal(t, want, match(ix, blocks, eps))
			// Forgetting the others empties the blocks and frees every set.
			for i := 0; i < tc.holders-1; i++ {
				ix.Forget(eps[i*step])
				want[i*step] = 0
			}
			require.Equal(t, want, match(ix, blocks, eps))
			s := ix.Stats()
			assert.Equal(t, s.Endpoints, s.Entries, "one block per remaining endpoint")
			assert.Zero(t, ix.nsets, "bitsets in use")
			assert.Equal(t, len(ix.lists)/listLen, len(ix.listFree), "lists in use")
		})
	}
}

func holderForm(v uint64) string {
	switch v & tagMask {
	case listTag:
		return "list"
	case bitsetTag:
		return "bitset"
	}
	return "inline"
}

// refModel is an independent account of what an index should report: per
// endpoint, whether its generation moved since the index last recorded it
// (stale: it holds nothing until its next dispatch or a Retain), and
// whether the index forgot it.
type refModel struct {
	stale, gone map[*signals.Endpoint]bool
	// held, for indexes that never evict: the indexed positions of every
	// prompt dispatched to the endpoint since it was last reset, computed
	// here from the stride rule, not read from the index.
	held map[*signals.Endpoint]map[uint64]bool
}

func newRefModel() *refModel {
	return &refModel{
		stale: map[*signals.Endpoint]bool{},
		gone:  map[*signals.Endpoint]bool{},
		held:  map[*signals.Endpoint]map[uint64]bool{},
	}
}

// dispatched records blocks on ep: indexed positions are every stride-th
// block and the last.
func (r *refModel) dispatched(ep *signals.Endpoint, blocks []uint64, stride int) {
	if r.stale[ep] || r.gone[ep] || r.held[ep] == nil {
		r.held[ep] = map[uint64]bool{}
	}
	r.stale[ep], r.gone[ep] = false, false
	for p, h := range blocks {
		if (p+1)%stride == 0 || p == len(blocks)-1 {
			r.held[ep][h] = true
		}
	}
}

// ownBlocks returns the block hashes ep itself holds, read from its own
// LRU table (not from the block table and holder sets that Lookup
// searches), or nil when it holds nothing: unknown, forgotten or stale.
func (r *refModel) ownBlocks(ix *Index, ep *signals.Endpoint) map[uint64]bool {
	st := ix.eps[ep]
	if st == nil || r.stale[ep] || r.gone[ep] {
		return nil
	}
	own := map[uint64]bool{}
	st.lru.Each(func(h uint64) { own[h] = true })
	return own
}

// refFraction walks the query's indexed positions in order, as the index
// defines a match: the prompt's blocks stride-1, 2·stride-1, … and its
// last block; the match ends before the first position not held.
func refFraction(held map[uint64]bool, query []uint64, stride int) float64 {
	matched := 0
	for p := stride - 1; ; p += stride {
		p = min(p, len(query)-1)
		if !held[query[p]] {
			break
		}
		matched = p + 1
		if p == len(query)-1 {
			break
		}
	}
	return float64(matched) / float64(len(query))
}

// TestLookupFillAgainstReference drives indexes through random dispatches,
// completions, restarts, outages, Forget and Retain, and checks Lookup and
// Fill (with one Matches reused throughout, so its cached resolution is
// exercised), Fraction and Match against a brute-force reference that
// walks each endpoint's own held blocks. Candidate lists are random
// subsets in random order, with duplicates and endpoints the index never
// saw. Pools of 300 use multi-word bitsets and holder lists; small
// capacities make endpoints evict.
func TestLookupFillAgainstReference(t *testing.T) {
	tests := []struct {
		stride, eps, capacity int
	}{
		{1, 5, 1 << 20}, {4, 40, 1 << 20}, {3, 70, 1 << 20}, {4, 300, 1 << 20},
		{1, 20, 24}, {4, 130, 12}, {2, 300, 40},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("stride=%d/eps=%d/cap=%d", tc.stride, tc.eps, tc.capacity), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.eps), uint64(tc.capacity)))
			ix := newIndex(t, IndexConfig{Stride: tc.stride, DefaultCapacity: tc.capacity})
			eps := newEndpoints(tc.eps)
			strangers := newEndpoints(3) // never dispatched to
			// A tree of chains: a shared root, branches off it, and twigs
			// off the branches.
			root := chain(nil, 96, 1)
			chains := [][]uint64{root}
			for k := 0; k < 4; k++ {
				br := chain(root[:rng.IntN(len(root))+1], 64, uint64(10+k))
				chains = append(chains, br, chain(br[:rng.IntN(len(br))+1], 48, uint64(20+k)))
			}
			pick := func() []uint64 {
				c := chains[rng.IntN(len(chains))]
				return c[:1+rng.IntN(len(c))]
			}
			ref := newRefModel()
			var m Matches
			for step := 0; step < 400; step++ {
				ep := eps[rng.IntN(len(eps))]
				switch op := rng.IntN(20); {
				case op < 10:
					blocks := pick()
					ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
					ref.dispatched(ep, blocks, tc.stride)
					if rng.IntN(3) == 0 {
						ix.Completed(&signals.Request{PromptBlocks: blocks}, ep, signals.Outcome{})
					}
				case op == 10:
					ep.MarkRestarted()
					ref.stale[ep] = true
				case op == 11:
					ep.MarkDown()
					ep.ReportSuccess(ep.HealthMark())
					ref.stale[ep] = true
				case op == 12:
					ix.Forget(ep)
					ref.gone[ep] = true
				case op == 13:
					ix.Retain(eps) // resets the stale: they hold nothing, and stay so
					for e := range ref.stale {
						if ref.stale[e] && !ref.gone[e] {
							ref.held[e] = map[uint64]bool{}
						}
					}
				}
				// The candidates: a random selection, in random order,
				// with repeats and strangers.
				cands := make([]*signals.Endpoint, 0, len(eps)+2)
				for _, i := range rng.Perm(len(eps))[:1+rng.IntN(len(eps))] {
					cands = append(cands, eps[i])
				}
				if rng.IntN(2) == 0 {
					cands = append(cands, cands[rng.IntN(len(cands))], strangers[rng.IntN(len(strangers))])
				}
				if rng.IntN(4) == 0 && step > 0 {
					cands = eps // the same list again: the cached resolution
				}
				query := pick()
				want := make([]float64, len(cands))
				for i, c := range cands {
					own := ref.ownBlocks(ix, c)
					if tc.capacity == 1<<20 && own != nil {
						require.Equal(t, ref.held[c], own, "step %d: the endpoint's own blocks", step)
					}
					want[i] = refFraction(own, query, tc.stride)
				}
				req := &signals.Request{PromptBlocks: query}
				ix.Lookup(req, &m)
				got := make([]float64, len(cands))
				for i := range got {
					got[i] = -1 // Fill must write every position
				}
				m.Fill(cands, got)
				require.InDeltaSlice(t, want, got, 1e-12, "step %d: Lookup+Fill", step)
				for i, c := range cands {
					require.InDelta(t, want[i], m.Fraction(c), 1e-12, "step %d: Fraction of candidate %d", step, i)
				}
				require.InDeltaSlice(t, want, match(ix, query, cands), 1e-12, "step %d: Match", step)
			}
		})
	}
}

// TestLookupAfterRestart checks that a restart or outage between two
// lookups of the same candidate list (so that Fill reuses its resolution)
// empties the endpoint at once, without a Retain or dispatch, both for
// Lookup+Fill and for Match; and what a change between Lookup and Fill
// does.
func TestLookupAfterRestart(t *testing.T) {
	blocks := chain(nil, 40, 1)
	req := &signals.Request{PromptBlocks: blocks}
	tests := []struct {
		name    string
		between func(ix *Index, eps []*signals.Endpoint) // between the lookups
		want    []float64
	}{
		{"nothing", func(*Index, []*signals.Endpoint) {}, []float64{1, 0.5, 1}},
		{"restart", func(_ *Index, eps []*signals.Endpoint) { eps[1].MarkRestarted() }, []float64{1, 0, 1}},
		{"outage", func(_ *Index, eps []*signals.Endpoint) { eps[2].MarkDown() }, []float64{1, 0.5, 0}},
		{"outage and recovery", func(_ *Index, eps []*signals.Endpoint) { eps[2].MarkDown(); eps[2].ReportSuccess(eps[2].HealthMark()) }, []float64{1, 0.5, 0}},
		{"two restarts", func(_ *Index, eps []*signals.Endpoint) { eps[0].MarkRestarted(); eps[1].MarkRestarted() }, []float64{0, 0, 1}},
		{"restart, then a new dispatch", func(ix *Index, eps []*signals.Endpoint) {
			eps[0].MarkRestarted()
			ix.Dispatched(&signals.Request{PromptBlocks: blocks[:8]}, eps[0])
		}, []float64{0.2, 0.5, 1}},
		{"restart of an endpoint of another index", func(*Index, []*signals.Endpoint) {
			newEndpoints(1)[0].MarkRestarted()
		}, []float64{1, 0.5, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{})
			eps := newEndpoints(3)
			ix.Dispatched(req, eps[0])
			ix.Dispatched(&signals.Request{PromptBlocks: blocks[:20]}, eps[1])
			ix.Dispatched(req, eps[2])
			var m Matches
			out := make([]float64, 3)
			ix.Lookup(req, &m)
			m.Fill(eps, out)
			require.Equal(t, []float64{1, 0.5, 1}, out)
			require.Equal(t, []float64{1, 0.5, 1}, match(ix, blocks, eps))

			tc.between(ix, eps)
			ix.Lookup(req, &m)
			m.Fill(eps, out)
			assert.Equal(t, tc.want, out, "Lookup+Fill")
			assert.Equal(t, tc.want, match(ix, blocks, eps), "Match")
		})
	}
}

// TestFillAfterIndexChanges checks Fill when the index's endpoints change
// between Lookup and Fill: a slot that changed hands or was reset is not
// reported for its new owner, while the others keep what Lookup found.
func TestFillAfterIndexChanges(t *testing.T) {
	blocks := chain(nil, 16, 1)
	req := &signals.Request{PromptBlocks: blocks}
	tests := []struct {
		name    string
		between func(ix *Index, eps []*signals.Endpoint)
		want    []float64 // for eps[0], eps[1], eps[2], eps[3]
	}{
		{"nothing", func(*Index, []*signals.Endpoint) {}, []float64{1, 0.25, 0, 0}},
		{"a restart, no dispatch: Lookup's view", func(_ *Index, eps []*signals.Endpoint) {
			eps[0].MarkRestarted()
		}, []float64{1, 0.25, 0, 0}},
		{"a restart and a dispatch reset the slot", func(ix *Index, eps []*signals.Endpoint) {
			eps[0].MarkRestarted()
			ix.Dispatched(req, eps[0])
		}, []float64{0, 0.25, 0, 0}},
		{"forgotten, its slot reused by a newcomer", func(ix *Index, eps []*signals.Endpoint) {
			ix.Forget(eps[0])
			ix.Dispatched(req, eps[3]) // takes eps[0]'s slot
		}, []float64{0, 0.25, 0, 0}},
		{"a newcomer in a new slot", func(ix *Index, eps []*signals.Endpoint) {
			ix.Dispatched(req, eps[2])
		}, []float64{1, 0.25, 0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{})
			eps := newEndpoints(4)
			ix.Dispatched(req, eps[0])
			ix.Dispatched(&signals.Request{PromptBlocks: blocks[:4]}, eps[1])
			var m Matches
			ix.Lookup(req, &m)
			out := make([]float64, 4)
			m.Fill(eps, out) // warm the resolution
			tc.between(ix, eps)
			m.Fill(eps, out)
			assert.Equal(t, tc.want, out, "Fill")
			for i, ep := range eps {
				assert.Equal(t, tc.want[i], m.Fraction(ep), "Fraction of %d", i)
			}
		})
	}
}

func TestMatchesEdgeCases(t *testing.T) {
	eps := newEndpoints(2)
	blocks := chain(nil, 8, 1)
	req := &signals.Request{PromptBlocks: blocks}
	var zero Matches
	out := []float64{7, 7}
	zero.Fill(eps, out)
	assert.Equal(t, []float64{0, 0}, out, "never looked up")
	assert.Zero(t, zero.Fraction(eps[0]))

	a, b := newIndex(t, IndexConfig{Stride: 1}), newIndex(t, IndexConfig{Stride: 1})
	a.Dispatched(req, eps[0])
	b.Dispatched(&signals.Request{PromptBlocks: blocks[:2]}, eps[1])
	b.Dispatched(&signals.Request{PromptBlocks: blocks[:1]}, eps[0])
	var m Matches
	a.Lookup(req, &m)
	m.Fill(eps, out)
	assert.Equal(t, []float64{1, 0}, out)
	b.Lookup(req, &m) // the same Matches on another index
	m.Fill(eps, out)
	assert.Equal(t, []float64{0.125, 0.25}, out)
	m.Fill(nil, nil)
	b.Lookup(&signals.Request{}, &m)
	out = []float64{7, 7}
	m.Fill(eps, out)
	assert.Equal(t, []float64{0, 0}, out, "no blocks")
	b.Lookup(&signals.Request{PromptBlocks: chain(nil, 8, 2)}, &m)
	m.Fill(eps, out)
	assert.Equal(t, []float64{0, 0}, out, "a miss")
	b.Lookup(req, &m)
	long := make([]float64, 3)
	m.Fill(eps, long)
	assert.Equal(t, []float64{0.125, 0.25, 0}, long, "out longer than eps: the rest untouched")
}

// TestFillBackground covers both ways Fill writes out: most candidates
// sharing one match (written as a background, the rest scattered) and most
// holding nothing.
func TestFillBackground(t *testing.T) {
	blocks := chain(nil, 8, 1)
	tests := []struct {
		name    string
		holders int // of 10 candidates, the first hold everything
		extra   int // strangers appended to the list
	}{
		{"all hold", 10, 0},
		{"most hold", 7, 0},
		{"most hold, strangers", 6, 3},
		{"half hold", 5, 0},
		{"few hold", 2, 0},
		{"one holds", 1, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: 1})
			eps := newEndpoints(10)
			want := make([]float64, 10+tc.extra)
			for i, ep := range eps {
				if i < tc.holders {
					ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
					want[i] = 1
				} else {
					ix.Dispatched(&signals.Request{PromptBlocks: chain(nil, 4, uint64(100+i))}, ep)
				}
			}
			eps = append(eps, newEndpoints(tc.extra)...)
			var m Matches
			ix.Lookup(&signals.Request{PromptBlocks: blocks}, &m)
			out := make([]float64, len(eps))
			for i := range out {
				out[i] = 7
			}
			m.Fill(eps, out)
			assert.Equal(t, want, out)
		})
	}
}

func TestLookupFillDoNotAllocate(t *testing.T) {
	eps := newEndpoints(300)
	ix := newIndex(t, IndexConfig{})
	shared := chain(nil, 128, 1)
	for i, ep := range eps {
		ix.Dispatched(&signals.Request{PromptBlocks: chain(shared, 64, uint64(i+2))}, ep)
	}
	req := &signals.Request{PromptBlocks: chain(shared, 64, 5)}
	var m Matches
	out := make([]float64, len(eps))
	ix.Lookup(req, &m)
	m.Fill(eps, out)
	assert.Zero(t, testing.AllocsPerRun(100, func() { ix.Lookup(req, &m) }), "Lookup")
	assert.Zero(t, testing.AllocsPerRun(100, func() { m.Fill(eps, out) }), "Fill")
	assert.InDelta(t, 1, out[3], 1e-12) // chain seed 5 was dispatched to eps[3]
	assert.InDelta(t, 128.0/192, out[0], 1e-12)
}

// TestLookupConcurrentUse runs Lookup, Fill and Fraction (one Matches per
// goroutine) against Dispatched, Completed, Forget, Retain and restarts,
// for the race detector; then checks that the settled index answers
// Lookup+Fill as Match does.
func TestLookupConcurrentUse(t *testing.T) {
	eps := newEndpoints(130)
	ix := newIndex(t, IndexConfig{DefaultCapacity: 256})
	shared := chain(nil, 32, 1)
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(2)
		go func(g int) { // a reader
			defer wg.Done()
			var m Matches
			out := make([]float64, len(eps))
			for i := 0; i < 300; i++ {
				req := &signals.Request{PromptBlocks: chain(shared, 16, uint64(i%50))}
				ix.Lookup(req, &m)
				cands := eps[(g*7+i)%20:]
				m.Fill(cands, out)
				for j, f := range out[:len(cands)] {
					if f < 0 || f > 1 {
						t.Errorf("fraction %v at %d", f, j)
					}
				}
				_ = m.Fraction(eps[i%len(eps)])
			}
		}(g)
		go func(g int) { // a writer
			defer wg.Done()
			for i := 0; i < 300; i++ {
				req := &signals.Request{PromptBlocks: chain(shared, 16, uint64(i%50))}
				ep := eps[(g*31+i)%len(eps)]
				ix.Dispatched(req, ep)
				ix.Completed(req, ep, signals.Outcome{})
				switch i % 61 {
				case 0:
					ep.MarkRestarted()
				case 20:
					ix.Forget(ep)
				case 40:
					ix.Retain(eps)
				}
			}
		}(g)
	}
	wg.Wait()
	var m Matches
	for i := 0; i < 50; i++ {
		req := &signals.Request{PromptBlocks: chain(shared, 16, uint64(i))}
		ix.Lookup(req, &m)
		out := make([]float64, len(eps))
		m.Fill(eps, out)
		require.Equal(t, match(ix, req.PromptBlocks, eps), out)
	}
}

func ExampleIndex_Lookup() {
	ix, err := NewIndex(IndexConfig{Stride: 1})
	if err != nil {
		panic(err)
	}
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-a"})
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-b"})
	c := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-c"})
	system := chain(nil, 6, 1)  // a shared system prompt
	conv := chain(system, 2, 2) // one conversation behind it
	ix.Dispatched(&signals.Request{PromptBlocks: system}, a)
	ix.Dispatched(&signals.Request{PromptBlocks: conv}, b)

	var m Matches // reuse it: Lookup and Fill do not allocate once warm
	ix.Lookup(&signals.Request{PromptBlocks: conv}, &m)
	out := make([]float64, 3)
	m.Fill([]*signals.Endpoint{a, b, c}, out)
	fmt.Println(out, m.Fraction(b))
	// Output: [0.75 1 0] 1
}

// touchRef is the reference for the order an endpoint's entries are in:
// the plain LRU rule that recordLocked must reproduce, touching every
// indexed position of a prompt from the last to the first, inserting the
// absent ones at the front and evicting the oldest when full.
type touchRef struct {
	lru *refLRU
	cap int
}

// positions returns the indexed positions of an n-block prompt, last first.
func refPositions(n, stride int) []int {
	var ps []int
	for p := stride - 1; p < n-1; p += stride {
		ps = append(ps, p)
	}
	ps = append(ps, n-1)
	slices.Reverse(ps)
	return ps
}

func (r *touchRef) record(blocks []uint64, stride int, confirmed bool, pending int, found func(*refEntry)) {
	for _, p := range refPositions(len(blocks), stride) {
		h := blocks[p]
		if e, ok := r.lru.byH[h]; ok {
			found(e.Value.(*refEntry))
			r.lru.order.MoveToFront(e)
			continue
		}
		if r.lru.order.Len() >= r.cap {
			old := r.lru.order.Back()
			r.lru.order.Remove(old)
			delete(r.lru.byH, old.Value.(*refEntry).h)
		}
		r.lru.byH[h] = r.lru.order.PushFront(&refEntry{h: h, confirmed: confirmed, pending: pending})
	}
}

func (r *touchRef) dispatched(blocks []uint64, stride int) {
	r.record(blocks, stride, false, 1, func(e *refEntry) { e.pending = min(e.pending+1, maxPending) })
}

func (r *touchRef) completed(blocks []uint64, stride int, ok bool) {
	if ok {
		r.record(blocks, stride, true, 0, func(e *refEntry) {
			if e.pending > 0 && e.pending < maxPending {
				e.pending--
			}
			e.confirmed = true
		})
		return
	}
	for _, p := range refPositions(len(blocks), stride) {
		el, present := r.lru.byH[blocks[p]]
		if !present {
			continue
		}
		e := el.Value.(*refEntry)
		if e.pending > 0 && e.pending < maxPending {
			e.pending--
		}
		if e.pending == 0 && !e.confirmed {
			r.lru.order.Remove(el)
			delete(r.lru.byH, e.h)
		}
	}
}

// TestRecordOrderAgainstTouchingEveryPosition checks that Dispatched and
// Completed, which skip the touches that would not change the order (the
// lead of a prompt already at the front), leave every endpoint's entries
// in the order, with the confirmations and in-flight counts, that touching
// every position gives: over conversations that grow turn by turn, share
// system prompts and repeat, with failures, on endpoints small enough to
// evict (where the lead is not used) and large enough not to.
func TestRecordOrderAgainstTouchingEveryPosition(t *testing.T) {
	tests := []struct{ stride, capacity int }{
		{1, 1 << 20}, {4, 1 << 20}, {3, 200}, {1, 90}, {4, 100}, {2, 30},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("stride=%d/cap=%d", tc.stride, tc.capacity), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.stride), uint64(tc.capacity)))
			ix := newIndex(t, IndexConfig{Stride: tc.stride, DefaultCapacity: tc.capacity})
			eps := newEndpoints(3)
			refs := map[*signals.Endpoint]*touchRef{}
			for _, ep := range eps {
				refs[ep] = &touchRef{lru: newRefLRU(), cap: (tc.capacity + tc.stride - 1) / tc.stride}
			}
			systems := [][]uint64{chain(nil, 24, 1), chain(nil, 40, 2)}
			var convs [][]uint64 // conversations so far; each turn extends one
			type inflight struct {
				ep     *signals.Endpoint
				blocks []uint64
			}
			var open []inflight
			for step := 0; step < 1500; step++ {
				if len(open) > 0 && rng.IntN(2) == 0 {
					k := rng.IntN(len(open))
					f := open[k]
					open = slices.Delete(open, k, k+1)
					out := signals.Outcome{}
					ok := rng.IntN(5) != 0
					if !ok {
						out.Err = errors.New("refused")
					}
					ix.Completed(&signals.Request{PromptBlocks: f.blocks}, f.ep, out)
					refs[f.ep].completed(f.blocks, tc.stride, ok)
				} else {
					var blocks []uint64
					switch k := rng.IntN(len(convs) + 2); {
					case k < len(convs) && rng.IntN(3) == 0: // the same prompt again
						blocks = convs[k]
					case k < len(convs) && len(convs[k]) < 72: // the next turn
						convs[k] = chain(convs[k], 1+rng.IntN(12), uint64(step)+100)
						blocks = convs[k]
					case k < len(convs): // long enough: the same prompt
						blocks = convs[k]
					default: // a new conversation behind a system prompt
						sys := systems[rng.IntN(len(systems))]
						blocks = chain(sys[:1+rng.IntN(len(sys))], rng.IntN(20), uint64(step)+100)
						convs = append(convs, blocks)
					}
					ep := eps[rng.IntN(len(eps))]
					ix.Dispatched(&signals.Request{PromptBlocks: blocks}, ep)
					refs[ep].dispatched(blocks, tc.stride)
					open = append(open, inflight{ep, blocks})
				}
				total := 0
				for _, ep := range eps {
					ref := refs[ep]
					total += ref.lru.order.Len()
					st := ix.eps[ep]
					if st == nil {
						require.Zero(t, ref.lru.order.Len(), "step %d", step)
						continue
					}
					var want, got []refEntry
					for e := ref.lru.order.Front(); e != nil; e = e.Next() {
						want = append(want, *e.Value.(*refEntry))
					}
					st.lru.Each(func(h uint64) {
						i := st.lru.Find(h)
						got = append(got, refEntry{h: h, confirmed: st.lru.Confirmed(i), pending: st.lru.Pending(i)})
					})
					require.Equal(t, want, got, "step %d, %s: recency order, confirmations, counts", step, ep.Name)
				}
				require.Equal(t, total, ix.Stats().Entries, "step %d", step)
			}
		})
	}
}
