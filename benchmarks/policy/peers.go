package policy

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/inferroute/inferroute/signals"
)

// Names of the peer policies: faithful re-implementations of the routing
// algorithms other inference gateways publish, from their documented
// formulas and defaults. Each sees only what the real system sees: scraped
// metrics with the simulator's scrape lag, its own dispatch counts, and its
// own index of the prompts it routed. None uses the Inspector.
const (
	// GIE is the Gateway API Inference Extension / llm-d inference
	// scheduler default profile: queue 2, KV cache 2, prefix 3, max-score.
	GIE = "llm-d"
	// SGLangCacheAware is SGLang router's cache_aware policy.
	SGLangCacheAware = "sglang-cache-aware"
	// DynamoKV is NVIDIA Dynamo's KV router.
	DynamoKV = "dynamo-kv"
	// AIBrixPrefix is AIBrix's prefix-cache router.
	AIBrixPrefix = "aibrix-prefix"
	// SGLangLeastLoad is the SGLang Model Gateway's least_load policy.
	SGLangLeastLoad = "sglang-least-load"
)

// Peers returns the peer policy names in the order reports list them.
func Peers() []string {
	return []string{GIE, SGLangCacheAware, DynamoKV, AIBrixPrefix, SGLangLeastLoad}
}

// All returns every policy of Default in report order: the baselines, the
// peers and the oracle.
func All() []string {
	return append(append(Baselines(), Peers()...), Oracle)
}

// registerPeers adds the peers and the oracle to r. Default calls it.
func registerPeers(r *Registry) error {
	for _, p := range []struct {
		name string
		f    Factory
	}{
		{GIE, NewGIE},
		{SGLangCacheAware, NewSGLangCacheAware},
		{DynamoKV, NewDynamoKV},
		{AIBrixPrefix, NewAIBrixPrefix},
		{SGLangLeastLoad, NewSGLangLeastLoad},
		{Oracle, NewOracle},
	} {
		if err := r.Register(p.name, p.f); err != nil {
			return err
		}
	}
	return nil
}

// tokensPerBlock is the number of prompt tokens one entry of
// signals.Request.PromptBlocks covers in the simulator: 64 bytes of text at
// 4 bytes per token (benchmarks/sim/prompt.go), the same 16 tokens as a
// vLLM KV block.
const tokensPerBlock = 16

// prefixIndex is a router-side approximate index of the prompt blocks each
// endpoint was sent: per endpoint an LRU set of chained block hashes, so
// the blocks endpoint i holds of a prompt are its leading hashes found in
// set i (a chained hash covers the whole prefix before it). This is the
// shape of the Gateway API Inference Extension's prefix plugin (hash chain,
// per-server LRU) and, matching whole blocks instead of characters, of
// SGLang's approximate radix tree with one tenant per worker. Not safe for
// concurrent use.
type prefixIndex struct {
	sets []*simplelru.LRU[uint64, struct{}]
	cap  int
}

func newPrefixIndex(n, capacity int) *prefixIndex {
	ix := &prefixIndex{cap: capacity}
	ix.resize(n)
	return ix
}

func (ix *prefixIndex) resize(n int) {
	for len(ix.sets) < n {
		s, err := simplelru.NewLRU[uint64, struct{}](ix.cap, nil)
		if err != nil {
			panic(err) // unreachable: capacity > 0
		}
		ix.sets = append(ix.sets, s)
	}
}

// match returns how many leading entries of blocks (at most limit, every
// step-th hash) endpoint i holds, in units of hashes examined.
func (ix *prefixIndex) match(i int, blocks []uint64, step, limit int) int {
	s := ix.sets[i]
	n := 0
	for k := step - 1; k < len(blocks) && n < limit; k += step {
		if !s.Contains(blocks[k]) {
			break
		}
		n++
	}
	return n
}

// insert records that endpoint i was sent blocks (every step-th hash, at
// most limit of them), refreshing their recency.
func (ix *prefixIndex) insert(i int, blocks []uint64, step, limit int) {
	s := ix.sets[i]
	n := 0
	for k := step - 1; k < len(blocks) && n < limit; k += step {
		s.Add(blocks[k], struct{}{})
		n++
	}
}

// size returns the number of hashes held for endpoint i.
func (ix *prefixIndex) size(i int) int { return ix.sets[i].Len() }

// epIndex maps endpoints to their position in the fleet slice last seen.
type epIndex struct {
	first *signals.Endpoint
	n     int
	pos   map[*signals.Endpoint]int
}

// of returns ep's position in eps (rebuilding the map when eps changed).
func (x *epIndex) of(eps []*signals.Endpoint, i int) int {
	if len(eps) != x.n || eps[0] != x.first {
		// Positions are by endpoint identity, stable across calls with the
		// same fleet; a new fleet starts a new mapping, keeping old entries
		// so that an endpoint keeps its history when it stays.
		if x.pos == nil {
			x.pos = make(map[*signals.Endpoint]int)
		}
		for _, ep := range eps {
			if _, ok := x.pos[ep]; !ok {
				x.pos[ep] = len(x.pos)
			}
		}
		x.first, x.n = eps[0], len(eps)
	}
	return x.pos[eps[i]]
}

// size returns the number of distinct endpoints seen.
func (x *epIndex) size() int { return len(x.pos) }

// register records the endpoints of eps (of does so on its first call for
// a new eps) and returns size.
func (x *epIndex) register(eps []*signals.Endpoint) int {
	if len(eps) > 0 {
		x.of(eps, 0)
	}
	return x.size()
}

// ---------------------------------------------------------------------------
// llm-d / Gateway API Inference Extension default profile.

// GIE prefix plugin defaults (gateway-api-inference-extension,
// pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go):
// DefaultMaxPrefixBlocks = 256 blocks matched at most, and
// DefaultLRUCapacityPerServer = 31250 blocks per server.
const (
	gieMaxPrefixBlocks = 256
	gieLRUCapacity     = 31250
)

// Weights of the default scheduling profile of the llm-d inference
// scheduler (llm-d/llm-d-inference-scheduler, deploy/config and the GIE
// "default" EPP config): prefix-cache-scorer 3, queue-scorer 2,
// kv-cache-utilization-scorer 2, with the max-score picker.
const (
	gieWeightQueue  = 2
	gieWeightKV     = 2
	gieWeightPrefix = 3
)

// NewGIE returns the llm-d / Gateway API Inference Extension default
// profile as a policy. Per endpoint it sums three scorers, each in [0, 1]:
//
//   - queue-scorer: (maxQueue − queue) / (maxQueue − minQueue) over the
//     candidates of the scraped waiting-queue size, 1 for all when they
//     are equal (GIE plugins/scorer/queue.go);
//   - kv-cache-utilization-scorer: 1 − scraped KV-cache usage (GIE
//     plugins/scorer/kvcache_utilization.go);
//   - prefix-cache-scorer: the fraction of the prompt's blocks the
//     router's own approximate index says the endpoint holds, the index
//     being updated with the chosen endpoint after each pick (GIE
//     plugins/multi/prefix/plugin.go, PreRequest);
//
// weighted 2, 2 and 3, and picks the maximum, ties at random (the
// max-score picker). Scraped values are used as published, with their lag
// and no local correction, as the extension does. An endpoint without a
// scrape yet counts as queue 0 and usage 0. Not safe for concurrent use.
func NewGIE(env Env) (Policy, error) {
	return &gie{rng: newRand(env.Seed), ix: newPrefixIndex(len(env.Endpoints), gieLRUCapacity)}, nil
}

type gie struct {
	accounting
	rng    *rand.Rand
	ix     *prefixIndex
	pos    epIndex
	scores []float64
}

func (*gie) Name() string { return GIE }

