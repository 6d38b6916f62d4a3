package latency

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/inferroute/inferroute/signals"
)

// pendingShards splits the pending table so that concurrent picks on
// different requests rarely contend for one lock.
const pendingShards = 16

// pendingKey identifies one dispatch: a request may be dispatched again
// (a retry on a fallback) before the first attempt completes.
type pendingKey struct {
	req *signals.Request
	ep  *signals.Endpoint
}

// pendingEntry is what was known about a request at dispatch.
type pendingEntry struct {
	x [maxDim]float64 // TTFT features
	z [maxDim]float64 // TPOT features
}

// pending pairs dispatches with completions. It holds at most capacity
// entries, the live (not yet taken) dispatches: when one more would exceed
// that, the oldest live entry is forgotten, so requests whose completion
// never comes cannot leak, while a long request is kept however many
// others come and go meanwhile. A taken or forgotten entry keeps no
// reference to its request. Safe for concurrent use; with concurrent puts
// the bound can be exceeded for a moment by at most one entry per put in
// progress, and the entry forgotten is then the oldest only approximately.
type pending struct {
	// seq orders the puts of all shards, and live counts the entries held
	// in all shards. Both change on every put: the padding keeps them off
	// the first shard's lock.
	seq   atomic.Uint64
	live  atomic.Int64
	limit int64
	_     [64 - 24]byte

	shards [pendingShards]pendingShard
}

// pendingShard holds its entries in a slab of nodes, linked from oldest
// (head) to newest (tail); freed nodes are reused, so once the slab has
// grown to the shard's peak of live entries a put does not allocate.
type pendingShard struct {
	mu    sync.Mutex
	m     map[pendingKey]int32 // node index of each live entry
	nodes []pendingNode
	head  int32 // oldest live node, or -1
	tail  int32 // newest live node, or -1
	free  int32 // first free node, linked through next, or -1
	// oldest is the seq of the head node, 0 when the shard is empty: what
	// eviction compares across shards without taking their locks.
	oldest atomic.Uint64
}

type pendingNode struct {
	key        pendingKey
	e          pendingEntry
	seq        uint64
	prev, next int32
}

func newPending(capacity int) *pending {
	// Nothing is preallocated: a picker per model is cheap to build, and
	// the table grows with the traffic actually in flight.
	p := &pending{limit: int64(max(min(capacity, math.MaxInt32), 1))}
	for i := range p.shards {
		s := &p.shards[i]
		s.m = make(map[pendingKey]int32)
		s.head, s.tail, s.free = -1, -1, -1
	}
	return p
}

func (p *pending) shard(k pendingKey) *pendingShard {
	// Requests are heap objects at least 8-byte aligned; mix the address.
	h := uint64(uintptrOf(k.req))*0x9e3779b97f4a7c15 ^ uint64(uintptrOf(k.ep))
	return &p.shards[(h>>32)%pendingShards]
}

// put records e under k as the newest entry (replacing any entry under k),
// then forgets the oldest entries while more than the limit are held.
func (p *pending) put(k pendingKey, e pendingEntry) {
	seq := p.seq.Add(1)
	s := p.shard(k)
	s.mu.Lock()
	if i, ok := s.m[k]; ok {
		s.unlink(i)
		s.pushBack(i, k, &e, seq)
		s.mu.Unlock()
		return
	}
	i := s.alloc()
	s.pushBack(i, k, &e, seq)
	s.m[k] = i
	over := p.live.Add(1) > p.limit
	s.mu.Unlock()
	if over {
		p.evict()
	}
}

// take removes and returns the entry under k.
func (p *pending) take(k pendingKey) (pendingEntry, bool) {
	s := p.shard(k)
	s.mu.Lock()
	i, ok := s.m[k]
	var e pendingEntry
	if ok {
		e = s.nodes[i].e
		delete(s.m, k)
		s.release(i)
		p.live.Add(-1)
	}
	s.mu.Unlock()
	return e, ok
}

// evict forgets the oldest live entries, across shards, while more than
// the limit are held.
func (p *pending) evict() {
	for p.live.Load() > p.limit {
		var s *pendingShard
		best := uint64(math.MaxUint64)
		for i := range p.shards {
			if o := p.shards[i].oldest.Load(); o != 0 && o < best {
				s, best = &p.shards[i], o
			}
		}
		if s == nil {
			return
		}
		s.mu.Lock()
		// Another put or take may have changed the shard or the count since:
		// check both again, and claim the eviction with a compare-and-swap,
		// so that a take in another shard meanwhile cannot make it one too
		// many.
		if i := s.head; i >= 0 && p.claimEviction() {
			delete(s.m, s.nodes[i].key)
			s.release(i)
		}
		s.mu.Unlock()
	}
}

// claimEviction decrements the live count if it exceeds the limit, and
// reports whether it did.
func (p *pending) claimEviction() bool {
	for {
		n := p.live.Load()
		if n <= p.limit {
			return false
		}
		if p.live.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// len returns the number of entries held.
func (p *pending) len() int {
	n := 0
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// alloc returns a free node, growing the slab if none is. Caller holds s.mu.
func (s *pendingShard) alloc() int32 {
	if i := s.free; i >= 0 {
		s.free = s.nodes[i].next
		return i
	}
	s.nodes = append(s.nodes, pendingNode{})
	return int32(len(s.nodes) - 1)
}

// pushBack fills node i and links it as the newest. Caller holds s.mu.
func (s *pendingShard) pushBack(i int32, k pendingKey, e *pendingEntry, seq uint64) {
	n := &s.nodes[i]
	n.key, n.e, n.seq = k, *e, seq
	n.prev, n.next = s.tail, -1
	if s.tail >= 0 {
		s.nodes[s.tail].next = i
	} else {
		s.head = i
		s.oldest.Store(seq)
	}
	s.tail = i
}

// unlink removes node i from the list, keeping its contents. Caller holds
// s.mu.
func (s *pendingShard) unlink(i int32) {
	n := &s.nodes[i]
	if n.prev >= 0 {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
		if n.next >= 0 {
			s.oldest.Store(s.nodes[n.next].seq)
		} else {
			s.oldest.Store(0)
		}
	}
	if n.next >= 0 {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
}

// release unlinks node i, clears it so that it references no request, and
// frees it. The caller has deleted its map entry and holds s.mu.
func (s *pendingShard) release(i int32) {
	s.unlink(i)
	s.nodes[i] = pendingNode{next: s.free}
	s.free = i
}

// uintptrOf returns the address of p, only to pick a shard.
func uintptrOf[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }
