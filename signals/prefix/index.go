package prefix

import (
	"context"
	"errors"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
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
	// Attributes label every observation of the gauges. Indexes that
	// share a meter provider (one per pool in a gateway) must differ in
	// them, for example by attribute.String("pool", name): a gauge keeps
	// one value per attribute set, so indexes observed with the same set
	// overwrite one another and only the last one observed is exported.
	Attributes []attribute.KeyValue `json:"-" yaml:"-"`
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
// Two ways to read it. Lookup finds how much of a prompt every endpoint of
// the index holds and keeps it sparse in a caller-owned Matches, a few
// (fraction, bitset of endpoint slots) groups, at a cost of O(blocks of
// the prompt) that does not depend on the number of endpoints; Fill then
// writes the fractions of a candidate list into a dense slice, O(len of
// the list), and Fraction reads one endpoint's. Match, the
// signals.PrefixMatcher method, is Lookup followed by Fill.
//
// Layout: every endpoint gets a small slot number; a hash table from block
// hash to the set of slots holding the block (up to three slots inline in
// the table's value, a short list or a bitset beyond); and per endpoint an
// LRU of the block hashes it holds, sized from the endpoint's scraped
// KV-cache capacity, whose evictions remove the slot from the block's set.
// Blocks are touched last to first, so an endpoint's LRU evicts the tail
// of a prompt before its head, as vLLM evicts a freed request's blocks
// tail first; with chained hashes this keeps what an endpoint holds of any
// prompt a leading prefix, and Lookup finds every endpoint's prefix length
// at once by bisection over the prompt's blocks, one table lookup per probe
// splitting the undecided slots with word-wide bitset operations, never
// walking the chain once per endpoint.
//
// Restarts: an endpoint that restarted or went down (a new
// signals.Endpoint.Generation) holds nothing from then on. Lookup does not
// read generations: the index keeps the bitset of slots whose entries are
// current and re-validates it, once, when signals.RestartEpoch shows that
// some endpoint in the process started a new generation. The stale entries
// are dropped at the endpoint's next dispatch or by Retain.
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
// An Index is safe for concurrent use: Lookup and Match take the read lock
// and do not allocate once warm (the first Lookup after a restart anywhere
// takes the write lock once, O(endpoints)); Dispatched, Completed and
// Forget take the write lock and cost O(blocks of the request) or
// O(entries of the endpoint).
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
	nlists   int // lists in use
	entries  int // (block, endpoint) entries
	epoch    uint64
	// version changes whenever an endpoint's state is created, dropped or
	// reset for a new generation, so that a Matches can reuse the endpoint
	// → slot resolution of its last Fill when it sees the same candidates;
	// stamps[s] is the version at which slot s last changed hands or was
	// reset, so that Fill can tell which slots of an older Lookup still
	// belong to the same endpoint and generation.
	version atomic.Uint64
	stamps  []uint64
	// live is the bitset of the slots whose entries are of their
	// endpoint's current generation, as of signals.RestartEpoch() ==
	// checked: Lookup searches only these slots, so it never reads an
	// endpoint's generation. When the epoch moves on, the next Lookup
	// re-validates every slot once (revalidate).
	live    []uint64
	checked atomic.Uint64

	scratch sync.Pool // *Matches, for Match
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
	// or confirmed (a request using it completed), each with the number of
	// requests in flight that recorded it.
	lru lruTable
}

