package policy

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/inferroute/inferroute/signals"
)

// Compile-time interface guards.
var (
	_ Policy = (*roundRobin)(nil)
	_ Policy = (*random)(nil)
	_ Policy = (*leastRequest)(nil)
)

// accounting does what the picker does for the baselines: Dispatch on pick,
// Complete on Done, with a pooled ticket so that a pick does not allocate in
// steady state.
type accounting struct {
	pool sync.Pool
}

type ticket struct {
	ep     *signals.Endpoint
	tokens int
	done   func(signals.Outcome)
	owner  *accounting
}

func (t *ticket) finish(signals.Outcome) {
	ep := t.ep
	if ep == nil {
		return
	}
	t.ep = nil
	ep.Complete(t.tokens)
	t.owner.pool.Put(t)
}

// choose records the dispatch of req to ep and returns the Choice.
func (a *accounting) choose(req *signals.Request, ep *signals.Endpoint) Choice {
	t, _ := a.pool.Get().(*ticket)
	if t == nil {
		t = &ticket{owner: a}
		t.done = t.finish
	}
	t.ep = ep
	t.tokens = req.PromptTokens
	ep.Dispatch(t.tokens)
	return Choice{Endpoint: ep, Done: t.done}
}

// newRand returns the PCG source every seeded policy here uses.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// NewRoundRobin returns the round-robin policy: the i-th request goes to
// eps[i mod len(eps)]. It ignores every signal. Safe for concurrent use.
func NewRoundRobin(Env) (Policy, error) { return &roundRobin{}, nil }

type roundRobin struct {
	accounting
	next atomic.Uint64
}

func (*roundRobin) Name() string { return RoundRobin }

func (p *roundRobin) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	i := (p.next.Add(1) - 1) % uint64(len(eps))
	return p.choose(req, eps[i]), nil
}

// NewRandom returns the uniform random policy, seeded from env.Seed. Safe
// for concurrent use.
func NewRandom(env Env) (Policy, error) { return &random{rng: newRand(env.Seed)}, nil }

type random struct {
	accounting
	mu  sync.Mutex
	rng *rand.Rand
}

func (*random) Name() string { return Random }

func (p *random) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	p.mu.Lock()
	i := p.rng.IntN(len(eps))
	p.mu.Unlock()
	return p.choose(req, eps[i]), nil
}

// NewLeastRequest returns the least-request policy: the endpoint with the
// fewest requests in flight from this process (signals.Endpoint.InFlight),
// ties broken uniformly at random (seeded from env.Seed). It scans every
// endpoint, the full form of Envoy's LEAST_REQUEST, whose default samples two
// (power of two choices, Mitzenmacher 2001): with one router and exact
// counts the full scan is the stronger baseline. Safe for concurrent use.
func NewLeastRequest(env Env) (Policy, error) {
	return &leastRequest{rng: newRand(env.Seed)}, nil
}

type leastRequest struct {
	accounting
	mu  sync.Mutex
	rng *rand.Rand
}

func (*leastRequest) Name() string { return LeastRequest }

func (p *leastRequest) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	best, ties := 0, 0
	bestLoad := int64(-1)
	p.mu.Lock()
	for i, ep := range eps {
		l := ep.InFlight()
		switch {
		case bestLoad < 0 || l < bestLoad:
			best, bestLoad, ties = i, l, 1
		case l == bestLoad:
			// Reservoir sampling over the tied endpoints.
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	p.mu.Unlock()
	return p.choose(req, eps[best]), nil
}
