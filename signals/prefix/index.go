package prefix

import (
	"context"
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.opentelemetry.io/otel/metric"

	"github.com/inferroute/inferroute/signals"
)

// Index defaults.
const (
	// DefaultStride is the default spacing of indexed blocks: every 4th
	// block of a prompt (and its last block) is indexed, so matches are
	// resolved to 4 blocks (256 bytes, about 64 tokens) and the index costs a
	// quarter of the memory of indexing every block.
	DefaultStride = 4
	// DefaultCapacity is the capacity in blocks of an endpoint whose KV-cache
	// size is unknown: 32768 blocks of 16 tokens, 512K tokens, about what
	// vLLM allocates for an 8B model on an 80 GB GPU.
	DefaultCapacity = 32768
)

// IndexConfig configures an Index. The zero value means the defaults.
type IndexConfig struct {
	// Stride is the spacing of indexed blocks: blocks Stride-1, 2·Stride-1,
	// … and the last block of each prompt are recorded. 1 indexes every
	// block; 0 means DefaultStride.
	Stride int `json:"stride,omitempty" yaml:"stride,omitempty"`
	// DefaultCapacity is an endpoint's capacity in blocks when its scraped
	// metrics do not give its KV-cache size; 0 means DefaultCapacity.
	DefaultCapacity int `json:"defaultCapacity,omitempty" yaml:"defaultCapacity,omitempty"`
	// TokensPerBlock converts a scraped KV-cache capacity in tokens
	// (signals.Metrics.CapacityTokens) into blocks; it should be the
	// Hasher's TokenBlock. 0 means DefaultTokenBlock.
	TokensPerBlock int `json:"tokensPerBlock,omitempty" yaml:"tokensPerBlock,omitempty"`
	// Meter, if non-nil, receives the index's gauges (memory in bytes,
	// entries, distinct blocks, endpoints). Nil means no metrics.
	Meter metric.Meter `json:"-" yaml:"-"`
}

func (c IndexConfig) withDefaults() IndexConfig {
	if c.Stride <= 0 {
		c.Stride = DefaultStride
	}
	if c.DefaultCapacity <= 0 {
		c.DefaultCapacity = DefaultCapacity
	}
	if c.TokensPerBlock <= 0 {
		c.TokensPerBlock = DefaultTokenBlock
	}
	return c
}

// Compile-time interface guards.
var (
	_ signals.PrefixMatcher = (*Index)(nil)
	_ signals.Observer      = (*Index)(nil)
)

// Index is an approximate map of which endpoints hold which prompt
// prefixes in their KV cache. It implements signals.PrefixMatcher (Match)
// and signals.Observer (Dispatched, Completed); give it to the picker with
// picker.WithPrefixMatcher and it observes dispatches and outcomes by
// itself.
//
// Layout: every endpoint gets a small slot number; a hash table from block
// hash to the set of slots holding the block (up to three slots inline in
// the table's value, a bitset beyond); and per endpoint an LRU of the block
// hashes it holds, sized from the endpoint's scraped KV-cache capacity,
// whose evictions remove the slot from the block's set. Blocks are touched
// last to first, so an endpoint's LRU evicts the tail of a prompt before its
// head, as vLLM evicts a freed request's blocks tail first; with chained
// hashes this keeps what an endpoint holds of any prompt a leading prefix,
// and Match finds every candidate's prefix length by bisection over the
// prompt's blocks with one table lookup per probe, never walking the chain
// once per endpoint.
//
// Both tables are this package's own open-addressing arrays of 16-byte
// slots (lru.go, table.go), not Go maps and the
// github.com/hashicorp/golang-lru/v2 LRU that the first version used and
// the issue named: simplelru keeps a Go map entry and a 64-byte list element
// per entry, 155 bytes per (block, endpoint) entry in all, against a target
// of 64, where these tables take about 51 (BenchmarkIndexMemory), and an
// index holds millions of entries.
//
// Only every Stride-th block and the last block of a prompt are recorded
// (IndexConfig.Stride), so a match is resolved to Stride blocks.
//
// An Index is safe for concurrent use: Match takes a read lock and does not
// allocate; Dispatched, Completed and Forget take the write lock and cost
// O(blocks of the request) or O(entries of the endpoint).
type Index struct {
	cfg IndexConfig

	mu       sync.RWMutex
	eps      map[*signals.Endpoint]*epState
	bySlot   []*epState // slot → endpoint state, nil when free
	free     []int32    // free slots
	blocks   blockTable // block hash → holder set
	words    int        // words per bitset; slots < words·64
	sets     []uint64   // bitset slab: set k is sets[k·words : (k+1)·words]
	setFree  []uint32
	nsets    int     // bitsets in use
	lists    []int32 // list slab: list k is lists[k·listLen : (k+1)·listLen]
	listFree []uint32
	entries  int // (block, endpoint) entries
	epoch    uint64
	// version changes whenever an endpoint's state is created, dropped or
	// reset for a new generation, so that Match can reuse the endpoint →
	// slot resolution of its last call when it sees the same candidates.
	version atomic.Uint64

	scratch sync.Pool // *matchScratch
	reg     metric.Registration
}

// epState is one endpoint's part of the index.
type epState struct {
	ep   *signals.Endpoint
	slot int32
	gen  uint64 // ep.Generation() the entries were recorded at
	cap  int    // LRU capacity in entries
	mark uint64 // Retain's epoch
	// lru holds the endpoint's entries, each pending (recorded at dispatch)
	// or confirmed (a request using it completed).
	lru lruTable
}

// NewIndex returns an empty Index. It fails only when registering the
// gauges with cfg.Meter fails.
func NewIndex(cfg IndexConfig) (*Index, error) {
	ix := &Index{
		cfg:   cfg.withDefaults(),
		eps:   make(map[*signals.Endpoint]*epState),
		words: 1,
	}
	if cfg.Meter != nil {
		if err := ix.registerMetrics(cfg.Meter); err != nil {
			return nil, err
		}
	}
	return ix, nil
}

// Close unregisters the index's gauges. The index stays usable.
func (ix *Index) Close() error {
	if ix.reg != nil {
		return ix.reg.Unregister()
	}
	return nil
}

func (ix *Index) registerMetrics(m metric.Meter) error {
	mem, err1 := m.Int64ObservableGauge("inferroute.prefix.index.memory",
		metric.WithUnit("By"), metric.WithDescription("Estimated memory held by the prefix index."))
	ent, err2 := m.Int64ObservableGauge("inferroute.prefix.index.entries",
		metric.WithUnit("{entry}"), metric.WithDescription("(block, endpoint) entries in the prefix index."))
	blk, err3 := m.Int64ObservableGauge("inferroute.prefix.index.blocks",
		metric.WithUnit("{block}"), metric.WithDescription("Distinct block hashes in the prefix index."))
	eps, err4 := m.Int64ObservableGauge("inferroute.prefix.index.endpoints",
		metric.WithUnit("{endpoint}"), metric.WithDescription("Endpoints tracked by the prefix index."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := ix.Stats()
		o.ObserveInt64(mem, s.Bytes)
		o.ObserveInt64(ent, int64(s.Entries))
		o.ObserveInt64(blk, int64(s.Blocks))
		o.ObserveInt64(eps, int64(s.Endpoints))
		return nil
	}, mem, ent, blk, eps)
	if err != nil {
		return err
	}
	ix.reg = reg
	return nil
}

// IndexStats describes an Index's size.
type IndexStats struct {
	// Endpoints is the number of endpoints with state in the index.
	Endpoints int
	// Entries is the number of (block, endpoint) entries.
	Entries int
	// Blocks is the number of distinct block hashes.
	Blocks int
	// Bytes is the memory held by the index: the allocated sizes of its
	// tables and holder bitsets, counted slot by slot, plus an estimate of
	// endpointBytes per endpoint slot. BenchmarkIndexMemory checks it
	// against the Go heap.
	Bytes int64
}

// endpointBytes estimates the memory of one endpoint's bookkeeping apart
// from its LRU table's slots: its epState (96 bytes), its entry in the Go map
// from endpoint to state (two pointers and a control byte at the average
// load of a Go map, about 40 bytes) and its bySlot pointer.
const endpointBytes = 96 + 40 + 8

// Stats returns the index's current size. It takes the read lock and costs
// O(endpoints).
func (ix *Index) Stats() IndexStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := IndexStats{Endpoints: len(ix.eps), Entries: ix.entries, Blocks: ix.blocks.Len()}
	s.Bytes = ix.blocks.Bytes() + int64(cap(ix.sets))*8 + int64(cap(ix.lists))*4 +
		int64(len(ix.bySlot))*endpointBytes
	for _, st := range ix.eps {
		s.Bytes += st.lru.Bytes()
	}
	return s
}

