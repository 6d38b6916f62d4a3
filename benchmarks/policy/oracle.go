package policy

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals"
)

// Oracle is the registry name of the perfect-information oracle.
const Oracle = "oracle"

// ErrNoInspector is returned by NewOracle when the host gives no Inspector
// (the oracle needs the simulator's lag-free view).
var ErrNoInspector = errors.New("policy: the oracle needs an Inspector (run it in the simulator)")

// oracleHitLimit is how many waiting requests per pod the oracle asks the
// engine's prefix cache about per pick; further ones count in full. It
// bounds the cost of a pick when queues are long; beyond it the queue is
// so long that the pod loses anyway.
const oracleHitLimit = 64

// oracleTransit is how many recent routings per pod the oracle remembers to
// know the size of the requests still on the wire (InTransit of them).
const oracleTransit = 64

// NewOracle returns the perfect-information oracle, the limit the other
// policies are measured against. At each arrival it reads every pod's live
// engine state through env.Inspector, without scrape lag, and sends the
// request to the pod with the smallest predicted time to first token,
// ties to the pod with fewer requests in flight, then at random.
//
// The prediction follows the engine's own scheduling (vLLM V1: running
// requests first, then waiting ones FCFS with chunked prefill under the
// step's token budget) and its hardware profile's step-time model
// (engine.Profile.StepTime):
//
//   - prefill work ahead = the uncached prompt tokens of every waiting
//     request (asking the pod's prefix cache, engine.PrefixHitTokens) and of
//     the requests still in transit to the pod, plus the request's own
//     uncached tokens on that pod;
//   - each step decodes one token for each running request and fills the
//     rest of the budget with that prefill, so the prefill drains in
//     ⌈work / (budget − running)⌉ steps of the profile's step time;
//   - when the prompt cannot get its KV blocks (or a sequence slot, or a
//     LoRA slot) it also waits for running requests to finish: the blocks
//     missing divided by the blocks a finishing request frees, at the rate
//     running requests finish (running / (mean remaining output × decode
//     step time)), the remaining output being known exactly (the oracle
//     reads the requests' true output lengths), half of it on average;
//   - a LoRA adapter not in the running batch costs its swap time.
//
// It is honest in two ways: it uses only state that exists at the moment
// of the decision (no future arrivals), and it is greedy, as every other
// policy is. Not safe for concurrent use.
func NewOracle(env Env) (Policy, error) {
	if env.Inspector == nil {
		return nil, ErrNoInspector
	}
	return &oracle{insp: env.Inspector, rng: newRand(env.Seed)}, nil
}

type oracle struct {
	accounting
	insp    Inspector
	rng     *rand.Rand
	pos     epIndex
	transit [][]int // per pod position: ring of recent routed prompt tokens
	next    []int
	buf     []*engine.Request
	pred    []float64
}

func (*oracle) Name() string { return Oracle }

