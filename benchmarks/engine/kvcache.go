package engine

// This file is the paged KV cache with automatic prefix caching, after
// vLLM V1's KV cache manager (vllm/v1/core/kv_cache_manager.py,
// vllm/v1/core/block_pool.py, vllm/v1/core/kv_cache_utils.py):
//
//   - blocks are reference counted; a block no request references sits in
//     a doubly linked free queue (FreeKVCacheBlockQueue) and keeps its
//     cached content until it is reused, so it can still be hit;
//   - a new block is taken from the head of the free queue (the least
//     recently freed), evicting its prefix-cache entry;
//   - a request's blocks are freed in reverse order, so that its tail
//     blocks (least likely to be shared) are evicted first;
//   - a full block is identified by a hash chain: the hash of its parent
//     block, its tokens and extra keys such as the LoRA adapter
//     (kv_cache_utils.hash_block_tokens).

// blockPool is the set of KV blocks, their reference counts, the free
// queue and the prefix-cache table. It never allocates after init.
type blockPool struct {
	numBlocks int
	numFree   int
	ref       []int32
	hash      []uint64
	hashed    []bool
	// prev and next link the free queue; index numBlocks is the sentinel
	// (next[sentinel] is the head, prev[sentinel] the tail).
	prev, next []int32
	table      hashTable
}

func (p *blockPool) init(n int) {
	if p.numBlocks != n || p.ref == nil {
		p.numBlocks = n
		p.ref = make([]int32, n)
		p.hash = make([]uint64, n)
		p.hashed = make([]bool, n)
		p.prev = make([]int32, n+1)
		p.next = make([]int32, n+1)
		p.table.init(n)
	} else {
		clear(p.ref)
		clear(p.hashed)
		p.table.reset()
	}
	// All blocks free, in id order.
	for i := 0; i <= n; i++ {
		p.prev[i] = int32(i - 1)
		p.next[i] = int32(i + 1)
	}
	p.prev[0] = int32(n)
	p.next[n] = 0
	p.prev[n] = int32(n - 1)
	if n > 0 {
		p.next[n-1] = int32(n)
	}
	p.numFree = n
}

func (p *blockPool) unlink(b int32) {
	pr, nx := p.prev[b], p.next[b]
	p.next[pr] = nx
	p.prev[nx] = pr
	p.numFree--
}

func (p *blockPool) pushTail(b int32) {
	s := int32(p.numBlocks)
	t := p.prev[s]
	p.next[t] = b
	p.prev[b] = t
	p.next[b] = s
	p.prev[s] = b
	p.numFree++
}

// take removes the least recently freed block from the free queue, evicts
// its prefix-cache entry, and returns it with reference count 1. The
// caller has checked numFree > 0.
func (p *blockPool) take() int32 {
	b := p.next[p.numBlocks]
	p.unlink(b)
	if p.hashed[b] {
		p.table.remove(p.hash[b], b)
		p.hashed[b] = false
	}
	p.ref[b] = 1
	return b
}

// touch adds a reference to a cached block, taking it off the free queue
// if no request referenced it.
func (p *blockPool) touch(b int32) {
	if p.ref[b] == 0 {
		p.unlink(b)
	}
	p.ref[b]++
}

// release drops a reference; an unreferenced block goes to the tail of the
// free queue, still cached.
func (p *blockPool) release(b int32) {
	p.ref[b]--
	if p.ref[b] == 0 {
		p.pushTail(b)
	}
}

// register records block b as holding the content with hash h, unless
// another block already holds it (then b stays an uncached duplicate).
func (p *blockPool) register(b int32, h uint64) {
	if p.hashed[b] {
		return
	}
	if _, ok := p.table.get(h); ok {
		return
	}
	p.table.put(h, b)
	p.hash[b] = h
	p.hashed[b] = true
}

// hashTable maps block hashes to block ids with open addressing, linear
// probing and backward-shift deletion, sized once for at most n entries.
// It exists so that steady-state stepping does not allocate (a Go map may
// reallocate to clear deleted entries).
type hashTable struct {
	keys []uint64
	vals []int32 // -1: empty slot
	mask uint64
}

func (t *hashTable) init(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	t.keys = make([]uint64, size)
	t.vals = make([]int32, size)
	t.mask = uint64(size - 1)
	t.reset()
}

func (t *hashTable) reset() {
	for i := range t.vals {
		t.vals[i] = -1
	}
}

func (t *hashTable) get(k uint64) (int32, bool) {
	for i := k & t.mask; ; i = (i + 1) & t.mask {
		v := t.vals[i]
		if v < 0 {
			return 0, false
		}
		if t.keys[i] == k {
			return v, true
		}
	}
}