// Entries returns the number of blocks recorded for ep, 0 when ep is unknown
// or its generation changed since they were recorded. It takes the read
// lock.
func (ix *Index) Entries(ep *signals.Endpoint) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := ix.eps[ep]
	if st == nil || st.gen != ep.Generation() {
		return 0
	}
	return st.lru.Len()
}

// MemoryBytes returns the memory held by the index (Stats().Bytes).
func (ix *Index) MemoryBytes() int64 { return ix.Stats().Bytes }

// positions calls f for the indexed positions of an n-block prompt, last to
// first: n-1, then every Stride-th block below it.
func (ix *Index) positions(n int, f func(p int)) {
	s := ix.cfg.Stride
	f(n - 1)
	for p := (n-1)/s*s - 1; p >= 0; p -= s {
		if p != n-1 {
			f(p)
		}
	}
}

// Dispatched records req's blocks on ep, pending confirmation, so that the
// next requests with the same prefix see the placement at once. It
// implements signals.Observer.
func (ix *Index) Dispatched(req *signals.Request, ep *signals.Endpoint) {
	hs := req.PromptBlocks
	if len(hs) == 0 || ep == nil {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := ix.stateLocked(ep)
	ix.positions(len(hs), func(p int) {
		h := hs[p]
		if i := st.lru.Find(h); i >= 0 {
			st.lru.Touch(i)
			return
		}
		ix.insertLocked(st, h, false)
	})
}

// Completed confirms req's blocks on ep when the endpoint processed the
// prompt (no error, or an error after the first token), re-adding any that
// were evicted meanwhile. When the request failed before its first token,
// the entries it added that no successful request confirmed are removed.
// A completion from an endpoint the index forgot, or from an earlier
// generation of it, changes nothing. It implements signals.Observer.
func (ix *Index) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	hs := req.PromptBlocks
	if len(hs) == 0 || ep == nil {
		return
	}
	ok := out.Err == nil || out.TTFT > 0
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := ix.eps[ep]
	if st == nil || st.gen != ep.Generation() {
		return // forgotten, restarted or down since: nothing to confirm
	}
	if !ok {
		ix.positions(len(hs), func(p int) {
			if i := st.lru.Find(hs[p]); i >= 0 && !st.lru.Confirmed(i) {
				st.lru.Remove(i)
				ix.removeHolder(hs[p], st.slot)
				ix.entries--
			}
		})
		return
	}
	ix.positions(len(hs), func(p int) {
		h := hs[p]
		if i := st.lru.Find(h); i >= 0 {
			st.lru.Confirm(i)
			st.lru.Touch(i)
			return
		}
		ix.insertLocked(st, h, true)
	})
}

// insertLocked records h, absent from st's LRU, as st's most recently used
// entry, evicting its least recently used entry first when st is full.
func (ix *Index) insertLocked(st *epState, h uint64, confirmed bool) {
	if st.lru.Len() >= st.cap {
		ix.evictLocked(st)
	}
	st.lru.Insert(h, confirmed, st.cap)
	ix.addHolder(h, st.slot)
	ix.entries++
}

// evictLocked removes st's least recently used entry: the endpoint no
// longer holds its block.
func (ix *Index) evictLocked(st *epState) {
	i := st.lru.Oldest()
	h := st.lru.Hash(i)
	st.lru.Remove(i)
	ix.removeHolder(h, st.slot)
	ix.entries--
}

// purgeLocked removes every entry of st.
func (ix *Index) purgeLocked(st *epState) {
	st.lru.Each(func(h uint64) { ix.removeHolder(h, st.slot) })
	ix.entries -= st.lru.Len()
	st.lru.Reset()
}

// stateLocked returns ep's state, creating it, dropping its entries when
// its generation changed and following its capacity. ix.mu must be held.
func (ix *Index) stateLocked(ep *signals.Endpoint) *epState {
	gen := ep.Generation()
	st := ix.eps[ep]
	if st == nil {
		st = &epState{ep: ep, gen: gen}
		st.slot = ix.allocSlot(st)
		st.cap = ix.capacity(ep)
		ix.eps[ep] = st
		ix.version.Add(1)
		return st
	}
	if st.gen != gen {
		ix.purgeLocked(st)
		st.gen = gen
		ix.version.Add(1)
	}
	if c := ix.capacity(ep); c != st.cap {
		for st.lru.Len() > c {
			ix.evictLocked(st)
		}
		st.cap = c
		st.lru.Shrink()
	}
	return st
}

