package prefix

import "math/bits"

// Memory-tight tables of the index. The index keeps one entry per (block,
// endpoint) pair, millions of them, so both of its tables are open-addressing
// arrays of fixed 16-byte slots (linear probing, backward-shift deletion;
// Knuth, The Art of Computer Programming vol. 3, §6.4, Algorithm R) rather
// than Go maps of pointers:
//
//   - lruTable, one per endpoint: the block hashes the endpoint holds, each
//     slot also a node of the endpoint's LRU list, linked by 32-bit slot
//     numbers, so the set and its recency order share one array;
//   - blockTable, one per index: block hash → the set of endpoints holding
//     it (holder sets, see index.go), sharded so that growing it never
//     rehashes more than a small part at once.
//
// A slot's home is computed by Lemire's multiply-shift range reduction
// ("Fast random integer generation in an interval", ACM TOMACS 2019) of the
// mixed hash, so a table may have any size and grows by a quarter at a time:
// with a maximum load of 3/4 its load stays between 3/5 and 3/4, about 24
// bytes per entry, where doubling would let it fall to 3/8 (43 bytes).

const (
	// maxLoadNum/maxLoadDen is the highest load a table reaches before it
	// grows.
	maxLoadNum = 3
	maxLoadDen = 4
	// minSlots is the size of a table's first allocation.
	minSlots = 16
	// slotBytes is the size of a slot of either table.
	slotBytes = 16
)

// slotsFor returns the smallest table size that holds n entries within the
// maximum load.
func slotsFor(n int) int { return max((n*maxLoadDen+maxLoadNum-1)/maxLoadNum, minSlots) }

// grownSlots returns the size a table of size slots grows to so that it
// holds need entries: a quarter more, at least enough, at most enough for
// limit entries (limit ≤ 0: no limit).
func grownSlots(slots, need, limit int) int {
	s := max(slots+slots/4, slotsFor(need))
	if limit > 0 {
		s = min(s, max(slotsFor(limit), slotsFor(need)))
	}
	return s
}

// mix scrambles a block hash so that tables stay balanced even for keys
// that are not uniformly distributed (the final mixer of SplitMix64,
// Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014). Block hashes from a Hasher are already uniform; callers of
// the index may pass any uint64 values.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// reduce maps a mixed hash uniformly onto [0, n) (Lemire's range
// reduction: the high word of m·n).
func reduce(m uint64, n int) int {
	hi, _ := bits.Mul64(m, uint64(n))
	return int(hi)
}

// Link words of an lruNode. Each is a neighbour's slot number plus one (0:
// none) in the low 27 bits, a flag in the top bit, and in bits 27–30 one
// nibble of the entry's in-flight count: the low nibble in prev, the high
// nibble in next.
const (
	linkBits   = 27
	linkMask   = 1<<linkBits - 1
	flagBit    = 1 << 31
	nibbleMask = 0xf << linkBits
	// maxSlots is the most slots a table may have: slot numbers plus one
	// must fit in the link bits.
	maxSlots = linkMask
	// maxPending is where an entry's in-flight count saturates: an entry
	// that reaches it keeps that count until it leaves the table.
	maxPending = 255
	// maxEntries is the most entries a table can hold within the maximum
	// load; an owner must not ask for more.
	maxEntries = maxSlots * maxLoadNum / maxLoadDen
)

// lruNode is a slot of an lruTable: a block hash and its two neighbours in
// the recency list. The top bit of prev marks the slot as used, the top bit
// of next marks the entry as confirmed (a request using it completed), and
// the spare bits of the two links count the requests in flight that
// recorded the entry, so a node is 16 bytes.
type lruNode struct {
	h    uint64
	prev uint32 // more recently used neighbour + 1; flagBit: slot in use
	next uint32 // less recently used neighbour + 1; flagBit: confirmed
}

func (n *lruNode) used() bool      { return n.prev&flagBit != 0 }
func (n *lruNode) confirmed() bool { return n.next&flagBit != 0 }
func (n *lruNode) prevLink() int   { return int(n.prev & linkMask) }
func (n *lruNode) nextLink() int   { return int(n.next & linkMask) }
func (n *lruNode) setPrev(l int)   { n.prev = n.prev&^linkMask | uint32(l) }
func (n *lruNode) setNext(l int)   { n.next = n.next&^linkMask | uint32(l) }

func (n *lruNode) pending() int {
	return int(n.prev&nibbleMask>>linkBits) | int(n.next&nibbleMask>>linkBits)<<4
}

func (n *lruNode) setPending(c int) {
	n.prev = n.prev&^nibbleMask | uint32(c&0xf)<<linkBits
	n.next = n.next&^nibbleMask | uint32(c>>4&0xf)<<linkBits
}

// lruTable is a set of block hashes in least-recently-used order: an
// open-addressing hash table whose used slots are also the nodes of a
// doubly linked recency list. The zero value is an empty table. It does
// not enforce a capacity; its owner evicts Oldest before inserting when
// full. Not safe for concurrent use.
type lruTable struct {
	nodes []lruNode
	n     int // used slots
	head  int // most recently used slot + 1, 0 when empty
	tail  int // least recently used slot + 1, 0 when empty
}

// Len returns the number of entries.
func (t *lruTable) Len() int { return t.n }

// Bytes returns the memory held by the table's slots.
func (t *lruTable) Bytes() int64 { return int64(cap(t.nodes)) * slotBytes }

// Find returns the slot holding h, or -1.
func (t *lruTable) Find(h uint64) int {
	if t.n == 0 {
		return -1
	}
	size := len(t.nodes)
	for i := reduce(mix(h), size); ; {
		nd := &t.nodes[i]
		if !nd.used() {
			return -1
		}
		if nd.h == h {
			return i
		}
		if i++; i == size {
			i = 0
		}
	}
}

// Confirmed reports whether the entry in slot i is confirmed.
func (t *lruTable) Confirmed(i int) bool { return t.nodes[i].confirmed() }

// Confirm marks the entry in slot i confirmed.
func (t *lruTable) Confirm(i int) { t.nodes[i].next |= flagBit }

// AddPending counts one more request in flight on the entry in slot i. The
// count saturates at maxPending.
func (t *lruTable) AddPending(i int) { t.nodes[i].addPending() }

// DropPending counts one request fewer in flight on the entry in slot i and
// returns the count left. A saturated count no longer knows how many
// requests it stands for, so it stays saturated; a zero count stays zero.
func (t *lruTable) DropPending(i int) int { return t.nodes[i].dropPending() }

func (n *lruNode) addPending() {
	switch {
	case n.prev&nibbleMask != nibbleMask: // the low nibble has room
		n.prev += 1 << linkBits
	case n.next&nibbleMask != nibbleMask: // carry into the high nibble
		n.prev &^= nibbleMask
		n.next += 1 << linkBits
	}
}

func (n *lruNode) dropPending() int {
	c := n.pending()
	switch {
	case c == 0 || c == maxPending:
		return c
	case n.prev&nibbleMask != 0:
		n.prev -= 1 << linkBits
	default: // borrow from the high nibble
		n.prev |= nibbleMask
		n.next -= 1 << linkBits
	}
	return c - 1
}

// Hash returns the block hash in slot i.
func (t *lruTable) Hash(i int) uint64 { return t.nodes[i].h }

// Oldest returns the slot of the least recently used entry, or -1 when the
// table is empty.
func (t *lruTable) Oldest() int { return t.tail - 1 }

// Holds reports whether slot i holds the entry h: slot numbers change on
// Insert and Remove, and this tells a caller whether one it kept is still
// good without a lookup.
func (t *lruTable) Holds(i int, h uint64) bool {
	return i < len(t.nodes) && t.nodes[i].used() && t.nodes[i].h == h
}

// Newest returns the slot of the most recently used entry, or -1 when the
// table is empty.
func (t *lruTable) Newest() int { return t.head - 1 }

// Next returns the slot of the entry used just before the one in slot i
// (its less recently used neighbour), or -1 when i is the oldest.
func (t *lruTable) Next(i int) int { return t.nodes[i].nextLink() - 1 }

// Lead walks the list from its front along the indexed positions of the
// prompt hs, blocks stride-1, 2·stride-1, … and the last block n-1, for as
// long as each entry in turn holds its position's hash, and counts the
// request on every entry it passes: in flight when done is false
// (AddPending), out and confirmed when done is true (DropPending, then
// Confirm). It returns the number of positions passed and the slot of the
// entry of the last of them, -1 when none. It changes no order.
//
// It is the index's hot loop for a prompt the endpoint served last (every
// position of a 220 KB prompt's 880, twice per request), so it reads the
// nodes directly, one slice access and one hash compare per position,
// and the common in-flight counts (below 15) changed by one add or
// subtract instead of decoding the whole two-nibble count.
func (t *lruTable) Lead(hs []uint64, stride int, done bool) (k, last int) {
	if len(hs) == 0 || t.head == 0 {
		return 0, -1
	}
	if done {
		return t.leadDone(hs, stride)
	}
	return t.leadAdd(hs, stride)
}

// leadAdd is Lead for a dispatch, leadDone for a completion: the same walk
// written twice, so that neither loop tests done or spills a register.
func (t *lruTable) leadAdd(hs []uint64, stride int) (k, last int) {
	nodes, end := t.nodes, len(hs)-1
	last = -1
	for p, l := stride-1, t.head; ; p += stride {
		p = min(p, end)
		nd := &nodes[l-1]
		if nd.h != hs[p] {
			return k, last
		}
		if nd.prev&nibbleMask != nibbleMask {
			nd.prev += 1 << linkBits
		} else {
			nd.addPending()
		}
		last, k = l-1, k+1
		if l = int(nd.next & linkMask); p == end || l == 0 {
			return k, last
		}
	}
}

func (t *lruTable) leadDone(hs []uint64, stride int) (k, last int) {
	nodes, end := t.nodes, len(hs)-1
	last = -1
	for p, l := stride-1, t.head; ; p += stride {
		p = min(p, end)
		nd := &nodes[l-1]
		if nd.h != hs[p] {
			return k, last
		}
		if lo := nd.prev & nibbleMask; lo != 0 && lo != nibbleMask {
			nd.prev -= 1 << linkBits
		} else {
			nd.dropPending()
		}
		nd.next |= flagBit
		last, k = l-1, k+1
		if l = int(nd.next & linkMask); p == end || l == 0 {
			return k, last
		}
	}
}

// Touch makes the entry in slot i the most recently used.
func (t *lruTable) Touch(i int) {
	if t.head == i+1 {
		return
	}
	t.unlink(i)
	t.pushFront(i)
}

// TouchAfter makes the entry in slot i the next less recently used after
// the one in slot a: between a and a's neighbour. A negative a means the
// front (Touch); i == a changes nothing.
func (t *lruTable) TouchAfter(i, a int) {
	if a < 0 {
		t.Touch(i)
		return
	}
	if i == a || t.nodes[a].nextLink() == i+1 {
		return
	}
	t.unlink(i)
	nd, an := &t.nodes[i], &t.nodes[a]
	n := an.nextLink()
	nd.setPrev(a + 1)
	nd.setNext(n)
	an.setNext(i + 1)
	if n != 0 {
		t.nodes[n-1].setPrev(i + 1)
	} else {
		t.tail = i + 1
	}
}

// Insert adds h, which must not be in the table, as the most recently used
// entry with the given confirmation and in-flight count (at most
// maxPending), growing the table when it is full; limit, when positive, is
// the most entries the table will ever be asked to hold, so that growth
// does not overshoot it. A table holds at most maxEntries entries. It
// returns the entry's slot.
func (t *lruTable) Insert(h uint64, confirmed bool, pending, limit int) int {
	if (t.n+1)*maxLoadDen > len(t.nodes)*maxLoadNum {
		if t.n+1 > maxEntries {
			panic("prefix: lruTable over maxEntries")
		}
		t.rehash(grownSlots(len(t.nodes), t.n+1, limit))
	}
	i := t.place(h)
	if confirmed {
		t.nodes[i].next = flagBit
	}
	t.nodes[i].setPending(pending)
	t.pushFront(i)
	t.n++
	return i
}

// Remove deletes the entry in slot i. Other entries may move to other
// slots: slot numbers are valid only until the next Insert or Remove.
func (t *lruTable) Remove(i int) {
	t.unlink(i)
	t.nodes[i] = lruNode{}
	t.n--
	// Backward-shift deletion: move later members of the probe run into the
	// hole when their home allows it, so lookups never need tombstones.
	size := len(t.nodes)
	for j := i; ; {
		if j++; j == size {
			j = 0
		}
		nd := &t.nodes[j]
		if !nd.used() {
			return
		}
		home := reduce(mix(nd.h), size)
		// nd may fill the hole at i when i lies cyclically in [home, j).
		if (j-home+size)%size >= (j-i+size)%size {
			t.move(j, i)
			i = j
		}
	}
}

// Shrink reallocates the table to fit its entries when it is much larger
// than they need, after a capacity decrease.
func (t *lruTable) Shrink() {
	if want := slotsFor(t.n + t.n/4); len(t.nodes) > 2*want {
		t.rehash(want)
	}
}

// Each calls f for every entry's hash, most recently used first.
func (t *lruTable) Each(f func(h uint64)) {
	for l := t.head; l != 0; l = t.nodes[l-1].nextLink() {
		f(t.nodes[l-1].h)
	}
}

// Reset empties the table and releases its slots.
func (t *lruTable) Reset() { *t = lruTable{} }

// place puts h into a free slot of its probe run, unlinked and unconfirmed,
// and returns the slot. The table must have a free slot.
func (t *lruTable) place(h uint64) int {
	size := len(t.nodes)
	i := reduce(mix(h), size)
	for t.nodes[i].used() {
		if i++; i == size {
			i = 0
		}
	}
	t.nodes[i] = lruNode{h: h, prev: flagBit}
	return i
}

func (t *lruTable) pushFront(i int) {
	nd := &t.nodes[i]
	nd.setPrev(0)
	nd.setNext(t.head)
	if t.head != 0 {
		t.nodes[t.head-1].setPrev(i + 1)
	} else {
		t.tail = i + 1
	}
	t.head = i + 1
}

func (t *lruTable) unlink(i int) {
	nd := &t.nodes[i]
	p, n := nd.prevLink(), nd.nextLink()
	if p != 0 {
		t.nodes[p-1].setNext(n)
	} else {
		t.head = n
	}
	if n != 0 {
		t.nodes[n-1].setPrev(p)
	} else {
		t.tail = p
	}
}

// move relocates the node in slot from to the free slot to, keeping its
// place in the list.
func (t *lruTable) move(from, to int) {
	t.nodes[to] = t.nodes[from]
	t.nodes[from] = lruNode{}
	nd := &t.nodes[to]
	if p := nd.prevLink(); p != 0 {
		t.nodes[p-1].setNext(to + 1)
	} else {
		t.head = to + 1
	}
	if n := nd.nextLink(); n != 0 {
		t.nodes[n-1].setPrev(to + 1)
	} else {
		t.tail = to + 1
	}
}

// rehash moves every entry into a new array of size slots (at most
// maxSlots), keeping the recency order, the confirmed marks and the
// in-flight counts.
func (t *lruTable) rehash(size int) {
	old := *t
	*t = lruTable{nodes: make([]lruNode, min(size, maxSlots))}
	for l := old.tail; l != 0; l = old.nodes[l-1].prevLink() {
		o := &old.nodes[l-1]
		i := t.place(o.h)
		t.nodes[i].prev |= o.prev & nibbleMask
		t.nodes[i].next = o.next & (flagBit | nibbleMask)
		t.pushFront(i)
		t.n++
	}
}
