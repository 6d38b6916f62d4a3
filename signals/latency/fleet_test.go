package latency_test

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
)

// queueSim is a heterogeneous fleet of single-server FIFO prefill queues in
// virtual time: endpoint k prefills at 4000 × speeds[k] tokens/s, and a
// request's TTFT is its wait plus its own prefill plus 30 ms. It is the
// simplest model in which "where will the first token come soonest"
// differs from "which queue is shortest".
type queueSim struct {
	clk       *stepClock
	eps       []*signals.Endpoint
	speeds    []float64
	busyUntil []time.Time
	pending   []simCompletion
}

type simCompletion struct {
	at   time.Time
	ttft time.Duration
	done func(signals.Outcome)
}

func newQueueSim(clk *stepClock, speeds ...float64) *queueSim {
	s := &queueSim{clk: clk, speeds: speeds, busyUntil: make([]time.Time, len(speeds))}
	for i := range speeds {
		s.eps = append(s.eps, signals.NewEndpoint(signals.EndpointSpec{Name: string(rune('a' + i))}))
	}
	return s
}

// advance completes, in time order, every request whose first token comes
// by t, then sets the clock to t.
func (s *queueSim) advance(t time.Time) {
	sort.Slice(s.pending, func(i, j int) bool { return s.pending[i].at.Before(s.pending[j].at) })
	k := 0
	for ; k < len(s.pending) && !s.pending[k].at.After(t); k++ {
		c := s.pending[k]
		s.clk.t = c.at
		c.done(signals.Outcome{TTFT: c.ttft})
	}
	s.pending = s.pending[k:]
	s.clk.t = t
}

// serve queues a request of tokens on endpoint k at the current time and
// returns its TTFT; done is called when its first token comes.
func (s *queueSim) serve(k, tokens int, done func(signals.Outcome)) time.Duration {
	now := s.clk.t
	start := now
	if s.busyUntil[k].After(start) {
		start = s.busyUntil[k]
	}
	finish := start.Add(time.Duration(float64(tokens) / (4000 * s.speeds[k]) * float64(time.Second)))
	s.busyUntil[k] = finish
	at := finish.Add(30 * time.Millisecond)
	ttft := at.Sub(now)
	s.pending = append(s.pending, simCompletion{at: at, ttft: ttft, done: done})
	return ttft
}

// runFleet sends n requests (prompt 1000–3000 tokens, one every 100 ms: 70%
// of the fleet's capacity of 28000 tokens/s) through choose and returns the
// mean TTFT and the number of requests each endpoint received.
func runFleet(t *testing.T, s *queueSim, n int, choose func(req *signals.Request) (int, func(signals.Outcome))) (time.Duration, []int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(11, 12))
	counts := make([]int, len(s.eps))
	var total time.Duration
	for i := 0; i < n; i++ {
		s.advance(s.clk.t.Add(100 * time.Millisecond))
		req := &signals.Request{PromptTokens: 1000 + rng.IntN(2001)}
		k, done := choose(req)
		counts[k]++
		total += s.serve(k, req.PromptTokens, done)
	}
	s.advance(s.clk.t.Add(time.Hour))
	return total / time.Duration(n), counts
}

// TestPickerBeatsRoundRobinOnHeterogeneousFleet: a 1×/2×/4× fleet at 70%
// load. Round-robin gives the 1× endpoint a third of the traffic, more
// than it can serve (3.3 requests/s of 2000 tokens against 2), so its
// queue and the mean TTFT grow without bound over the run (21 s here).
// Least-in-flight (join the shortest queue) stays stable but still sends
// the 1× endpoint a fifth of the requests, which wait there four times as
// long (310 ms mean). The picker with the latency scorer alone and a
// Predictor learning from its own Done feedback must keep the mean TTFT
// under a quarter of round-robin's and at least 10% under
// least-in-flight's (it measured 249 ms, 20% under), send the 1× endpoint
// less than a fifth of the requests, and the 4× endpoint more than the 2×.
func TestPickerBeatsRoundRobinOnHeterogeneousFleet(t *testing.T) {
	const n = 2000
	start := time.Unix(1_700_000_000, 0)

	rrClk := &stepClock{t: start}
	rr := newQueueSim(rrClk, 1, 2, 4)
	next := 0
	rrMean, rrCounts := runFleet(t, rr, n, func(*signals.Request) (int, func(signals.Outcome)) {
		next++
		return next % 3, func(signals.Outcome) {}
	})

	// Least in flight (join the shortest queue), ties rotating: the
	// question the issue calls wrong for mixed fleets.
	jsqClk := &stepClock{t: start}
	jsq := newQueueSim(jsqClk, 1, 2, 4)
	turn := 0
	jsqMean, jsqCounts := runFleet(t, jsq, n, func(*signals.Request) (int, func(signals.Outcome)) {
		turn++
		best := -1
		for j := 0; j < 3; j++ {
			k := (turn + j) % 3
			if best < 0 || jsq.eps[k].InFlight() < jsq.eps[best].InFlight() {
				best = k
			}
		}
		ep := jsq.eps[best]
		ep.Dispatch(0)
		return best, func(signals.Outcome) { ep.Complete(0) }
	})

	clk := &stepClock{t: start}
	sim := newQueueSim(clk, 1, 2, 4)
	pred := latency.New(latency.Config{Clock: clk})
	reg := scorer.NewRegistry()
	require.NoError(t, reg.RegisterScorer("latency-under-test", scorer.NewLatencyScorerFromParams))
	p, err := picker.New(picker.Config{Scorers: []picker.Plugin{{Name: "latency-under-test", Weight: 1}}},
		picker.WithClock(clk), picker.WithSeed(5), picker.WithRegistry(reg), picker.WithLatencyEstimator(pred))
	require.NoError(t, err)
	p.SetEndpoints(sim.eps)
	index := map[*signals.Endpoint]int{sim.eps[0]: 0, sim.eps[1]: 1, sim.eps[2]: 2}
	mean, counts := runFleet(t, sim, n, func(req *signals.Request) (int, func(signals.Outcome)) {
		res, err := p.Pick(context.Background(), req)
		require.NoError(t, err)
		return index[res.Endpoint], res.Done
	})

	t.Logf("round-robin: mean TTFT %v, requests %v", rrMean, rrCounts)
	t.Logf("least-in-flight: mean TTFT %v, requests %v", jsqMean, jsqCounts)
	t.Logf("latency:     mean TTFT %v, requests %v", mean, counts)
	assert.Less(t, mean, rrMean/4)
	assert.Less(t, mean, jsqMean*9/10)
	assert.Less(t, counts[0], n/5, "the 1× endpoint's share")
	assert.Greater(t, counts[2], counts[1], "the 4× endpoint gets more than the 2×")
}
