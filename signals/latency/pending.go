package latency

import (
	"sync"
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
	x   [maxDim]float64 // TTFT features
	z   [maxDim]float64 // TPOT features
	seq uint64
}

// pending pairs dispatches with completions. It holds at most capacity
// entries: when full, the oldest dispatch is forgotten, so requests whose
// completion never comes cannot leak. Safe for concurrent use.
type pending struct {
	shards [pendingShards]pendingShard
}

type pendingShard struct {
	mu    sync.Mutex
	m     map[pendingKey]pendingEntry
	ring  []ringSlot // insertion order, for eviction; grows up to limit
	limit int
	next  int // oldest slot once the ring is full
	seq   uint64
}

type ringSlot struct {
	key pendingKey
	seq uint64
}

func newPending(capacity int) *pending {
	// Nothing is preallocated: a picker per model is cheap to build, and
	// the table grows with the traffic actually in flight.
	per := max((capacity+pendingShards-1)/pendingShards, 1)
	p := &pending{}
	for i := range p.shards {
		p.shards[i].m = make(map[pendingKey]pendingEntry)
		p.shards[i].limit = per
	}
	return p
}

func (p *pending) shard(k pendingKey) *pendingShard {
	// Requests are heap objects at least 8-byte aligned; mix the address.
	h := uint64(uintptrOf(k.req))*0x9e3779b97f4a7c15 ^ uint64(uintptrOf(k.ep))
	return &p.shards[(h>>32)%pendingShards]
}

// put records e under k, evicting the shard's oldest entry when it is full.
func (p *pending) put(k pendingKey, e pendingEntry) {
	s := p.shard(k)
	s.mu.Lock()
	s.seq++
	e.seq = s.seq
	if len(s.ring) < s.limit {
		s.ring = append(s.ring, ringSlot{key: k, seq: e.seq})
	} else {
		slot := &s.ring[s.next]
		if old, ok := s.m[slot.key]; ok && old.seq == slot.seq {
			delete(s.m, slot.key)
		}
		*slot = ringSlot{key: k, seq: e.seq}
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[k] = e
	s.mu.Unlock()
}

// take removes and returns the entry under k.
func (p *pending) take(k pendingKey) (pendingEntry, bool) {
	s := p.shard(k)
	s.mu.Lock()
	e, ok := s.m[k]
	if ok {
		delete(s.m, k)
	}
	s.mu.Unlock()
	return e, ok
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

// uintptrOf returns the address of p, only to pick a shard.
func uintptrOf[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }
