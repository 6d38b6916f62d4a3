package engine

import (
	"math/bits"
	"slices"
)

// This file is the paged KV cache with automatic prefix caching, after
// vLLM V1's KV cache manager (vllm/v1/core/kv_cache_manager.py,
// vllm/v1/core/block_pool.py, vllm/v1/core/kv_cache_utils.py):
//
//   - blocks are reference counted; a block no request references sits in
//     the free queue (vLLM's FreeKVCacheBlockQueue, a doubly linked list;
//     here an equivalent ring, see blockPool) and keeps its cached content
//     until it is reused, so it can still be hit;
//   - a new block is taken from the head of the free queue (the least
//     recently freed), evicting its prefix-cache entry;
//   - a request's blocks are freed in reverse order, so that its tail
//     blocks (least likely to be shared) are evicted first;
//   - a full block is identified by a hash chain: the hash of its parent
//     block, its tokens and extra keys such as the LoRA adapter
//     (kv_cache_utils.hash_block_tokens).
//
// vLLM finds a cached block through a map from block hash to the blocks
// holding it. Here a hash has at most one holder: a block whose content
// another block already holds stays an uncached duplicate, where vLLM
// registers every copy (its block pool does not de-duplicate). The two
// differ only after the registered copy is evicted while a duplicate still
// holds the content: vLLM then still hits, this cache recomputes. Apart
// from that the map's contents are the same here, but most blocks are indexed
// through their parent instead of a global table: a block whose hash
// chains from the hash held by block P is found as P's child (P.next),
// and only chain roots, second children (branches) and children whose
// parent was evicted go into the hash table. A lookup walks the chain
// from the root, so it always knows the parent's block. Registering the
// private tail of a prompt then touches only the block and its parent,
// which the request has just used, instead of a random table slot per
// block; the table stays small. This is the index of a radix tree over
// blocks (as in SGLang's RadixAttention, Zheng et al., "SGLang: Efficient
// Execution of Structured Language Model Programs", NeurIPS 2024), with
// vLLM's flat semantics: a hash is found exactly when some block holds it.

// blockPool is the set of KV blocks, their reference counts, the free
// queue and the prefix-cache table. A block's fields fit in 16 bytes so
// that touching a block costs at most one cache miss: the simulator is
// memory-bound on block bookkeeping.
//
// The free order is: the never-used blocks [fresh, numBlocks) in id order
// (vLLM's initial free queue), then the freed blocks, least recently freed
// first. vLLM keeps the freed blocks in a doubly linked list so that a
// prefix hit can take a block out of the middle; here they sit in a ring
// of (block, generation) entries in the order they were freed, and an
// entry is valid only while its block is unreferenced and has not been
// freed again since. Taking a block then walks an array instead of chasing
// list pointers, so the cache misses of consecutive takes overlap; the
// order is the same as the linked list's.
type blockPool struct {
	numBlocks int
	numFree   int   // never-used blocks plus unreferenced used blocks
	fresh     int32 // first never-used block
	hashed    int   // blocks whose content is registered
	b         []block
	// ring[head..tail) (positions mod len(ring)) are the freed blocks.
	ring       []freeEntry
	head, tail uint64
	table      hashTable
	// filter has bit (h>>filterShift)&filterMask set for every hash h
	// inserted in the table with a parent (a branch or an orphan) since
	// the last rebuild, and for every entry a rebuild kept. A linked
	// registration checks the table for a live holder only when its bit
	// is set: a block holding a non-root hash is either its parent's
	// child or a table entry with its bit set.
	filter []uint64
	// filterBits counts the bits set in filter: with none, which is the
	// rule when prompts share no prefix, registration skips the filter.
	filterBits int
	// promotions counts children moved into the table when their parent
	// was evicted, for tests.
	promotions int
}

// A block's fields fit in 24 bytes. Links are block ids plus one; 0 is
// none. A cached block is indexed either by the table (prev == 0) or as
// the child of the block holding its parent hash (prev = that block,
// whose next is this block); the links are set and cleared in pairs.
type block struct {
	hash uint64 // content hash; 0 when the block holds no cached content
	gen  uint32 // incremented each time the block is freed
	ref  int32
	prev int32 // parent block, when indexed as its child
	next int32 // the child indexed through this block
}

// noBlock is the link and parent value meaning "no block".
const noBlock int32 = 0

type freeEntry struct {
	id  int32
	gen uint32
}

// maxBlocks bounds NumBlocks: table entries keep a block id in idBits bits.
const maxBlocks = 1<<idBits - 2

func (p *blockPool) init(n int) {
	if p.numBlocks != n || p.b == nil {
		p.numBlocks = n
		p.b = make([]block, n)
	} else {
		clear(p.b)
	}
	if p.ring == nil {
		p.ring = make([]freeEntry, 1024)
	}
	p.head, p.tail = 0, 0
	p.fresh = 0
	p.numFree = n
	p.hashed = 0
	p.promotions = 0
	p.table.init(n)
	words := max(64, nextPow2(2*n)/64)
	if len(p.filter) == words {
		clear(p.filter)
	} else {
		p.filter = make([]uint64, words)
	}
	p.filterBits = 0
}

// nextPow2 returns the smallest power of two >= n (1 for n <= 1).
func nextPow2(n int) int {
	m := 1
	for m < n {
		m <<= 1
	}
	return m
}

// filterShift selects the hash bits of the filter: bits above those of a
// table slot index for the tables of realistic sizes.
const filterShift = 40

func (p *blockPool) filterBit(h uint64) (word int, bit uint64) {
	i := (h >> filterShift) & uint64(len(p.filter)*64-1)
	return int(i >> 6), 1 << (i & 63)
}

func (p *blockPool) filterAdd(h uint64) {
	w, bit := p.filterBit(h)
	if p.filter[w]&bit == 0 {
		p.filter[w] |= bit
		p.filterBits++
	}
}

func (p *blockPool) filterHas(h uint64) bool {
	if p.filterBits == 0 {
		return false
	}
	w, bit := p.filterBit(h)
	return p.filter[w]&bit != 0
}

// take removes the first block in free order, evicts its cached content,
// and returns it with reference count 1. The caller has checked
// numFree > 0. The table entry of evicted content is left in place and is
// recognised as stale by lookups (the block no longer holds that hash).
func (p *blockPool) take() int32 {
	var id int32
	if int(p.fresh) < p.numBlocks {
		id = p.fresh
		p.fresh++
	} else {
		mask := uint64(len(p.ring) - 1)
		for {
			e := p.ring[p.head&mask]
			p.head++
			if b := &p.b[e.id]; b.ref == 0 && b.gen == e.gen {
				id = e.id
				break
			}
		}
	}
	p.numFree--
	b := &p.b[id]
	if b.hash != 0 {
		p.evict(id)
	}
	b.ref = 1
	return id
}

// evict drops the cached content of block id. Its link from a parent is
// cleared; a child indexed through it goes into the table (its content
// is still cached, and must stay findable once the parent hash is cached
// again). A table entry is left in place and is recognised as stale by
// lookups (the block no longer holds that hash).
func (p *blockPool) evict(id int32) {
	b := &p.b[id]
	if b.prev != noBlock {
		p.b[b.prev-1].next = noBlock
		b.prev = noBlock
	}
	if b.next != noBlock {
		c := b.next - 1
		b.next = noBlock
		cb := &p.b[c]
		cb.prev = noBlock
		p.insert(c, cb.hash, true)
		p.promotions++
	}
	b.hash = 0
	p.hashed--
}

// touch adds a reference to a cached block, taking it out of the free
// order if no request referenced it (its ring entry becomes invalid).
func (p *blockPool) touch(id int32) {
	b := &p.b[id]
	if b.ref == 0 {
		p.numFree--
	}
	b.ref++
}

// release drops a reference; an unreferenced block goes to the tail of the
// free order, still cached.
func (p *blockPool) release(id int32) {
	b := &p.b[id]
	b.ref--
	if b.ref != 0 {
		return
	}
	if p.tail-p.head == uint64(len(p.ring)) {
		p.compactRing()
	}
	b.gen++
	p.ring[p.tail&uint64(len(p.ring)-1)] = freeEntry{id: id, gen: b.gen}
	p.tail++
	p.numFree++
}

// compactRing drops the invalid entries of a full ring, keeping the order
// of the valid ones, and doubles the ring if that frees less than half of
// it (valid entries never exceed numBlocks, so the ring stops growing at
// 2·numBlocks). It allocates only while the ring grows.
func (p *blockPool) compactRing() {
	mask := uint64(len(p.ring) - 1)
	w := p.head
	for r := p.head; r < p.tail; r++ {
		e := p.ring[r&mask]
		if b := &p.b[e.id]; b.ref == 0 && b.gen == e.gen {
			p.ring[w&mask] = e
			w++
		}
	}
	p.tail = w
	if n := p.tail - p.head; 2*n > uint64(len(p.ring)) {
		grown := make([]freeEntry, 2*len(p.ring))
		for i := range n {
			grown[i] = p.ring[(p.head+i)&mask]
		}
		p.ring, p.head, p.tail = grown, 0, n
	}
}

// lookup returns the block holding the content with hash h. parent is
// the block holding the hash h chains from, plus one, or noBlock for a
// root hash or a parent hash no block holds.
func (p *blockPool) lookup(h uint64, parent int32) (int32, bool) {
	if parent != noBlock {
		if c := p.b[parent-1].next; c != noBlock && p.b[c-1].hash == h {
			return c - 1, true
		}
	}
	return p.lookupTable(h)
}

// lookupTable returns the block the table maps h to, if it holds h.
func (p *blockPool) lookupTable(h uint64) (int32, bool) {
	t := &p.table
	k := h &^ idMask
	for i := (h >> idBits) & t.mask; ; i = (i + 1) & t.mask {
		v := t.e[i]
		if v == 0 {
			return 0, false
		}
		if v&^idMask == k {
			id := int32(v&idMask) - 1
			if p.b[id].hash == h {
				return id, true
			}
			return 0, false // stale: the content was evicted
		}
	}
}

// register records block id as holding the content with hash h (never
// 0: hashPrompt sees to it), unless another block already holds it
// (then id stays an uncached duplicate), and returns the block that holds
// h afterwards, plus one. parent is the block holding the hash h chains
// from, plus one, or noBlock for a root hash (nonRoot false) or for a
// parent hash no block holds (nonRoot true). Registering h as the first
// child of parent touches only the two blocks.
func (p *blockPool) register(id int32, h uint64, parent int32, nonRoot bool) int32 {
	b := &p.b[id]
	if b.hash != 0 {
		return id + 1
	}
	if parent != noBlock {
		pb := &p.b[parent-1]
		if c := pb.next; c != noBlock {
			if p.b[c-1].hash == h {
				return c // live duplicate: keep the block already cached
			}
		} else if !p.filterHas(h) {
			pb.next = id + 1
			b.prev = parent
			b.hash = h
			p.hashed++
			return id + 1
		}
	}
	if dup, ok := p.lookupTable(h); ok {
		return dup + 1 // live duplicate
	}
	p.insert(id, h, nonRoot)
	b.hash = h
	p.hashed++
	return id + 1
}

// insert puts block id, which holds or is about to hold h and has no live
// duplicate in the table, into the table, and into the filter if h is not
// a root hash.
func (p *blockPool) insert(id int32, h uint64, nonRoot bool) {
	t := &p.table
	if t.used >= t.limit {
		p.rebuild()
	}
	if nonRoot {
		p.filterAdd(h)
	}
	k := h &^ idMask
	for i := (h >> idBits) & t.mask; ; i = (i + 1) & t.mask {
		v := t.e[i]
		if v == 0 {
			t.e[i] = k | uint64(id+1)
			t.used++
			return
		}
		if v&^idMask == k {
			t.e[i] = k | uint64(id+1) // replace a stale entry
			return
		}
	}
}

// rebuild drops the stale entries by re-inserting the cached blocks that
// are not indexed as a child (found by a sequential scan of the blocks
// ever used) into a cleared table, doubling it first while that would
// leave it more than a quarter full, and rebuilds the filter from them. It
// allocates only while the table grows.
func (p *blockPool) rebuild() {
	t := &p.table
	heads := 0
	for id := range p.fresh {
		if b := &p.b[id]; b.hash != 0 && b.prev == noBlock {
			heads++
		}
	}
	size := len(t.e)
	for 4*heads > size && size < t.maxLen {
		size *= 2
	}
	if size != len(t.e) {
		t.e = make([]uint64, size)
		t.mask = uint64(size - 1)
		t.limit = size / 2
	} else {
		clear(t.e)
	}
	t.used = 0
	t.rebuilds++
	clear(p.filter)
	p.filterBits = 0
	for id := range p.fresh {
		b := &p.b[id]
		if b.hash == 0 || b.prev != noBlock {
			continue
		}
		p.filterAdd(b.hash)
		k := b.hash &^ idMask
		for i := (b.hash >> idBits) & t.mask; ; i = (i + 1) & t.mask {
			if t.e[i] == 0 {
				t.e[i] = k | uint64(id+1)
				t.used++
				break
			}
			if t.e[i]&^idMask == k {
				break // two hashes equal in their top bits: keep one
			}
		}
	}
}

// hashTable maps block hashes to block ids with open addressing and
// linear probing, in 8-byte entries: the hash's top 64-idBits bits and
// the block id plus one (0 is an empty slot). Entries are never deleted:
// an entry whose block no longer holds the hash is stale, and rebuild
// drops stale entries when the table is half full. This keeps evicting a
// block free of table work (one cache miss less per block), and stepping
// free of allocation once the table has grown (a Go map may reallocate to
// clear deleted entries).
type hashTable struct {
	e      []uint64
	mask   uint64
	used   int // non-empty slots
	limit  int // rebuild when used reaches it
	maxLen int // the table grows up to 4·numBlocks rounded up to a power of 2
	// rebuilds counts rebuilds, for tests.
	rebuilds int
}

const (
	idBits = 25
	idMask = 1<<idBits - 1
)

func (t *hashTable) init(n int) {
	t.maxLen = 1024
	for t.maxLen < 4*n {
		t.maxLen <<= 1
	}
	size := max(1024, t.maxLen/8)
	if len(t.e) == size {
		clear(t.e)
	} else {
		t.e = make([]uint64, size)
	}
	t.mask = uint64(size - 1)
	t.used = 0
	t.limit = size / 2
}

// mix64 is the SplitMix64 finalizer (Steele, Lea, Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014), used to chain block
// hashes.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// chain extends hash h with value x: one SplitMix64 round over the
// rotated parent hash xor the golden-ratio-scaled value.
func chain(h, x uint64) uint64 {
	return mix64(bits.RotateLeft64(h, 23) ^ (x * 0x9e3779b97f4a7c15))
}

// blockKey combines a content-block id and a KV block's token offset in it.
func blockKey(id uint64, off int) uint64 { return id ^ uint64(off)*0xd6e8feb86659fd93 }

// adapterSeed mixes a LoRA adapter name into the root of the hash chain
// (FNV-1a over the name), so equal text under different adapters never
// shares blocks, as vLLM's extra keys do.
func adapterSeed(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return mix64(h)
}

// hashPrompt fills s.hashes with the hash chain of the full KV blocks of
// the prompt that lie inside its content blocks. KV block j covers tokens
// [j·bs, (j+1)·bs); its hash chains the previous hash with the ids of the
// content blocks it overlaps and its offset in the first of them, so it
// identifies the whole prefix up to it (and, through the root, the
// adapter), as vLLM's hash_block_tokens does with token ids.
//
// A Request's own PromptHashes stand in for the chain when they fit (see
// Request.PromptHashes); s.hashes then shares their array.
func (e *Engine) hashPrompt(s *seq) {
	s.hashes = nil
	s.numHashes = 0
	if !e.cfg.EnablePrefixCaching {
		return
	}
	r := s.req
	bt := r.BlockTokens
	if bt <= 0 {
		bt = e.blockSize
	}
	full := min(r.PromptTokens, len(r.Blocks)*bt) / e.blockSize
	if r.HashTokens == e.blockSize && len(r.PromptHashes) >= full && !slices.Contains(r.PromptHashes[:full], 0) {
		s.hashes = r.PromptHashes[:full:full]
	} else {
		s.own = e.appendHashes(s.own[:0], r, bt, full)
		s.hashes = s.own
	}
	s.numHashes = int32(full)
}

// appendHashes appends the first full hashes of r's chain to dst, for
// content blocks of bt tokens.
func (e *Engine) appendHashes(dst []uint64, r *Request, bt, full int) []uint64 {
	bs := e.blockSize
	h := uint64(0x243f6a8885a308d3)
	if r.Adapter != "" {
		h = adapterSeed(r.Adapter)
	}
	if bt%bs == 0 {
		// Fast path: every KV block lies inside one content block.
		per := bt / bs
		for j := 0; j < full; {
			id := r.Blocks[j/per]
			for off := j % per; off < per && j < full; off++ {
				h = chain(h, blockKey(id, off*bs))
				dst = append(dst, h|1)
				j++
			}
		}
		return dst
	}
	for j := range full {
		first := j * bs / bt
		last := ((j+1)*bs - 1) / bt
		h = chain(h, blockKey(r.Blocks[first], j*bs-first*bt))
		for c := first + 1; c <= last; c++ {
			h = chain(h, r.Blocks[c])
		}
		dst = append(dst, h|1)
	}
	return dst
}