// NewIndex returns an empty Index. It fails only when registering the
// gauges with cfg.Meter fails.
func NewIndex(cfg IndexConfig) (*Index, error) {
	ix := &Index{
		cfg:   cfg.withDefaults(),
		eps:   make(map[*signals.Endpoint]*epState),
		words: 1,
		live:  make([]uint64, 1),
	}
	// No endpoint has state yet, so every slot is valid at today's epoch.
	ix.checked.Store(signals.RestartEpoch())
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
	// A copy: NewSet sorts its argument in place, and the slice is the caller's.
	attrs := metric.WithAttributeSet(attribute.NewSet(slices.Clone(ix.cfg.Attributes)...))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := ix.Stats()
		o.ObserveInt64(mem, s.Bytes, attrs)
		o.ObserveInt64(ent, int64(s.Entries), attrs)
		o.ObserveInt64(blk, int64(s.Blocks), attrs)
		o.ObserveInt64(eps, int64(s.Endpoints), attrs)
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
// load of a Go map, about 40 bytes), its bySlot pointer and its version
// stamp; its bit in the live bitset is left out.
const endpointBytes = 96 + 40 + 8 + 8

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
// next requests with the same prefix see the placement at once, and counts
// req in flight on each of them. It implements signals.Observer.
func (ix *Index) Dispatched(req *signals.Request, ep *signals.Endpoint) {
	hs := req.PromptBlocks
	if len(hs) == 0 || ep == nil {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := ix.stateLocked(ep)
	ix.recordLocked(st, hs, false)
}

// Completed ends req's part in the entries at its blocks on ep. When the
// endpoint processed the prompt (no error, or an error after the first
// token) it confirms them, re-adding any that were evicted meanwhile. When
// the request failed before its first token, it removes those of them that
// are unconfirmed and that no other request in flight recorded: every entry
// counts the requests that recorded it at dispatch and have not completed,
// so a failure does not take away the placement of another request with
// the same prefix. The count is per entry, not per request, so it is
// approximate in three cases: an entry that was evicted while req was in
// flight and then recorded again by another request is counted down by
// both; a count that reached 255 stays there, so its entry is kept; and a
// request dispatched before Forget or Retain dropped the endpoint and
// completed once it is back in the pool in the same generation counts
// down the entries that requests dispatched since recorded (its success
// rightly confirms its blocks: the same server process computed them).
//
// A completion from an endpoint the index forgot, or of a request
// dispatched to an earlier generation of it (out.Generation, which the
// picker sets, is not the endpoint's current one), changes nothing: a late
// success does not put the old request's prefix on the restarted server,
// and a late failure does not take away the placement of a request
// dispatched since. It implements signals.Observer.
func (ix *Index) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	hs := req.PromptBlocks
	if len(hs) == 0 || ep == nil {
		return
	}
	ok := out.Err == nil || out.TTFT > 0
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := ix.eps[ep]
	if st == nil || st.gen != ep.Generation() || out.Generation != st.gen {
		return // forgotten, restarted or down since: nothing to confirm
	}
	if !ok {
		ix.positions(len(hs), func(p int) {
			if i := st.lru.Find(hs[p]); i >= 0 && st.lru.DropPending(i) == 0 && !st.lru.Confirmed(i) {
				st.lru.Remove(i)
				ix.removeHolder(hs[p], st.slot)
				ix.entries--
			}
		})
		return
	}
	ix.recordLocked(st, hs, true)
}

// recordLocked brings the entries at the indexed positions of the prompt
// hs to the front of st's LRU in prompt order, its first position the most
// recently used, as if each were touched from the last position to the
// first. For a dispatch (done false) it counts the request in flight on
// each entry, inserted unconfirmed when absent; for a successful
// completion (done true) it counts it out and confirms each entry,
// inserted confirmed when absent.
//
// The result is always that of touching every position, but the touches
// that would not change the order are skipped. The positions that already
// lead the LRU in prompt order (the lead: all of them when the endpoint
// served the same prompt last, the conversation so far when it served the
// previous turn, the shared system prompt when it served another
// conversation behind it) stay where they are, found by walking
// the list from its front without a hash lookup, and the others are moved
// or inserted right behind the lead, last position first. This gives the
// same order as touching every position only if no entry of the lead is
// evicted meanwhile, so the lead is used only when st's capacity is at
// least twice the prompt's positions: the lead and the entries placed
// behind it, at most that many, are then never among the oldest entries
// that inserts evict. Block hashes are chained (signals.Request), so a
// prompt's positions are distinct; were two equal, the order would differ
// from the touched one but the list would stay well formed.
func (ix *Index) recordLocked(st *epState, hs []uint64, done bool) {
	n := len(hs)
	s := ix.cfg.Stride
	m := (n-1)/s + 1 // indexed positions: blocks s-1, 2s-1, … below n-1, and n-1
	lead, a := 0, -1 // positions in the lead; the slot of its last entry
	if st.cap >= 2*m {
		lead, a = st.lru.Lead(hs, s, done)
	}
	if lead == m {
		return
	}
	var ah uint64 // the hash of the lead's last entry, whose slot inserts can move
	if a >= 0 {
		ah = st.lru.Hash(a)
	}
	left := m - lead // the positions behind the lead, the first visited
	ix.positions(n, func(p int) {
		if left == 0 {
			return
		}
		left--
		h := hs[p]
		if i := st.lru.Find(h); i >= 0 {
			if done {
				st.lru.DropPending(i)
				st.lru.Confirm(i)
			} else {
				st.lru.AddPending(i)
			}
			st.lru.TouchAfter(i, a)
			return
		}
		pending := 1 // dispatched: in flight
		if done {
			pending = 0
		}
		i := ix.insertLocked(st, h, done, pending)
		if a >= 0 && !st.lru.Holds(a, ah) {
			a = st.lru.Find(ah) // moved by the eviction or the growth
		}
		st.lru.TouchAfter(i, a)
	})
}

// insertLocked records h, absent from st's LRU, as st's most recently used
// entry with the given confirmation and in-flight count, evicting its least
// recently used entry first when st is full, and returns its slot.
func (ix *Index) insertLocked(st *epState, h uint64, confirmed bool, pending int) int {
	if st.lru.Len() >= st.cap {
		ix.evictLocked(st)
	}
	i := st.lru.Insert(h, confirmed, pending, st.cap)
	ix.addHolder(h, st.slot)
	ix.entries++
	return i
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
		ix.slotChanged(st.slot, true)
		return st
	}
	if st.gen != gen {
		ix.purgeLocked(st)
		st.gen = gen
		ix.slotChanged(st.slot, true)
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

// capacity returns ep's LRU capacity in entries: its blocks divided by the
// stride, at least 1 and at most maxEntries (about 100 million, far above
// any real KV cache, so that a scraped capacity cannot overflow a table).
func (ix *Index) capacity(ep *signals.Endpoint) int {
	blocks := ix.cfg.DefaultCapacity
	if t := ep.Metrics().CapacityTokens(); t > 0 {
		blocks = t / ix.cfg.TokensPerBlock
	}
	n := blocks / ix.cfg.Stride
	if blocks%ix.cfg.Stride != 0 {
		n++
	}
	return min(max(n, 1), maxEntries)
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
	ix.slotChanged(st.slot, false)
	ix.bySlot[st.slot] = nil
	ix.free = append(ix.free, st.slot)
}

// slotChanged records that slot s changed hands or was reset: a new
// version, stamped on the slot, and the slot's live bit (set when it now
// holds entries of its endpoint's current generation). ix.mu must be held.
func (ix *Index) slotChanged(s int32, live bool) {
	ix.stamps[s] = ix.version.Add(1)
	if bit := uint64(1) << (s & 63); live {
		ix.live[s>>6] |= bit
	} else {
		ix.live[s>>6] &^= bit
	}
}

// revalidate clears the live bit of every slot whose endpoint started a new
// generation since its entries were recorded, and records the restart
// epoch it did so at. Lookup calls it when signals.RestartEpoch() moved
// on: O(endpoints) under the write lock, once per restart or outage of an
// endpoint anywhere in the process. The stale entries stay until the
// endpoint's next dispatch or Retain drops them, as before; they are
// invisible to Lookup meanwhile.
func (ix *Index) revalidate() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	// The epoch is read before the generations: Endpoint.newGeneration
	// advances a generation before the epoch, so every generation change
	// counted in e is seen below, and any later one moves the epoch past e.
	e := signals.RestartEpoch()
	if ix.checked.Load() == e {
		return // another Lookup did it
	}
	for s, st := range ix.bySlot {
		if st != nil && st.gen != st.ep.Generation() {
			ix.live[s>>6] &^= 1 << (s & 63)
		}
	}
	ix.checked.Store(e)
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
	ix.stamps = append(ix.stamps, 0)
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
	live := make([]uint64, words)
	copy(live, ix.live)
	ix.sets, ix.live, ix.words = grown, live, words
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
	ix.nlists++
	l := ix.list(uint64(k))
	for i := range l {
		l[i] = -1
	}
	return k, l
}

// freeSet returns bitset k to the free bitsets, and the slab's memory once
// no bitset is in use: the slab never moves a set, so it cannot shrink
// while any is, but an index whose shared blocks have all gone (its
// endpoints left or restarted) does not keep the slab of its busiest time.
func (ix *Index) freeSet(k uint32) {
	ix.nsets--
	if ix.nsets == 0 {
		ix.sets, ix.setFree = nil, nil
		return
	}
	ix.setFree = append(ix.setFree, k)
}

// freeList returns list k to the free lists, and the slab's memory once no
// list is in use, as freeSet.
func (ix *Index) freeList(k uint32) {
	ix.nlists--
	if ix.nlists == 0 {
		ix.lists, ix.listFree = nil, nil
		return
	}
	ix.listFree = append(ix.listFree, k)
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
		ix.freeList(uint32(v))
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
		ix.freeSet(uint32(v))
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
			ix.freeList(uint32(v))
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

// Matches is the outcome of Index.Lookup: which of the index's endpoint
// slots hold how much of a prompt. It is kept sparse, as a few groups, each
// a matched fraction and the bitset of the slots that hold exactly that
// fraction of the prompt; the groups are disjoint, in decreasing order of
// fraction, and slots in no group hold nothing. Read it with Fill (one
// fraction per endpoint of a candidate list) or Fraction (one endpoint).
//
// The zero value is ready to use. A Matches belongs to its caller and is
// not safe for concurrent use; reuse one (per goroutine) so that Lookup and
// Fill do not allocate once warm. It keeps its buffers and the resolution
// of the last candidate list Fill saw (which position of the list each of
// the index's slots is), reused while the list and the index's endpoints
// are unchanged; to recognise the list it keeps a copy of its endpoint
// pointers, which it keeps alive until it sees another list.
type Matches struct {
	ix    *Index
	ver   uint64    // ix.version at Lookup
	words int       // bitset width at Lookup
	fracs []float64 // group k's matched fraction
	sets  []uint64  // group k's slots: sets[k·words : (k+1)·words]
	work  []uint64  // the search's candidate bitsets, one per depth
	res   resolution
	mask  []uint64 // Fill's candidates when the index changed after Lookup
}

// resolution maps a candidate list onto the slots of an index at version
// ver: the bitset of the slots the list contains and how many, each such
// slot's first position in the list, the positions that repeat an
// endpoint, and the positions of endpoints the index has no state for.
type resolution struct {
	ix   *Index
	ver  uint64
	eps  []*signals.Endpoint
	cand []uint64
	n    int
	pos  []int32 // slot → position
	dups []dupRef
	none []int32
}

// dupRef is a candidate listed twice: position pos gets the result of
// position first.
type dupRef struct{ pos, first int32 }

// reset empties m for a lookup in ix.
func (m *Matches) reset(ix *Index) {
	m.ix = ix
	m.fracs = m.fracs[:0]
	m.sets = m.sets[:0]
}

// add appends a group: the slots in set hold frac of the prompt.
func (m *Matches) add(frac float64, set []uint64) {
	m.fracs = append(m.fracs, frac)
	m.sets = append(m.sets, set...)
}

// group returns group k's bitset.
func (m *Matches) group(k int) []uint64 { return m.sets[k*m.words : (k+1)*m.words] }

// level returns the search's candidate bitset at depth d.
func (m *Matches) level(d, words int) []uint64 { return m.work[d*words : (d+1)*words] }

// Lookup finds how much of req.PromptBlocks, as a leading prefix, each
// endpoint the index has state for is believed to hold, and stores it in
// m, replacing what m held. It takes no candidate list: Fill picks the
// candidates out afterwards. Endpoints whose generation changed (they
// restarted or went down) since their entries were recorded hold nothing.
// m does not refer to req afterwards.
//
// Cost: O(blocks of the prompt) at worst and independent of the number of
// endpoints apart from word-wide bitset operations, slots/64 words per
// step, and one bitset copy per distinct match length found. One table
// lookup settles a prompt whose first indexed block nobody holds;
// otherwise the holders of the last indexed block are settled after one
// lookup, those missing the first after one more, and the rest by
// bisection over the prompt's indexed positions, O(d·log(blocks/Stride))
// lookups for d distinct match lengths. Because hashes are chained and
// eviction is tail first, an endpoint that holds an indexed position holds
// every one before it, which is what makes bisection exact. The one
// exception is the approximate in-flight count (see Completed): a failed
// request whose entry was evicted and recorded again by another can
// remove an early position of a prompt whose later positions stay; such
// an endpoint's match may then be any of its held run lengths, and Match
// agrees with Lookup on it. Lookup reads
// no per-endpoint memory: it compares signals.RestartEpoch with the epoch
// at which the index last validated its endpoints' generations, and only
// on the first Lookup after an endpoint anywhere in the process restarted
// or went down does it re-validate every endpoint (O(endpoints), under the
// write lock).
//
// Lookup takes the read lock, does not allocate once m is warm, and is
// safe for concurrent use with every other method of the index (m itself
// must not be used concurrently).
func (ix *Index) Lookup(req *signals.Request, m *Matches) {
	m.reset(ix)
	hs := req.PromptBlocks
	if len(hs) == 0 {
		return
	}
	ix.validate()
	ix.mu.RLock()
	if ix.held(hs) {
		ix.searchLocked(hs, m)
	} else {
		m.ver, m.words = ix.version.Load(), ix.words
	}
	ix.mu.RUnlock()
}

// validate re-validates the slots' generations if an endpoint anywhere
// started a new generation since the last validation.
func (ix *Index) validate() {
	if signals.RestartEpoch() != ix.checked.Load() {
		ix.revalidate()
	}
}

// held reports whether anyone holds the first indexed block of hs: nobody
// holds any of a prompt whose first indexed block is unknown. ix.mu must
// be read-locked.
func (ix *Index) held(hs []uint64) bool {
	probes := (len(hs) + ix.cfg.Stride - 1) / ix.cfg.Stride
	return ix.blocks.Get(hs[ix.probe(0, probes, len(hs))]) != 0
}

// searchLocked fills the empty m with the matches of hs among the live
// slots. ix.mu must be read-locked.
func (ix *Index) searchLocked(hs []uint64, m *Matches) {
	w := ix.words
	m.ver, m.words = ix.version.Load(), w
	probes := (len(hs) + ix.cfg.Stride - 1) / ix.cfg.Stride
	// search recurses at most once per halving of the probes.
	if need := (bits.Len(uint(probes)) + 3) * w; cap(m.work) < need {
		m.work = make([]uint64, need)
	}
	m.work = m.work[:cap(m.work)]
	if copy(m.work[:w], ix.live) > 0 && !isEmpty(m.work[:w]) {
		ix.match(hs, m)
	}
}

// Match writes into out[i] the fraction of req.PromptBlocks that eps[i] is
// believed to hold as a leading prefix. Endpoints unknown to the index, or
// whose generation changed since their entries were recorded, hold nothing.
// It implements signals.PrefixMatcher: it is Lookup followed by Fill with a
// Matches of the index's own, taken from a sync.Pool only when someone
// holds the prompt's first indexed block. It does not allocate once warm,
// does not retain eps or out (the pooled Matches remembers the endpoint
// pointers of its last list to recognise the same pool next time), and is
// safe for concurrent use.
//
// Cost: Lookup's, which does not depend on the candidates, plus Fill's,
// O(len(eps)) for writing out; a prompt whose first indexed block nobody
// holds costs one table lookup and the clearing of out. A caller that
// needs the fractions of only a few endpoints, or whose pool is large,
// does better with Lookup and Fraction, or Fill over the endpoints it
// needs.
func (ix *Index) Match(req *signals.Request, eps []*signals.Endpoint, out []float64) {
	out = out[:len(eps)]
	hs := req.PromptBlocks
	if len(hs) == 0 || len(eps) == 0 {
		clear(out)
		return
	}
	ix.validate()
	ix.mu.RLock()
	if !ix.held(hs) {
		ix.mu.RUnlock()
		clear(out)
		return
	}
	m, _ := ix.scratch.Get().(*Matches)
	if m == nil {
		m = new(Matches)
	}
	m.reset(ix)
	ix.searchLocked(hs, m)
	ix.mu.RUnlock()
	m.Fill(eps, out)
	ix.scratch.Put(m)
}

// Fill writes into out[i] the fraction of the looked-up prompt that eps[i]
// holds: 0 for endpoints the index has no state for, for those that hold
// none of it, and for those whose state in the index was created, dropped
// or reset for a new generation between Lookup and Fill (an endpoint that
// restarts after Lookup keeps the fraction Lookup saw). A Matches never
// looked up fills zeros. out must be at least as long as eps; neither is
// retained (m keeps a copy of the endpoint pointers, see Matches).
//
// Cost: recognising the candidate list of the previous Fill, one memory
// comparison of the two pointer arrays (else, or when the index's
// endpoints changed since Lookup, the read lock and a map lookup per
// candidate); one pass that writes every element of out with the fraction
// most candidates share (0, or the largest group's); then one store per
// candidate outside that group. It reads no per-endpoint memory and does
// not allocate once warm.
func (m *Matches) Fill(eps []*signals.Endpoint, out []float64) {
	out = out[:len(eps)]
	if len(m.fracs) == 0 || len(eps) == 0 {
		clear(out)
		return
	}
	r := &m.res
	cand := r.cand
	if r.ix != m.ix || r.ver != m.ix.version.Load() || r.ver != m.ver || !sameEndpoints(eps, r.eps) {
		cand = m.resolve(eps)
	}
	w := min(m.words, len(cand))
	cand = cand[:w]
	// The background: the group holding the most candidates, when it
	// holds more than the positions that get 0 (candidates in no group and
	// endpoints unknown to the index); else 0. Only with the resolution's
	// own candidate set, so that every candidate outside the groups is
	// written below.
	bg, bgk := 0.0, -1
	if len(cand) == len(r.cand) && &cand[0] == &r.cand[0] {
		best, covered := 0, 0
		for k := range m.fracs {
			c := countAnd(m.group(k)[:w], cand)
			covered += c
			if c > best {
				best, bgk = c, k
			}
		}
		if zeros := r.n - covered + len(r.none); best > zeros {
			bg = m.fracs[bgk]
		} else {
			bgk = -1
		}
	}
	if bg == 0 {
		clear(out)
	} else {
		fill(out, bg)
		// Candidates in no group, and unknown endpoints, hold nothing.
		scatterZeros(r.pos, cand, m.sets, m.words, out)
		for _, p := range r.none {
			out[p] = 0
		}
	}
	for k, f := range m.fracs {
		if k != bgk {
			scatter(r.pos, m.group(k)[:w], cand, f, out)
		}
	}
	for _, d := range r.dups {
		out[d.pos] = out[d.first]
	}
}

// resolve makes m's resolution that of eps at the index's current version,
// reusing it if it is, and returns the candidate slots whose fractions m
// knows: all of them when the index's endpoints are those of Lookup, else
// only the slots that still belong to the endpoint, and generation, they
// had at Lookup.
func (m *Matches) resolve(eps []*signals.Endpoint) []uint64 {
	ix, r := m.ix, &m.res
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if r.ix != ix || r.ver != ix.version.Load() || !sameEndpoints(eps, r.eps) {
		r.build(ix, eps)
	}
	if r.ver == m.ver {
		return r.cand
	}
	w := min(len(r.cand), m.words)
	m.mask = append(m.mask[:0], r.cand[:w]...)
	for i, x := range m.mask {
		for ; x != 0; x &= x - 1 {
			if s := i<<6 | bits.TrailingZeros64(x); ix.stamps[s] > m.ver {
				m.mask[i] &^= 1 << (s & 63)
			}
		}
	}
	return m.mask
}

// build resolves eps against ix. ix.mu must be read-locked.
func (r *resolution) build(ix *Index, eps []*signals.Endpoint) {
	r.ix, r.ver = ix, ix.version.Load()
	clear(r.eps[min(len(eps), len(r.eps)):]) // do not keep departed endpoints alive
	r.eps = append(r.eps[:0], eps...)
	w := ix.words
	if cap(r.cand) < w {
		r.cand = make([]uint64, w)
	}
	r.cand = r.cand[:w]
	clear(r.cand)
	if n := len(ix.bySlot); cap(r.pos) < n {
		r.pos = make([]int32, n)
	}
	r.pos = r.pos[:len(ix.bySlot)]
	r.n, r.dups, r.none = 0, r.dups[:0], r.none[:0]
	for i, ep := range eps {
		st := ix.eps[ep]
		if st == nil {
			r.none = append(r.none, int32(i))
			continue
		}
		s := st.slot
		if bit := uint64(1) << (s & 63); r.cand[s>>6]&bit == 0 {
			r.cand[s>>6] |= bit
			r.pos[s] = int32(i)
			r.n++
		} else {
			r.dups = append(r.dups, dupRef{pos: int32(i), first: r.pos[s]})
		}
	}
}

// Fraction returns the fraction of the looked-up prompt that ep holds, as
// Fill would report it: 0 when m was never looked up, when the index has
// no state for ep or ep holds none of the prompt, and when ep's state was
// created, dropped or reset between Lookup and Fraction. It takes the
// index's read lock for one map lookup, then costs O(groups).
func (m *Matches) Fraction(ep *signals.Endpoint) float64 {
	if len(m.fracs) == 0 {
		return 0
	}
	ix := m.ix
	ix.mu.RLock()
	s := int32(-1)
	if st := ix.eps[ep]; st != nil && ix.stamps[st.slot] <= m.ver {
		s = st.slot
	}
	ix.mu.RUnlock()
	if s < 0 || int(s>>6) >= m.words {
		return 0
	}
	for k, f := range m.fracs {
		if m.group(k)[s>>6]&(1<<(s&63)) != 0 {
			return f
		}
	}
	return 0
}

// countAnd returns the number of bits set in both a and b.
func countAnd(a, b []uint64) int {
	n := 0
	for i, x := range a {
		n += bits.OnesCount64(x & b[i])
	}
	return n
}

// fill sets every element of out to v: the first 32 one by one, the rest
// by doubling copies, which the runtime does with vector moves.
func fill(out []float64, v float64) {
	n := min(len(out), 32)
	for i := range out[:n] {
		out[i] = v
	}
	for ; n < len(out); n *= 2 {
		copy(out[n:], out[:n])
	}
}

// scatter writes v at the positions of the slots in set ∩ cand.
func scatter(pos []int32, set, cand []uint64, v float64, out []float64) {
	cand = cand[:len(set)]
	for i, x := range set {
		x &= cand[i]
		base := i << 6
		for ; x != 0; x &= x - 1 {
			out[pos[base|bits.TrailingZeros64(x)]] = v
		}
	}
}

// scatterZeros writes 0 at the positions of the slots of cand in none of
// the groups in sets (words words each).
func scatterZeros(pos []int32, cand, sets []uint64, words int, out []float64) {
	for i, x := range cand {
		for k := i; k < len(sets); k += words {
			x &^= sets[k]
		}
		base := i << 6
		for ; x != 0; x &= x - 1 {
			out[pos[base|bits.TrailingZeros64(x)]] = 0
		}
	}
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

// match resolves the matched length of every slot in the search's
// depth-0 bitset and adds a group to m for each distinct length. Probe j is
// the prompt's j-th indexed position: min((j+1)·Stride−1, n−1).
func (ix *Index) match(hs []uint64, m *Matches) {
	n, w := len(hs), ix.words
	p := (n + ix.cfg.Stride - 1) / ix.cfg.Stride
	cand, held := m.level(0, w), m.level(1, w)
	// Holders of the last position hold the whole prompt.
	if ix.split(hs, p-1, p, cand, held) {
		m.add(1, held)
	}
	// Those missing the first position hold nothing.
	if p == 1 || isEmpty(cand) || !ix.split(hs, 0, p, cand, held) {
		return
	}
	ix.search(hs, 1, p-1, p, 1, m)
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

// search resolves the slots in the bitset at depth d, which all hold probe
// lo−1 and none of which holds probe hi: each one's last held probe lies in
// [lo−1, hi). Groups are added longest match first.
func (ix *Index) search(hs []uint64, lo, hi, p, d int, m *Matches) {
	w := ix.words
	set, held := m.level(d, w), m.level(d+1, w)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ix.split(hs, mid, p, set, held) {
			// Holders of mid continue above it; the rest below it.
			ix.search(hs, mid+1, hi, p, d+1, m)
		}
		hi = mid
		if isEmpty(set) {
			return
		}
	}
	matched := ix.probe(lo-1, p, len(hs)) + 1
	m.add(float64(matched)/float64(len(hs)), set)
}

func isEmpty(set []uint64) bool {
	for _, x := range set {
		if x != 0 {
			return false
		}
	}
	return true
}