func (p *oracle) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	n := p.pos.register(eps)
	for len(p.transit) < n {
		p.transit = append(p.transit, make([]int, oracleTransit))
		p.next = append(p.next, 0)
	}
	own := p.insp.EngineRequest(req)
	p.pred = p.pred[:0]
	for i, ep := range eps {
		v, ok := p.insp.Pod(ep)
		if !ok {
			p.pred = append(p.pred, math.Inf(1))
			continue
		}
		p.pred = append(p.pred, p.predict(v, p.pos.of(eps, i), own, req))
	}
	best, ties := 0, 0
	for i := range eps {
		switch {
		case i == 0 || p.pred[i] < p.pred[best] ||
			(p.pred[i] == p.pred[best] && eps[i].InFlight() < eps[best].InFlight()):
			best, ties = i, 1
		case p.pred[i] == p.pred[best] && eps[i].InFlight() == eps[best].InFlight():
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	k := p.pos.of(eps, best)
	p.transit[k][p.next[k]%oracleTransit] = req.PromptTokens
	p.next[k]++
	return p.choose(req, eps[best]), nil
}

// predict returns the predicted TTFT in seconds of the request on pod v.
func (p *oracle) predict(v PodView, k int, own *engine.Request, req *signals.Request) float64 {
	eng := v.Engine
	cfg := v.Config
	prof := &cfg.Profile
	st := eng.Stats()
	p.buf = eng.InFlight(p.buf[:0])
	running := p.buf[:min(st.Running, len(p.buf))]
	waiting := p.buf[len(running):]

	ownPrompt := req.PromptTokens
	ownUncached := ownPrompt
	if own != nil {
		ownPrompt = own.PromptTokens
		ownUncached = ownPrompt - eng.PrefixHitTokens(own)
	}

	// Prefill work ahead of the request, and the prompt tokens that need
	// fresh KV blocks.
	work, promptSum := ownUncached, ownUncached
	for i, r := range waiting {
		u := r.PromptTokens
		if i < oracleHitLimit {
			u -= eng.PrefixHitTokens(r)
		}
		work += u
		promptSum += r.PromptTokens
	}
	for j := 0; j < v.InTransit && j < oracleTransit; j++ {
		t := p.transit[k][(p.next[k]-1-j+2*oracleTransit)%oracleTransit]
		work += t
		promptSum += t
	}
	seqsAhead := len(waiting) + v.InTransit

	// The running batch: decode tokens per step, the KV they read, and how
	// soon its requests finish.
	d := len(running)
	ctx, remOut, outSum := 0, 0.0, 0
	for _, r := range running {
		ctx += r.PromptTokens + r.OutputTokens/2
		outSum += r.OutputTokens
	}
	if d > 0 {
		remOut = float64(outSum) / float64(d) / 2
	}
	budget := cfg.MaxNumBatchedTokens
	chunk := max(budget-d, budget/8)
	meanPrompt := float64(promptSum) / float64(1+seqsAhead)
	stepFull := prof.StepTime(d+chunk, float64(chunk)*min(meanPrompt, float64(chunk))/2, ctx, d+1).Seconds()
	steps := work / chunk
	rem := work - steps*chunk
	t := float64(steps) * stepFull
	if rem > 0 || steps == 0 {
		t += prof.StepTime(d+rem, float64(rem)*min(meanPrompt, float64(rem))/2, ctx, d+1).Seconds()
	}

	// Waiting for running requests to finish: KV blocks, sequence slots.
	decodeStep := prof.DecodeTime(max(d, 1), ctx/max(d, 1)).Seconds()
	finishRate := 0.0 // running requests finishing per second
	if d > 0 && remOut > 0 {
		finishRate = float64(d) / (remOut * decodeStep)
	}
	bs := max(cfg.BlockSize, 1)
	numBlocks := max(st.NumBlocks, 1)
	free := (1 - st.KVCacheUsage) * float64(numBlocks)
	need := float64((promptSum + bs - 1) / bs)
	deficit := need - free
	// Every request keeps its KV until it finishes, growing by its output:
	// when the pod's projected demand exceeds the cache, vLLM preempts and
	// recomputes, which the request pays for as if it had waited for the
	// excess to finish.
	projected := float64(ownPrompt) + float64(ownOut(own))
	heldByRunning := 0
	for _, r := range running {
		heldByRunning += r.PromptTokens + r.OutputTokens
	}
	projected += float64(heldByRunning)
	for _, r := range waiting {
		projected += float64(r.PromptTokens + r.OutputTokens)
	}
	projected += float64(work - ownUncached) // in transit and waiting, prompts only
	deficit = max(deficit, projected/float64(bs)-float64(numBlocks))
	if deficit > 0 {
		if finishRate > 0 {
			perFinish := float64(heldByRunning) / float64(d) / float64(bs)
			t += deficit / max(perFinish, 1) / finishRate
		} else if need > free {
			t += 3600 // cannot fit: effectively never
		}
	}
	if over := d + seqsAhead + 1 - cfg.MaxNumSeqs; over > 0 && finishRate > 0 {
		t += float64(over) / finishRate
	}

	// LoRA: a swap when the adapter is not in the running batch, and a wait
	// for a slot when every slot is taken by other adapters.
	if own != nil && own.Adapter != "" && !slices.Contains(st.RunningAdapters, own.Adapter) {
		t += cfg.LoRASwapTime.Seconds()
		if len(st.RunningAdapters) >= cfg.MaxLoRAs && finishRate > 0 {
			t += remOut * decodeStep
		}
	}
	return t
}

// ownOut is the request's true output length (the oracle's knowledge), 0
// when unknown.
func ownOut(r *engine.Request) int {
	if r == nil {
		return 0
	}
	return r.OutputTokens
}
