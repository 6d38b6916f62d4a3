package engine

// deque is a ring buffer of requests: the waiting queue, with preempted
// requests pushed back at its front (vLLM V1's RequestQueue
// prepend_request).
type deque struct {
	buf  []*seq
	head int
	n    int
}

func (q *deque) len() int { return q.n }

func (q *deque) grow() {
	size := max(16, 2*len(q.buf))
	nb := make([]*seq, size)
	for i := 0; i < q.n; i++ {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf = nb
	q.head = 0
}

func (q *deque) pushBack(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)%len(q.buf)] = s
	q.n++
}

func (q *deque) pushFront(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.n++
}

func (q *deque) at(i int) *seq { return q.buf[(q.head+i)%len(q.buf)] }

func (q *deque) popFront() *seq {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return s
}

// removeAt removes element i, shifting the i elements before it one place
// towards the back (i is small: the requests skipped for LoRA slots).
func (q *deque) removeAt(i int) {
	for k := i; k > 0; k-- {
		q.buf[(q.head+k)%len(q.buf)] = q.buf[(q.head+k-1)%len(q.buf)]
	}
	q.popFront()
}

// lru is a small recency list of adapter ids, most recent last, holding at
// most capacity entries.
type lru struct {
	ids      []int32
	capacity int
}

func (l *lru) init(capacity int) {
	l.ids = l.ids[:0]
	l.capacity = capacity
}

// touch moves a to the most recent place and reports whether it was held.
func (l *lru) touch(a int32) bool {
	for i, id := range l.ids {
		if id == a {
			copy(l.ids[i:], l.ids[i+1:])
			l.ids[len(l.ids)-1] = a
			return true
		}
	}
	return false
}

// add inserts a as most recent, evicting the least recent entry that is
// not in the current batch (mark[id] != epoch) when full. When every entry
// is in the batch, it holds one more than its capacity until the next add.
func (l *lru) add(a int32, mark []uint64, epoch uint64) {
	if len(l.ids) >= l.capacity {
		for i, id := range l.ids {
			if mark[id] != epoch {
				copy(l.ids[i:], l.ids[i+1:])
				l.ids = l.ids[:len(l.ids)-1]
				break
			}
		}
	}
	l.ids = append(l.ids, a)
}