func (t *hashTable) put(k uint64, v int32) {
	i := k & t.mask
	for t.vals[i] >= 0 {
		i = (i + 1) & t.mask
	}
	t.keys[i] = k
	t.vals[i] = v
}

// remove deletes key k if it maps to v, shifting later entries of the
// probe run back so lookups need no tombstones (Knuth, TAOCP vol. 3,
// 6.4, Algorithm R).
func (t *hashTable) remove(k uint64, v int32) {
	i := k & t.mask
	for {
		if t.vals[i] < 0 {
			return
		}
		if t.keys[i] == k && t.vals[i] == v {
			break
		}
		i = (i + 1) & t.mask
	}
	for {
		t.vals[i] = -1
		j := i
		for {
			j = (j + 1) & t.mask
			if t.vals[j] < 0 {
				return
			}
			home := t.keys[j] & t.mask
			// Move j back to i unless its home lies cyclically in (i, j].
			if (i <= j && (i < home && home <= j)) || (i > j && (i < home || home <= j)) {
				continue
			}
			t.keys[i] = t.keys[j]
			t.vals[i] = t.vals[j]
			i = j
			break
		}
	}
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

func chain(h, x uint64) uint64 { return mix64(h ^ mix64(x+0x9e3779b97f4a7c15)) }

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
// [j·bs, (j+1)·bs); its hash chains the previous hash, the ids of the
// content blocks it overlaps and its offset in the first of them.
func (e *Engine) hashPrompt(s *seq) {
	s.hashes = s.hashes[:0]
	if !e.cfg.EnablePrefixCaching {
		return
	}
	r := s.req
	bt := r.BlockTokens
	if bt <= 0 {
		bt = e.blockSize
	}
	bs := e.blockSize
	covered := min(r.PromptTokens, len(r.Blocks)*bt)
	h := uint64(0x243f6a8885a308d3)
	if r.Adapter != "" {
		h = adapterSeed(r.Adapter)
	}
	for j := 0; (j+1)*bs <= covered; j++ {
		first := j * bs / bt
		last := ((j+1)*bs - 1) / bt
		h = chain(h, uint64(j*bs-first*bt))
		for c := first; c <= last; c++ {
			h = chain(h, r.Blocks[c])
		}
		s.hashes = append(s.hashes, h)
	}
}

// admit plans the first chunk of a waiting request: it looks up its
// prefix in the cache (at most numTokens-1 tokens, since the last token
// must be computed to sample: kv_cache_manager.get_computed_blocks),
// checks that the hit blocks that are free plus the new blocks fit, and
// commits them. It returns the number of tokens to compute this step.
func (e *Engine) admit(s *seq, budget int) (int, bool) {
	bs := e.blockSize
	hits := e.hits[:0]
	maxHit := min(len(s.hashes), (s.numTokens-1)/bs)
	evictable := 0
	for j := 0; j < maxHit; j++ {
		b, ok := e.pool.table.get(s.hashes[j])
		if !ok {
			break
		}
		hits = append(hits, b)
		if e.pool.ref[b] == 0 {
			evictable++
		}
	}
	e.hits = hits
	computed := len(hits) * bs
	n := min(s.numTokens-computed, budget)
	need := (computed+n+bs-1)/bs - len(hits)
	if need+evictable > e.pool.numFree {
		return 0, false
	}
	for _, b := range hits {
		e.pool.touch(b)
	}
	s.blocks = append(s.blocks[:0], hits...)
	s.numCached = len(hits)
	s.numComputed = computed
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
	need := (s.numComputed+n+bs-1)/bs - len(s.blocks)
	if need > e.pool.numFree {
		return false
	}
	for range need {
		s.blocks = append(s.blocks, e.pool.take())
	}
	e.cacheFull(s, s.numComputed+n)
	return true
}

// cacheFull registers the request's full prompt blocks within the first
// upTo tokens in the prefix cache (vLLM caches blocks when they are
// scheduled: KVCacheManager.allocate_slots).
func (e *Engine) cacheFull(s *seq, upTo int) {
	limit := min(upTo/e.blockSize, len(s.hashes))
	for j := s.numCached; j < limit; j++ {
		e.pool.register(s.blocks[j], s.hashes[j])
	}
	if limit > s.numCached {
		s.numCached = limit
	}
}

// freeBlocks releases s's blocks in reverse order.
func (e *Engine) freeBlocks(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	s.numCached = 0
}
