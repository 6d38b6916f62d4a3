package prefix

// blockShardBits selects a block's shard from the top bits of its mixed
// hash. 256 shards keep the largest rehash of an index of 25 million
// distinct blocks near 100 thousand slots (a millisecond or two under the
// write lock), where one monolithic table would stop every Match for the
// time it takes to copy all of it; small indexes allocate only the shards
// they use.
const (
	blockShardBits = 8
	blockShards    = 1 << blockShardBits
)

// blockSlot is a slot of a blockTable: a block hash and its holder set
// (index.go); a zero set marks a free slot.
type blockSlot struct {
	h, v uint64
}

// blockShard is one open-addressing table of a blockTable.
type blockShard struct {
	slots []blockSlot
	n     int
}

// blockTable maps block hashes to non-zero holder sets. The zero value is
// empty. Not safe for concurrent use.
type blockTable struct {
	shards [blockShards]blockShard
	n      int
}

// Len returns the number of blocks.
func (t *blockTable) Len() int { return t.n }

// Bytes returns the memory held by the table, its shard headers included.
func (t *blockTable) Bytes() int64 {
	b := int64(len(t.shards)) * 32 // slice header and count per shard
	for i := range t.shards {
		b += int64(cap(t.shards[i].slots)) * slotBytes
	}
	return b
}

// shard returns h's shard and the mixed hash bits that place it there.
func (t *blockTable) shard(h uint64) (*blockShard, uint64) {
	m := mix(h)
	return &t.shards[m>>(64-blockShardBits)], m << blockShardBits
}

// Get returns h's holder set, 0 when h is absent.
func (t *blockTable) Get(h uint64) uint64 {
	s, m := t.shard(h)
	if s.n == 0 {
		return 0
	}
	size := len(s.slots)
	for i := reduce(m, size); ; {
		sl := &s.slots[i]
		if sl.v == 0 {
			return 0
		}
		if sl.h == h {
			return sl.v
		}
		if i++; i == size {
			i = 0
		}
	}
}

// Put sets h's holder set to v, which must not be 0.
func (t *blockTable) Put(h, v uint64) {
	s, m := t.shard(h)
	if size := len(s.slots); size > 0 {
		for i := reduce(m, size); ; {
			sl := &s.slots[i]
			if sl.v == 0 {
				break
			}
			if sl.h == h {
				sl.v = v
				return
			}
			if i++; i == size {
				i = 0
			}
		}
	}
	if (s.n+1)*maxLoadDen > len(s.slots)*maxLoadNum {
		s.rehash(grownSlots(len(s.slots), s.n+1, 0))
	}
	s.place(h, v, m)
	s.n++
	t.n++
}

// Delete removes h, if present.
func (t *blockTable) Delete(h uint64) {
	s, m := t.shard(h)
	if s.n == 0 {
		return
	}
	size := len(s.slots)
	i := reduce(m, size)
	for {
		sl := &s.slots[i]
		if sl.v == 0 {
			return
		}
		if sl.h == h {
			break
		}
		if i++; i == size {
			i = 0
		}
	}
	s.slots[i] = blockSlot{}
	s.n--
	t.n--
	// Backward-shift deletion, as in lruTable.Remove.
	for j := i; ; {
		if j++; j == size {
			j = 0
		}
		sl := &s.slots[j]
		if sl.v == 0 {
			break
		}
		home := reduce(mix(sl.h)<<blockShardBits, size)
		if (j-home+size)%size >= (j-i+size)%size {
			s.slots[i], *sl = *sl, blockSlot{}
			i = j
		}
	}
	// Give memory back when endpoints leave: shrink to a comfortable load
	// once a shard is a quarter full.
	switch {
	case s.n == 0:
		s.slots = nil
	case size > minSlots && s.n*4 < size:
		s.rehash(slotsFor(s.n + s.n/4))
	}
}

// Reset empties the table and releases its memory.
func (t *blockTable) Reset() { *t = blockTable{} }

// place stores (h, v) in the first free slot of h's probe run; m is h's
// in-shard hash bits. The shard must have a free slot.
func (s *blockShard) place(h, v, m uint64) {
	size := len(s.slots)
	i := reduce(m, size)
	for s.slots[i].v != 0 {
		if i++; i == size {
			i = 0
		}
	}
	s.slots[i] = blockSlot{h: h, v: v}
}

func (s *blockShard) rehash(size int) {
	old := s.slots
	s.slots = make([]blockSlot, size)
	for _, sl := range old {
		if sl.v != 0 {
			s.place(sl.h, sl.v, mix(sl.h)<<blockShardBits)
		}
	}
}