func (p *gie) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	p.ix.resize(p.pos.register(eps))
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for _, ep := range eps {
		q := scraped(ep).waiting
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	p.scores = p.scores[:0]
	total := min(len(req.PromptBlocks), gieMaxPrefixBlocks)
	for i, ep := range eps {
		s := scraped(ep)
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - s.waiting) / (maxQ - minQ)
		}
		kv := 1 - s.kv
		prefix := 0.0
		if total > 0 {
			prefix = float64(p.ix.match(p.pos.of(eps, i), req.PromptBlocks, 1, gieMaxPrefixBlocks)) / float64(total)
		}
		p.scores = append(p.scores, gieWeightQueue*queue+gieWeightKV*kv+gieWeightPrefix*prefix)
	}
	best := argmaxRandom(p.scores, p.rng)
	p.ix.insert(p.pos.of(eps, best), req.PromptBlocks, 1, gieMaxPrefixBlocks)
	return p.choose(req, eps[best]), nil
}

// scrapedView is the part of the last published scrape the peers read.
type scrapedView struct {
	waiting, running, kv float64
}

func scraped(ep *signals.Endpoint) scrapedView {
	m := ep.Metrics()
	if m == nil {
		return scrapedView{}
	}
	return scrapedView{waiting: m.Waiting.Value, running: m.Running.Value, kv: m.KVCacheUtilization.Value}
}

// argmaxRandom returns the index of the largest score, exact ties broken
// uniformly at random by reservoir sampling.
func argmaxRandom(scores []float64, rng *rand.Rand) int {
	best, ties := 0, 0
	for i, s := range scores {
		switch {
		case i == 0 || s > scores[best]:
			best, ties = i, 1
		case s == scores[best]:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// ---------------------------------------------------------------------------
// SGLang router cache_aware.

// SGLang router cache_aware defaults (sgl-project/sglang, sgl-router
// src/policies/cache_aware.rs and the SGLang Model Gateway docs,
// docs/advanced_features/sgl_model_gateway.md): cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2^26
// characters (in 64-character blocks here).
const (
	sglCacheThreshold = 0.3
	sglBalanceAbs     = 64
	sglBalanceRel     = 1.5
	sglMaxTreeBlocks  = (1 << 26) / 64
)

// NewSGLangCacheAware returns SGLang router's cache_aware policy. The
// load of a worker is the router's own count of requests in flight to it.
// When the fleet is imbalanced — max load − min load > 64 AND max load >
// 1.5 × min load — the request goes to the least-loaded worker (shortest
// queue). Otherwise the router matches the prompt against its approximate
// radix tree of what each worker was sent: if the best match covers more
// than 30% of the prompt, the worker with the longest match gets it;
// otherwise the worker whose tree is smallest (the most cache room). The
// prompt is then inserted into the chosen worker's tree. The tree matches
// whole 16-token blocks rather than characters; LRU eviction at
// max_tree_size stands in for the periodic eviction thread. Ties go to a
// random worker. Not safe for concurrent use.
func NewSGLangCacheAware(env Env) (Policy, error) {
	return &sglCacheAware{rng: newRand(env.Seed), ix: newPrefixIndex(len(env.Endpoints), sglMaxTreeBlocks)}, nil
}

type sglCacheAware struct {
	accounting
	rng *rand.Rand
	ix  *prefixIndex
	pos epIndex
	buf []float64
}

func (*sglCacheAware) Name() string { return SGLangCacheAware }

func (p *sglCacheAware) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	p.ix.resize(p.pos.register(eps))
	minL, maxL := int64(math.MaxInt64), int64(-1)
	for _, ep := range eps {
		l := ep.InFlight()
		minL, maxL = min(minL, l), max(maxL, l)
	}
	p.buf = p.buf[:0]
	var best int
	switch {
	case maxL-minL > sglBalanceAbs && float64(maxL) > sglBalanceRel*float64(minL):
		for _, ep := range eps {
			p.buf = append(p.buf, -float64(ep.InFlight()))
		}
		best = argmaxRandom(p.buf, p.rng)
	default:
		bestMatch := 0
		for i := range eps {
			m := p.ix.match(p.pos.of(eps, i), req.PromptBlocks, 1, len(req.PromptBlocks))
			p.buf = append(p.buf, float64(m))
			bestMatch = max(bestMatch, m)
		}
		if n := len(req.PromptBlocks); n > 0 && float64(bestMatch)/float64(n) > sglCacheThreshold {
			best = argmaxRandom(p.buf, p.rng)
		} else {
			for i := range eps {
				p.buf[i] = -float64(p.ix.size(p.pos.of(eps, i)))
			}
			best = argmaxRandom(p.buf, p.rng)
		}
	}
	p.ix.insert(p.pos.of(eps, best), req.PromptBlocks, 1, len(req.PromptBlocks))
	return p.choose(req, eps[best]), nil
}

// ---------------------------------------------------------------------------
// NVIDIA Dynamo KV router.

// Dynamo KV router defaults (ai-dynamo/dynamo, docs/router "KV Router":
// --kv-overlap-score-weight 1.0, --router-temperature 0.0; the approximate
// mode without KV events keeps the router's own routing decisions for a
// TTL of 120 s).
const (
	dynamoOverlapWeight = 1.0
	dynamoApproxTTLSecs = 120
	// dynamoMaxBlocks bounds the blocks remembered per worker, a memory
	// bound of this implementation (the TTL is the documented limit).
	dynamoMaxBlocks = 1 << 20
)

// NewDynamoKV returns NVIDIA Dynamo's KV router. For each worker it
// computes
//
//	cost = overlap_score_weight × potential_prefill_blocks + potential_active_blocks
//
// where potential_prefill_blocks is the request's prompt blocks not
// already cached on the worker, and potential_active_blocks is the
// distinct KV blocks of the requests the router has in flight to the
// worker plus the new request's blocks not among them (Dynamo's
// ActiveSequences: potential_blocks = new_blocks + active_blocks, a block
// shared by several requests in flight counting once; tracked by the
// router across each request's life). A prompt's blocks without a hash
// (past the hasher's limit) count as distinct. With temperature 0 it picks
// the minimum cost, ties at random. The overlap
// comes from the router's own index of what it routed (Dynamo's
// approximate mode, used when workers publish no KV events; the simulated
// pods do not publish any), entries expiring after 120 s. Not safe for
// concurrent use.
func NewDynamoKV(env Env) (Policy, error) {
	clock := env.Clock
	if clock == nil {
		clock = signals.SystemClock{}
	}
	return &dynamoKV{rng: newRand(env.Seed), clock: clock}, nil
}

type dynamoKV struct {
	rng   *rand.Rand
	clock signals.Clock
	pos   epIndex
	seen  []*simplelru.LRU[uint64, int64] // per worker: block hash → last routed (unix s)
	// Per worker position, the active blocks of the requests in flight:
	// held counts the requests holding each hashed block (a block shared
	// by several counts once), unhashed sums their blocks without a hash.
	held     []map[uint64]int32
	unhashed []int64
	buf      []float64
	pool     []*dynTicket
}

// active returns the distinct active blocks of worker position k.
func (p *dynamoKV) active(k int) int64 { return int64(len(p.held[k])) + p.unhashed[k] }

type dynTicket struct {
	p        *dynamoKV
	ep       *signals.Endpoint
	k        int
	hashes   []uint64 // the request's hashed blocks, held until it finishes
	unhashed int64
	tokens   int
	done     func(signals.Outcome)
}

func (t *dynTicket) finish(signals.Outcome) {
	if t.ep == nil {
		return
	}
	t.ep.Complete(t.tokens)
	held := t.p.held[t.k]
	for _, h := range t.hashes {
		if held[h]--; held[h] <= 0 {
			delete(held, h)
		}
	}
	t.p.unhashed[t.k] -= t.unhashed
	t.ep = nil
	t.hashes = t.hashes[:0]
	t.p.pool = append(t.p.pool, t)
}

func (*dynamoKV) Name() string { return DynamoKV }

func (p *dynamoKV) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	n := p.pos.register(eps)
	for len(p.held) < n {
		s, err := simplelru.NewLRU[uint64, int64](dynamoMaxBlocks, nil)
		if err != nil {
			return Choice{}, err
		}
		p.held = append(p.held, map[uint64]int32{})
		p.unhashed = append(p.unhashed, 0)
		p.seen = append(p.seen, s)
	}
	now := p.clock.Now().Unix()
	reqBlocks := int64((req.PromptTokens + tokensPerBlock - 1) / tokensPerBlock)
	p.buf = p.buf[:0]
	for i := range eps {
		k := p.pos.of(eps, i)
		overlap := 0
		for _, h := range req.PromptBlocks {
			t, ok := p.seen[k].Peek(h)
			if !ok || now-t > dynamoApproxTTLSecs {
				break
			}
			overlap++
		}
		// The request's blocks already active on the worker: a chained
		// hash stands for its whole prefix, so they are the leading ones.
		shared := 0
		for _, h := range req.PromptBlocks {
			if p.held[k][h] == 0 {
				break
			}
			shared++
		}
		prefill := float64(max(reqBlocks-int64(overlap), 0))
		cost := dynamoOverlapWeight*prefill + float64(p.active(k)+reqBlocks-int64(shared))
		p.buf = append(p.buf, -cost)
	}
	best := argmaxRandom(p.buf, p.rng)
	k := p.pos.of(eps, best)
	for _, h := range req.PromptBlocks {
		p.seen[k].Add(h, now)
	}
	var t *dynTicket
	if n := len(p.pool); n > 0 {
		t, p.pool = p.pool[n-1], p.pool[:n-1]
	} else {
		t = &dynTicket{p: p}
		t.done = t.finish
	}
	t.ep, t.k, t.tokens = eps[best], k, req.PromptTokens
	t.hashes = append(t.hashes[:0], req.PromptBlocks...)
	t.unhashed = max(reqBlocks-int64(len(req.PromptBlocks)), 0)
	for _, h := range t.hashes {
		p.held[k][h]++
	}
	p.unhashed[k] += t.unhashed
	eps[best].Dispatch(req.PromptTokens)
	return Choice{Endpoint: eps[best], Done: t.done}, nil
}

// ---------------------------------------------------------------------------
// AIBrix prefix-cache router.

// AIBrix prefix-cache defaults (vllm-project/aibrix,
// pkg/plugins/gateway/algorithms/prefix_cache.go and its README):
// AIBRIX_PREFIX_CACHE_BLOCK_SIZE 128 tokens, and a load imbalance when the
// running-request counts differ by more than 8
// (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT).
const (
	aibrixBlockTokens  = 128
	aibrixImbalanceAbs = 8
	aibrixLRUCapacity  = 1 << 20
)

// NewAIBrixPrefix returns AIBrix's prefix-cache router. If the gateway's
// own running-request counts differ by more than 8 between the busiest and
// the idlest pod, the least-loaded pod gets the request. Otherwise the
// prompt's 128-token blocks are matched against the router's prefix hash
// table of what it routed; among pods with a match, in decreasing order of
// match percentage (equal matches in increasing order of running count),
// the first whose running count is at most mean + standard deviation
// (sample, n−1) of all pods' counts is chosen; failing that, the
// least-loaded pod. The chosen pod is recorded for the prompt's blocks.
// Ties at random. Not safe for concurrent use.
func NewAIBrixPrefix(env Env) (Policy, error) {
	return &aibrix{rng: newRand(env.Seed), ix: newPrefixIndex(len(env.Endpoints), aibrixLRUCapacity)}, nil
}

type aibrix struct {
	accounting
	rng   *rand.Rand
	ix    *prefixIndex
	pos   epIndex
	buf   []float64
	order []int
}

func (*aibrix) Name() string { return AIBrixPrefix }

const aibrixStep = aibrixBlockTokens / tokensPerBlock

func (p *aibrix) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	p.ix.resize(p.pos.register(eps))
	minL, maxL := int64(math.MaxInt64), int64(-1)
	var sum float64
	for _, ep := range eps {
		l := ep.InFlight()
		minL, maxL = min(minL, l), max(maxL, l)
		sum += float64(l)
	}
	best := -1
	if maxL-minL <= aibrixImbalanceAbs {
		n := float64(len(eps))
		mean := sum / n
		var ss float64
		for _, ep := range eps {
			d := float64(ep.InFlight()) - mean
			ss += d * d
		}
		std := 0.0
		if len(eps) > 1 {
			std = math.Sqrt(ss / (n - 1))
		}
		// Match percentages; pods are then tried in decreasing order.
		p.buf = p.buf[:0]
		p.order = p.order[:0]
		total := len(req.PromptBlocks) / aibrixStep
		for i := range eps {
			m := 0.0
			if total > 0 {
				m = float64(p.ix.match(p.pos.of(eps, i), req.PromptBlocks, aibrixStep, total)) / float64(total)
			}
			p.buf = append(p.buf, m)
			if m > 0 {
				p.order = append(p.order, i)
			}
		}
		// Shuffle then stable-sort by decreasing match and, for equal
		// matches, increasing request count (AIBrix's
		// getTargetPodFromMatchedPods), so that full ties are in random
		// order.
		p.rng.Shuffle(len(p.order), func(a, b int) { p.order[a], p.order[b] = p.order[b], p.order[a] })
		sortStableBy(p.order, func(a, b int) bool {
			if p.buf[a] != p.buf[b] {
				return p.buf[a] > p.buf[b]
			}
			return eps[a].InFlight() < eps[b].InFlight()
		})
		for _, i := range p.order {
			if float64(eps[i].InFlight()) <= mean+std {
				best = i
				break
			}
		}
	}
	if best < 0 {
		p.buf = p.buf[:0]
		for _, ep := range eps {
			p.buf = append(p.buf, -float64(ep.InFlight()))
		}
		best = argmaxRandom(p.buf, p.rng)
	}
	p.ix.insert(p.pos.of(eps, best), req.PromptBlocks, aibrixStep, len(req.PromptBlocks))
	return p.choose(req, eps[best]), nil
}

// sortStableBy is an insertion sort (stable) of the small slice idx.
func sortStableBy(idx []int, less func(a, b int) bool) {
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && less(idx[j], idx[j-1]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

// ---------------------------------------------------------------------------
// SGLang Model Gateway least_load.

// NewSGLangLeastLoad returns the SGLang Model Gateway's least_load policy
// (sgl-project/sglang, sgl-model-gateway src/policies/least_load.rs): a
// worker's load is the sum of the request-text lengths of the requests the
// gateway has in flight to it, the request goes to the worker with the
// smallest load (the first such in order), and its length is added until
// it completes. Text length is proportional to prompt tokens here (4 bytes
// per token), so the load is the endpoint's in-flight prompt tokens.
// Safe for concurrent use.
func NewSGLangLeastLoad(Env) (Policy, error) { return &sglLeastLoad{}, nil }

type sglLeastLoad struct{ accounting }

func (*sglLeastLoad) Name() string { return SGLangLeastLoad }

func (p *sglLeastLoad) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	best := 0
	bestLoad := eps[0].InFlightTokens()
	for i := 1; i < len(eps); i++ {
		if l := eps[i].InFlightTokens(); l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return p.choose(req, eps[best]), nil
}
