package latency

import (
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"

	"github.com/inferroute/inferroute/signals"
)

// TestPendingReleasesCompletedRequests: once a dispatch is completed the
// predictor holds no reference to its request (signals.Request: never
// retained after Done), so the request and its prompt blocks can be
// collected.
func TestPendingReleasesCompletedRequests(t *testing.T) {
	clk := newFakeClock()
	p := New(Config{Clock: clk})
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	serve := func(out signals.Outcome) weak.Pointer[signals.Request] {
		req := &signals.Request{PromptTokens: 100, PromptBlocks: make([]uint64, 64)}
		ep.Dispatch(req.PromptTokens)
		p.Dispatched(req, ep)
		ep.Complete(req.PromptTokens)
		p.Completed(req, ep, out)
		return weak.Make(req)
	}
	done := serve(signals.Outcome{TTFT: time.Second})
	failed := serve(signals.Outcome{Err: assert.AnError})
	kept := &signals.Request{PromptTokens: 100}
	ep.Dispatch(kept.PromptTokens)
	p.Dispatched(kept, ep)

	for i := 0; i < 5 && (done.Value() != nil || failed.Value() != nil); i++ {
		runtime.GC()
	}
	assert.Nil(t, done.Value(), "a completed request is released")
	assert.Nil(t, failed.Value(), "a failed request is released")
	assert.Equal(t, 1, p.pending.len(), "the outstanding dispatch is still remembered")
	runtime.KeepAlive(kept)
	runtime.KeepAlive(p)
}

// TestPendingKeepsLongRequests: a dispatch is forgotten only when more
// than MaxPending are outstanding, so a long request is remembered however
// many shorter ones are dispatched and completed meanwhile.
func TestPendingKeepsLongRequests(t *testing.T) {
	clk := newFakeClock()
	p := New(Config{Clock: clk, MaxPending: 64})
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	long := &signals.Request{PromptTokens: 100}
	ep.Dispatch(100)
	p.Dispatched(long, ep)
	for i := 0; i < 10000; i++ {
		r := &signals.Request{PromptTokens: 100}
		ep.Dispatch(100)
		p.Dispatched(r, ep)
		ep.Complete(100)
		p.Completed(r, ep, signals.Outcome{Err: assert.AnError}) // teaches nothing
	}
	assert.Equal(t, 1, p.pending.len())
	ep.Complete(100)
	p.Completed(long, ep, signals.Outcome{TTFT: time.Second})
	assert.InDelta(t, 1, p.Explain(ep).Samples, 1e-12, "the long request is still paired")
}

// TestPendingForgetsOldestOutstanding: MaxPending counts outstanding
// dispatches exactly, across the table's shards, and forgets the oldest
// outstanding one first.
func TestPendingForgetsOldestOutstanding(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	newReqs := func(n int) []*signals.Request {
		reqs := make([]*signals.Request, n)
		for i := range reqs {
			reqs[i] = &signals.Request{PromptTokens: 100}
		}
		return reqs
	}
	// held looks the requests up without taking them, which would change
	// the table's order.
	held := func(p *Predictor, reqs []*signals.Request) []bool {
		out := make([]bool, len(reqs))
		for i, r := range reqs {
			k := pendingKey{r, ep}
			s := p.pending.shard(k)
			s.mu.Lock()
			_, out[i] = s.m[k]
			s.mu.Unlock()
		}
		return out
	}

	t.Run("MaxPending 1", func(t *testing.T) {
		p := New(Config{Clock: newFakeClock(), MaxPending: 1})
		reqs := newReqs(20)
		for _, r := range reqs {
			p.Dispatched(r, ep)
			assert.Equal(t, 1, p.pending.len())
		}
		want := make([]bool, len(reqs))
		want[len(reqs)-1] = true
		assert.Equal(t, want, held(p, reqs), "only the newest")
	})

	t.Run("the newest MaxPending", func(t *testing.T) {
		p := New(Config{Clock: newFakeClock(), MaxPending: 64})
		reqs := newReqs(100)
		for _, r := range reqs {
			p.Dispatched(r, ep)
		}
		assert.Equal(t, 64, p.pending.len())
		want := make([]bool, len(reqs))
		for i := 36; i < len(want); i++ {
			want[i] = true
		}
		assert.Equal(t, want, held(p, reqs))
	})

	t.Run("completed dispatches make room", func(t *testing.T) {
		p := New(Config{Clock: newFakeClock(), MaxPending: 3})
		reqs := newReqs(5) // a b c d e
		p.Dispatched(reqs[0], ep)
		p.Dispatched(reqs[1], ep)
		p.Dispatched(reqs[2], ep)
		p.Completed(reqs[1], ep, signals.Outcome{Err: assert.AnError})
		p.Dispatched(reqs[3], ep)
		assert.Equal(t, []bool{true, false, true, true, false}, held(p, reqs), "b's completion made room for d")
		p.Dispatched(reqs[4], ep)
		assert.Equal(t, []bool{false, false, true, true, true}, held(p, reqs), "e pushed out a, the oldest outstanding")
		p.Dispatched(reqs[2], ep) // a retry of c renews it
		p.Dispatched(reqs[0], ep)
		assert.Equal(t, []bool{true, false, true, false, true}, held(p, reqs), "a pushed out d")
	})
}

// TestPendingConcurrent: concurrent dispatches and completions keep the
// table consistent and within its bound once they are over.
func TestPendingConcurrent(t *testing.T) {
	p := New(Config{Clock: newFakeClock(), MaxPending: 32})
	eps := []*signals.Endpoint{signals.NewEndpoint(signals.EndpointSpec{Name: "a"}), signals.NewEndpoint(signals.EndpointSpec{Name: "b"})}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				r, ep := &signals.Request{PromptTokens: 10}, eps[i%2]
				p.Dispatched(r, ep)
				if i%3 != 0 { // a third never complete
					p.Completed(r, ep, signals.Outcome{Err: assert.AnError})
				}
			}
		}()
	}
	wg.Wait()
	n := p.pending.len()
	assert.LessOrEqual(t, n, 32)
	assert.EqualValues(t, n, p.pending.live.Load(), "the count matches the entries")
	// Outstanding dispatches fill the table to its bound, not past it.
	for i := 0; i < 32; i++ {
		p.Dispatched(&signals.Request{PromptTokens: 10}, eps[0])
	}
	assert.Equal(t, 32, p.pending.len())
	assert.EqualValues(t, 32, p.pending.live.Load())
	for i := range p.pending.shards {
		s := &p.pending.shards[i]
		n := 0
		for j := s.head; j >= 0; j = s.nodes[j].next {
			n++
		}
		assert.Equal(t, len(s.m), n, "shard %d: the list holds the map's entries", i)
	}
}
