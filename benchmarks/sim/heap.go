package sim

import "time"

type eventKind uint8

const (
	evArrival eventKind = iota // the next workload request arrives
	evDeliver                  // a routed request reaches its pod's engine
	evStepEnd                  // a pod's engine step ends
	evScrape                   // a pod's metrics page is scraped
	evPublish                  // a scrape's result reaches the endpoint
)

// event is one entry of the simulator's queue. Events at equal times run in
// the order they were scheduled (seq), which makes a run deterministic. An
// event holds no pointers, so that moving events in the heap costs no GC
// write barriers and the heap is not scanned: arg indexes the flight slab
// (evDeliver) or the pending scrape results (evPublish).
type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	pod  int32
	arg  int32
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// eventQueue is a binary min-heap of events by (at, seq). It is written by
// hand rather than with container/heap to avoid boxing each event in an
// interface value.
type eventQueue struct {
	items []event
	seq   uint64
}

func (q *eventQueue) len() int { return len(q.items) }

func (q *eventQueue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.items = append(q.items, e)
	i := len(q.items) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !q.items[i].before(&q.items[parent]) {
			break
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

func (q *eventQueue) pop() event {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items[last] = event{}
	q.items = q.items[:last]
	i, n := 0, last
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.items[r].before(&q.items[l]) {
			m = r
		}
		if !q.items[m].before(&q.items[i]) {
			break
		}
		q.items[i], q.items[m] = q.items[m], q.items[i]
		i = m
	}
	return top
}

func (q *eventQueue) reset() {
	clear(q.items)
	q.items = q.items[:0]
	q.seq = 0
}