// capacity returns ep's LRU capacity in entries.
func (ix *Index) capacity(ep *signals.Endpoint) int {
	blocks := ix.cfg.DefaultCapacity
	if t := ep.Metrics().CapacityTokens(); t > 0 {
		blocks = t / ix.cfg.TokensPerBlock
	}
	return max((blocks+ix.cfg.Stride-1)/ix.cfg.Stride, 1)
}

// Forget drops the given endpoints and all their entries, for endpoints
// that left the pool. Unknown endpoints are ignored.
func (ix *Index) Forget(eps ...*signals.Endpoint) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, ep := range eps {
		if st := ix.eps[ep]; st != nil {
			ix.dropLocked(st)
		}
	}
}

// Retain drops every endpoint not in keep, and the entries of kept
// endpoints whose generation changed (restarted or went down). Call it with
// the pool's endpoints whenever they change (the picker's SetEndpoints
// snapshot). keep is not retained.
func (ix *Index) Retain(keep []*signals.Endpoint) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.epoch++
	for _, ep := range keep {
		if st := ix.eps[ep]; st != nil {
			st.mark = ix.epoch
		}
	}
	for _, st := range ix.eps {
		switch {
		case st.mark != ix.epoch:
			ix.dropLocked(st)
		case st.gen != st.ep.Generation():
			ix.stateLocked(st.ep)
		}
	}
}

func (ix *Index) dropLocked(st *epState) {
	ix.purgeLocked(st)
	delete(ix.eps, st.ep)
	ix.version.Add(1)
	ix.bySlot[st.slot] = nil
	ix.free = append(ix.free, st.slot)
}

// allocSlot gives st a slot, growing the bitsets when the slots outgrow them.
func (ix *Index) allocSlot(st *epState) int32 {
	if n := len(ix.free); n > 0 {
		s := ix.free[n-1]
		ix.free = ix.free[:n-1]
		ix.bySlot[s] = st
		return s
	}
	s := int32(len(ix.bySlot))
	ix.bySlot = append(ix.bySlot, st)
	if need := (len(ix.bySlot) + 63) / 64; need > ix.words {
		ix.regrowSets(max(need, 2*ix.words))
	}
	return s
}

func (ix *Index) regrowSets(words int) {
	nsets := len(ix.sets) / ix.words
	grown := make([]uint64, nsets*words)
	for k := 0; k < nsets; k++ {
		copy(grown[k*words:], ix.sets[k*ix.words:(k+1)*ix.words])
	}
	ix.sets, ix.words = grown, words
}

// Holder sets, the values of ix.blocks, in three forms by size:
//   - inline (top bit clear): three 21-bit fields holding slot+1 (0 = empty);
//   - list (top bits 11): list k of ix.lists, listLen slot numbers (-1 =
//     empty), k in the low 32 bits;
//   - bitset (top bits 10): set k of ix.sets, k in the low 32 bits.
//
// A fourth holder moves a block to a list when bitsets are wider than a
// list (more than 256 endpoint slots), else to a bitset; a list that
// overflows becomes a bitset. Lists keep pools of a thousand endpoints, whose
// bitsets take 128 bytes, under 64 bytes per entry when prompts are shared
// by a few endpoints each. A set is never 0: blocks without holders are
// deleted.
const (
	fieldBits = 21
	fieldMask = 1<<fieldBits - 1
	bitsetTag = 1 << 63
	listTag   = 3 << 62
	tagMask   = 3 << 62
	listLen   = 8
)

func (ix *Index) set(k uint64) []uint64 {
	k &= 0xffffffff
	return ix.sets[int(k)*ix.words : (int(k)+1)*ix.words]
}

func (ix *Index) list(k uint64) []int32 {
	k &= 0xffffffff
	return ix.lists[int(k)*listLen : (int(k)+1)*listLen]
}

// newSet returns a free bitset, cleared, and its number.
func (ix *Index) newSet() (uint32, []uint64) {
	var k uint32
	if n := len(ix.setFree); n > 0 {
		k = ix.setFree[n-1]
		ix.setFree = ix.setFree[:n-1]
	} else {
		k = uint32(len(ix.sets) / ix.words)
		ix.sets = append(ix.sets, make([]uint64, ix.words)...)
	}
	ix.nsets++
	return k, ix.set(uint64(k))
}

// newList returns a free list, emptied, and its number.
func (ix *Index) newList() (uint32, []int32) {
	var k uint32
	if n := len(ix.listFree); n > 0 {
		k = ix.listFree[n-1]
		ix.listFree = ix.listFree[:n-1]
	} else {
		k = uint32(len(ix.lists) / listLen)
		ix.lists = append(ix.lists, make([]int32, listLen)...)
	}
	l := ix.list(uint64(k))
	for i := range l {
		l[i] = -1
	}
	return k, l
}

func (ix *Index) addHolder(h uint64, slot int32) {
	v := ix.blocks.Get(h)
	switch v & tagMask {
	case bitsetTag:
		ix.set(v)[slot>>6] |= 1 << (slot & 63)
		return
	case listTag:
		l := ix.list(v)
		for i, s := range l {
			switch s {
			case slot:
				return
			case -1:
				l[i] = slot
				return
			}
		}
		// The list is full: move it to a bitset.
		k, bs := ix.newSet()
		for _, s := range l {
			bs[s>>6] |= 1 << (s & 63)
		}
		bs[slot>>6] |= 1 << (slot & 63)
		ix.listFree = append(ix.listFree, uint32(v))
		ix.blocks.Put(h, bitsetTag|uint64(k))
		return
	}
	f := uint64(slot) + 1
	for i := 0; i < 3; i++ {
		switch (v >> (i * fieldBits)) & fieldMask {
		case f:
			return
		case 0:
			ix.blocks.Put(h, v|f<<(i*fieldBits))
			return
		}
	}
	// Three holders already: switch to a list or a bitset.
	if ix.words*8 > listLen*4 {
		k, l := ix.newList()
		for i := 0; i < 3; i++ {
			l[i] = int32((v>>(i*fieldBits))&fieldMask) - 1
		}
		l[3] = slot
		ix.blocks.Put(h, listTag|uint64(k))
		return
	}
	k, bs := ix.newSet()
	for i := 0; i < 3; i++ {
		s := (v>>(i*fieldBits))&fieldMask - 1
		bs[s>>6] |= 1 << (s & 63)
	}
	bs[slot>>6] |= 1 << (slot & 63)
	ix.blocks.Put(h, bitsetTag|uint64(k))
}

func (ix *Index) removeHolder(h uint64, slot int32) {
	v := ix.blocks.Get(h)
	switch v & tagMask {
	case 0, 1 << 62:
		if v == 0 {
			return
		}
	case bitsetTag:
		bs := ix.set(v)
		bs[slot>>6] &^= 1 << (slot & 63)
		for _, w := range bs {
			if w != 0 {
				return
			}
		}
		ix.setFree = append(ix.setFree, uint32(v))
		ix.nsets--
		ix.blocks.Delete(h)
		return
	case listTag:
		l := ix.list(v)
		left := 0
		for i, s := range l {
			if s == slot {
				l[i] = -1
			} else if s >= 0 {
				left++
			}
		}
		if left == 0 {
			ix.listFree = append(ix.listFree, uint32(v))
			ix.blocks.Delete(h)
		}
		return
	}
	f := uint64(slot) + 1
	for i := 0; i < 3; i++ {
		if (v>>(i*fieldBits))&fieldMask == f {
			v &^= fieldMask << (i * fieldBits)
		}
	}
	if v == 0 {
		ix.blocks.Delete(h)
	} else {
		ix.blocks.Put(h, v)
	}
}

// slotRef is what Match needs of a candidate endpoint in slot s: the
// endpoint, the generation its entries belong to and its position in the
// candidate list.
type slotRef struct {
	ep  *signals.Endpoint
	gen uint64
	pos int32
}

// dupRef is a candidate listed twice: position pos gets the result of
// position first.
type dupRef struct{ pos, first int32 }

// matchScratch is Match's reusable working memory.
type matchScratch struct {
	sets []uint64 // candidate bitsets, one of ix.words words per search depth

	// The resolution of the last candidate list, valid while the index's
	// version is ver: the list itself, the bitset of the slots it contains,
	// each such slot's slotRef, and the positions that repeat an endpoint.
	eps  []*signals.Endpoint
	cand []uint64
	ref  []slotRef
	dups []dupRef
	ver  uint64
}

// Match writes into out[i] the fraction of req.PromptBlocks that eps[i] is
// believed to hold as a leading prefix. Endpoints unknown to the index, or
// whose generation changed since their entries were recorded, hold nothing.
// It implements signals.PrefixMatcher: it does not allocate once warm, does
// not retain eps or out (it remembers the endpoint pointers of its last
// call to recognise the same pool next time), and is safe for concurrent
// use.
//
// Cost: clearing out and one table lookup, which settles a prompt whose
// first indexed block nobody holds; otherwise recognising the candidate
// list of the previous call with one memory comparison of the pointer
// arrays (a map lookup per endpoint when the list or the index's endpoints
// changed); then one
// hash-table lookup per probe of a bisection over the prompt's indexed
// positions, each probe splitting the undecided candidates with word-wide
// bitset operations (len(eps)/64 words); then a generation check and a
// store per endpoint that holds part of the prompt. Because hashes are
// chained and eviction is tail first, an endpoint that holds position p
// holds every position before it, so the holders of the last position are
// done after one lookup, those missing the first after one more, and the
// rest take O(d·log(blocks/Stride)) lookups for d distinct match lengths
// among them. Endpoints that hold nothing of the prompt cost nothing beyond
// the clearing and the comparison.
func (ix *Index) Match(req *signals.Request, eps []*signals.Endpoint, out []float64) {
	out = out[:len(eps)]
	clear(out)
	hs := req.PromptBlocks
	if len(hs) == 0 || len(eps) == 0 {
		return
	}
	probes := (len(hs) + ix.cfg.Stride - 1) / ix.cfg.Stride
	ix.mu.RLock()
	// Nobody holds a prompt whose first indexed block is unknown: answer
	// such a miss without looking at the candidates.
	if ix.blocks.Get(hs[ix.probe(0, probes, len(hs))]) == 0 {
		ix.mu.RUnlock()
		return
	}
	sc, _ := ix.scratch.Get().(*matchScratch)
	if sc == nil {
		sc = new(matchScratch)
	}
	sc.resolve(ix, eps)
	// search recurses at most once per halving of the probes.
	w := ix.words
	if need := (bits.Len(uint(probes)) + 3) * w; cap(sc.sets) < need {
		sc.sets = make([]uint64, need)
	}
	if copy(sc.sets[:w], sc.cand) > 0 && !isEmpty(sc.sets[:w]) {
		ix.match(hs, sc, out)
		for _, d := range sc.dups {
			out[d.pos] = out[d.first]
		}
	}
	ix.mu.RUnlock()
	ix.scratch.Put(sc)
}

// resolve makes sc's resolution that of eps, reusing the previous call's
// when the candidate list and the index's endpoints are unchanged (the
// usual case: a picker passes the same pool pick after pick). ix.mu must be
// read-locked.
func (sc *matchScratch) resolve(ix *Index, eps []*signals.Endpoint) {
	ver := ix.version.Load()
	if ver == sc.ver && len(sc.cand) == ix.words && sameEndpoints(eps, sc.eps) {
		return
	}
	sc.eps = append(sc.eps[:0], eps...)
	if cap(sc.cand) < ix.words {
		sc.cand = make([]uint64, ix.words)
	}
	sc.cand = sc.cand[:ix.words]
	clear(sc.cand)
	if n := len(ix.bySlot); cap(sc.ref) < n {
		sc.ref = make([]slotRef, n)
	}
	sc.ref = sc.ref[:len(ix.bySlot)]
	sc.dups = sc.dups[:0]
	for i, ep := range eps {
		st := ix.eps[ep]
		if st == nil {
			continue
		}
		s := st.slot
		if bit := uint64(1) << (s & 63); sc.cand[s>>6]&bit == 0 {
			sc.cand[s>>6] |= bit
			sc.ref[s] = slotRef{ep: ep, gen: st.gen, pos: int32(i)}
		} else {
			sc.dups = append(sc.dups, dupRef{pos: int32(i), first: sc.ref[s].pos})
		}
	}
	sc.ver = ver
}

// sameEndpoints reports whether a and b list the same endpoints in the same
// order. It compares the two pointer arrays as bytes, which the runtime
// does with vector instructions: for a pool of 1024 endpoints, 8 KB in
// tens of nanoseconds where a loop over the pointers takes hundreds. Only
// the bits of the pointers are read; b keeps its endpoints alive, so an
// address in it cannot be reused by another endpoint.
func sameEndpoints(a, b []*signals.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	n := len(a) * int(unsafe.Sizeof(a[0]))
	return string(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), n)) ==
		string(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), n))
}

// level returns the candidate bitset of search depth d.
func (sc *matchScratch) level(d, words int) []uint64 { return sc.sets[d*words : (d+1)*words] }

// match resolves every candidate's matched length and writes the fractions
// of those that match anything into out, which is zero. Probe j is the
// prompt's j-th indexed position: min((j+1)·Stride−1, n−1). The candidates
// are the bitset at depth 0.
func (ix *Index) match(hs []uint64, sc *matchScratch, out []float64) {
	n, w := len(hs), ix.words
	m := (n + ix.cfg.Stride - 1) / ix.cfg.Stride
	cand, held := sc.level(0, w), sc.level(1, w)
	// Holders of the last position hold the whole prompt.
	if ix.split(hs, m-1, m, cand, held) {
		assign(sc, held, 1, out)
	}
	// Those missing the first position hold nothing.
	if m == 1 || isEmpty(cand) || !ix.split(hs, 0, m, cand, held) {
		return
	}
	ix.search(hs, 1, m-1, m, 1, sc, out)
}

// probe returns the block index of probe j among m.
func (ix *Index) probe(j, m, n int) int {
	if j == m-1 {
		return n - 1
	}
	return (j+1)*ix.cfg.Stride - 1
}

// split moves the candidates in set that hold probe j into held (which it
// overwrites) and reports whether any did: O(words), plus one table lookup.
func (ix *Index) split(hs []uint64, j, m int, set, held []uint64) bool {
	clear(held)
	v := ix.blocks.Get(hs[ix.probe(j, m, len(hs))])
	if v == 0 {
		return false
	}
	found := false
	switch v & tagMask {
	case bitsetTag:
		bs := ix.set(v)
		var any uint64
		for i, c := range set {
			h := c & bs[i]
			held[i] = h
			set[i] = c &^ h
			any |= h
		}
		return any != 0
	case listTag:
		for _, s := range ix.list(v) {
			if s >= 0 && moveSlot(set, held, s) {
				found = true
			}
		}
		return found
	}
	for f := 0; f < 3; f++ {
		if s := int32((v>>(f*fieldBits))&fieldMask) - 1; s >= 0 && moveSlot(set, held, s) {
			found = true
		}
	}
	return found
}

// moveSlot moves slot s from set to held if it is in set, and reports
// whether it was.
func moveSlot(set, held []uint64, s int32) bool {
	bit := uint64(1) << (s & 63)
	if set[s>>6]&bit == 0 {
		return false
	}
	set[s>>6] &^= bit
	held[s>>6] |= bit
	return true
}

// assign writes frac for every candidate in set whose entries are of its
// endpoint's current generation (the others hold nothing, as out already
// says). The slice header of sc.ref is read once: reading it through sc
// after each store to out, which the compiler must assume may alias it,
// made this loop two to three times slower, and so did inlining it into
// its callers, whose live values crowd it out of registers.
//
//go:noinline
func assign(sc *matchScratch, set []uint64, frac float64, out []float64) {
	ref := sc.ref
	for w, x := range set {
		base := w << 6
		for ; x != 0; x &= x - 1 {
			r := &ref[base|bits.TrailingZeros64(x)]
			if r.ep.Generation() == r.gen {
				out[r.pos] = frac
			}
		}
	}
}

// search resolves the candidates in the bitset at depth d, which all hold
// probe lo−1 and none of which holds probe hi: each one's last held probe
// lies in [lo−1, hi).
func (ix *Index) search(hs []uint64, lo, hi, m, d int, sc *matchScratch, out []float64) {
	w := ix.words
	set, held := sc.level(d, w), sc.level(d+1, w)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ix.split(hs, mid, m, set, held) {
			// Holders of mid continue above it; the rest below it.
			ix.search(hs, mid+1, hi, m, d+1, sc, out)
		}
		hi = mid
		if isEmpty(set) {
			return
		}
	}
	matched := ix.probe(lo-1, m, len(hs)) + 1
	assign(sc, set, float64(matched)/float64(len(hs)), out)
}

func isEmpty(set []uint64) bool {
	for _, x := range set {
		if x != 0 {
			return false
		}
	}
	return true
}