// admit plans the first chunk of a waiting request: it looks up its
// prefix in the cache (at most numTokens-1 tokens, since the last token
// must be computed to sample: kv_cache_manager.get_computed_blocks),
// checks that the hit blocks that are free plus the new blocks fit, and
// commits them. It returns the number of tokens to compute this step.
func (e *Engine) admit(s *seq, budget int) (int, bool) {
	bs := e.blockSize
	hits := e.hits[:0]
	maxHit := min(len(s.hashes), int(s.numTokens-1)/bs)
	evictable := 0
	parent := noBlock
	for j := 0; j < maxHit; j++ {
		b, ok := e.pool.lookup(s.hashes[j], parent)
		if !ok {
			break
		}
		hits = append(hits, b)
		if e.pool.b[b].ref == 0 {
			evictable++
		}
		parent = b + 1
	}
	e.hits = hits
	computed := len(hits) * bs
	n := min(int(s.numTokens)-computed, budget)
	need := (computed+n+bs-1)/bs - len(hits)
	if need+evictable > e.pool.numFree {
		return 0, false
	}
	for _, b := range hits {
		e.pool.touch(b)
	}
	s.blocks = append(s.blocks[:0], hits...)
	s.numCached = int32(len(hits))
	s.holder = parent
	s.numComputed = int32(computed)
	if !s.started {
		s.cachedHit = computed
	}
	for range need {
		s.blocks = append(s.blocks, e.pool.take())
	}
	e.cacheFull(s, computed+n)
	return n, true
}

// allocate gives running request s the blocks for n more tokens, or
// reports false (allocating nothing) if too few blocks are free.
func (e *Engine) allocate(s *seq, n int) bool {
	bs := e.blockSize
	upTo := int(s.numComputed) + n
	if upTo > len(s.blocks)*bs {
		need := (upTo+bs-1)/bs - len(s.blocks)
		if need > e.pool.numFree {
			return false
		}
		for range need {
			s.blocks = append(s.blocks, e.pool.take())
		}
	}
	if s.numCached < s.numHashes {
		e.cacheFull(s, upTo)
	}
	return true
}

// cacheFull registers the request's full prompt blocks within the first
// upTo tokens in the prefix cache (vLLM caches blocks when they are
// scheduled: KVCacheManager.allocate_slots). s.holder is the block holding
// the hash of block numCached-1, which each registration chains from.
func (e *Engine) cacheFull(s *seq, upTo int) {
	limit := min(upTo/e.blockSize, len(s.hashes))
	if limit <= int(s.numCached) {
		return
	}
	s.holder = e.pool.registerChain(s.blocks, s.hashes, int(s.numCached), limit, s.holder)
	s.numCached = int32(limit)
}

// registerChain registers blocks[j] as holding hs[j] for j in
// [from, limit), the next chunk of a request's prompt, and returns the
// block holding hs[limit-1], plus one. holder is what it returned for the
// previous chunk (noBlock when from is 0).
func (p *blockPool) registerChain(blocks []int32, hs []uint64, from, limit int, holder int32) int32 {
	j, parent := from, holder
	if j > 0 && (parent == noBlock || p.b[parent-1].hash != hs[j-1]) {
		// The block that held the parent hash, another request's, was
		// evicted since the last chunk: find the parent hash's holder now.
		parent = p.holderOf(hs[:j])
	}
	for ; j < limit; j++ {
		parent = p.register(blocks[j], hs[j], parent, j > 0)
	}
	return parent
}

// holderOf returns the block holding the last hash of the chain hs, plus
// one, or noBlock: it walks the chain from its root, as a lookup does,
// restarting at the table after a hash no block holds.
func (p *blockPool) holderOf(hs []uint64) int32 {
	parent := noBlock
	for _, h := range hs {
		if b, ok := p.lookup(h, parent); ok {
			parent = b + 1
		} else {
			parent = noBlock
		}
	}
	return parent
}

// freeBlocks releases s's blocks in reverse order.
func (e *Engine) freeBlocks(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	s.numCached = 0
	s.holder = noBlock
}

// PrefixHitTokens returns how many of r's prompt tokens the prefix cache
// would serve if r were scheduled now: the leading full blocks of r found
// in the cache, at most PromptTokens-1 tokens. It does not change the
// cache's state or recency (a perfect-information oracle may call it on
// every pod). It does not allocate once the engine has hashed a prompt as
// long as r's.
func (e *Engine) PrefixHitTokens(r *Request) int {
	if !e.cfg.EnablePrefixCaching || r.PromptTokens < 1 {
		return 0
	}
	e.scratch.req = r
	e.hashPrompt(&e.scratch)
	hs := e.scratch.hashes
	e.scratch.req, e.scratch.hashes = nil, nil
	maxHit := min(len(hs), (r.PromptTokens-1)/e.blockSize)
	hit := 0
	parent := noBlock
	for hit < maxHit {
		b, ok := e.pool.lookup(hs[hit], parent)
		if !ok {
			break
		}
		parent = b + 1
		hit++
	}
	return hit * e.blockSize
}
