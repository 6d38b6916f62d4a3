package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// DefaultBlockTokens is the content-block size of generated requests: one
// vLLM KV-cache block (vLLM's default block_size is 16 tokens), so that
// prefix sharing is resolved at the engine's granularity.
const DefaultBlockTokens = 16

// GenConfig describes a synthetic workload. The zero values of the
// optional fields mean "off": no Tenants is one anonymous tenant without a
// system prompt, nil Conversations is single-turn requests, nil LoRA is no
// adapters.
type GenConfig struct {
	// Name labels the workload and seeds its block-id space, so that two
	// workloads with different names never share generated blocks.
	Name string
	// Seed makes the workload reproducible: equal configs with equal seeds
	// give identical workloads.
	Seed uint64
	// N is the number of requests; must be > 0.
	N int
	// Arrivals is the arrival process of requests; required.
	Arrivals Arrivals
	// Lengths draws each request's own prompt text length (added to the
	// tenant's system prompt, and to the history in a conversation) and its
	// output length. Required unless every tenant has its own Lengths.
	Lengths LengthSampler
	// Tenants share the traffic by Weight; nil means one tenant named "".
	Tenants []Tenant
	// Conversations, if not nil, makes every request a turn of a
	// multi-turn conversation.
	Conversations *ConvConfig
	// LoRA, if not nil, gives a fraction of requests (of conversations,
	// with Conversations) a LoRA adapter.
	LoRA *LoRAConfig
	// BlockTokens is the content-block size; 0 means DefaultBlockTokens.
	BlockTokens int
	// Model is the model of tenants whose Model is ""; "" is the default
	// model.
	Model string
}

// Tenant is one client population of a generated workload.
type Tenant struct {
	// Name is copied into Request.Tenant and names the tenant's sessions.
	Name string
	// Weight is the tenant's share of requests (of conversations, with
	// Conversations); must be >= 0. If all weights are 0 the tenants share
	// equally.
	Weight float64
	// SystemPromptTokens is the length of each of the tenant's system
	// prompts; 0 means none. Every request of the tenant starts with one of
	// them; its full blocks are shared by all requests that use it.
	SystemPromptTokens int
	// SystemPrompts is the number of distinct system prompts, chosen
	// uniformly per request; 0 means 1 when SystemPromptTokens > 0.
	SystemPrompts int
	// Priority is copied into Request.Priority.
	Priority int
	// Model overrides GenConfig.Model for this tenant when not "".
	Model string
	// Lengths overrides GenConfig.Lengths for this tenant when not nil.
	Lengths LengthSampler
}

// ConvConfig makes requests turns of multi-turn conversations. A pool of
// Sessions conversations is open at any time; each arrival continues one of
// the open conversations whose last turn arrived at least ThinkTime ago
// (chosen uniformly; if none is ready, the one that has waited longest).
// A conversation lasts a geometrically distributed number of turns with
// mean TurnsMean, then its slot starts a new one.
//
// Turn k's prompt is turn k-1's prompt, plus turn k-1's answer, plus a new
// user message (its length drawn from the tenant's LengthSampler), so
// prompts really grow: turn k's Blocks begin with all full blocks of turn
// k-1's prompt, and the rest of its blocks are new.
type ConvConfig struct {
	// Sessions is the number of concurrently open conversations; must be
	// > 0. More sessions interleave more histories, which stresses the
	// prefix caches.
	Sessions int
	// TurnsMean is the mean number of turns per conversation; must be >= 1.
	TurnsMean float64
	// ThinkTime is the minimum time between two turns of one conversation
	// (the user reads the answer and types); >= 0.
	ThinkTime time.Duration
	// MaxPromptTokens ends a conversation whose next prompt would exceed
	// it (the model's context limit); 0 means no limit.
	MaxPromptTokens int
}

// LoRAConfig gives requests LoRA adapters with Zipf popularity: adapter
// "lora-i" (i from 0) has probability proportional to 1/(i+1)^ZipfS, so
// lora-0 is the most popular.
type LoRAConfig struct {
	// Adapters is the number of distinct adapters; must be > 0.
	Adapters int
	// ZipfS is the Zipf exponent, >= 0 (0 is uniform; about 1 is typical).
	ZipfS float64
	// Fraction is the probability in [0, 1] that a request (conversation)
	// uses an adapter at all.
	Fraction float64
}

// Random streams of a generator: arrivals and content draw from separate
// PCG streams so that changing tenants or lengths leaves arrival times
// unchanged.
const (
	streamArrivals = 0x6172_7269_7661_6c73 // "arrivals"
	streamContent  = 0x636f_6e74_656e_7473 // "contents"
)

// AdapterName returns the name of the i-th most popular adapter, "lora-i".
func AdapterName(i int) string { return fmt.Sprintf("lora-%d", i) }

// Generate builds the workload described by cfg. It is deterministic: the
// same cfg (including Seed) gives the same requests, block ids and
// arrivals. Stateful arrival processes (those implementing Resetter) are
// reset first, then used by this call only; Generate is otherwise free of
// side effects. It returns an error for an invalid configuration.
func Generate(cfg GenConfig) (*Workload, error) {
	g, err := newGenerator(cfg)
	if err != nil {
		return nil, fmt.Errorf("workload: Generate: %w", err)
	}
	return g.run(), nil
}

type generator struct {
	cfg      GenConfig
	bt       int
	tenants  []Tenant
	cumW     []float64    // cumulative tenant weights
	tHash    []uint64     // hashed tenant names
	sys      [][][]uint64 // per tenant, per system prompt: its full-block ids
	loraCum  []float64    // cumulative Zipf weights
	adapters []string
	nameHash uint64
	rng      *rand.Rand // content stream
}

func newGenerator(cfg GenConfig) (*generator, error) {
	if cfg.N <= 0 {
		return nil, fmt.Errorf("request count N = %d, want > 0", cfg.N)
	}
	if cfg.Arrivals == nil {
		return nil, errors.New("no Arrivals process")
	}
	if v, ok := cfg.Arrivals.(validator); ok {
		if err := v.validate(); err != nil {
			return nil, err
		}
	}
	g := &generator{cfg: cfg, bt: cfg.BlockTokens, tenants: cfg.Tenants, nameHash: hashString(cfg.Name)}
	if g.bt == 0 {
		g.bt = DefaultBlockTokens
	}
	if g.bt < 0 {
		return nil, fmt.Errorf("BlockTokens = %d, want >= 0", cfg.BlockTokens)
	}
	if len(g.tenants) == 0 {
		g.tenants = []Tenant{{Weight: 1}}
	}
	total := 0.0
	for i, t := range g.tenants {
		if !(t.Weight >= 0) || math.IsInf(t.Weight, 0) {
			return nil, fmt.Errorf("tenant %q: weight %v, want finite and >= 0", t.Name, t.Weight)
		}
		if t.SystemPromptTokens < 0 || t.SystemPrompts < 0 {
			return nil, fmt.Errorf("tenant %q: negative system prompt size or count", t.Name)
		}
		if t.Lengths == nil && cfg.Lengths == nil {
			return nil, fmt.Errorf("tenant %q: no LengthSampler (set GenConfig.Lengths or Tenant.Lengths)", t.Name)
		}
		for _, u := range g.tenants[:i] {
			if u.Name == t.Name {
				return nil, fmt.Errorf("duplicate tenant name %q", t.Name)
			}
		}
		total += t.Weight
	}
	g.cumW = make([]float64, len(g.tenants))
	acc := 0.0
	for i, t := range g.tenants {
		w := t.Weight
		if total == 0 {
			w = 1
		}
		acc += w
		g.cumW[i] = acc
	}
	g.tHash = make([]uint64, len(g.tenants))
	g.sys = make([][][]uint64, len(g.tenants))
	for ti, t := range g.tenants {
		g.tHash[ti] = hashString(t.Name)
		if t.SystemPromptTokens == 0 {
			continue
		}
		n := max(t.SystemPrompts, 1)
		full := t.SystemPromptTokens / g.bt
		g.sys[ti] = make([][]uint64, n)
		for p := range n {
			ids := make([]uint64, full)
			base := idBase(cfg.Seed, g.nameHash, tagSystemPrompt, g.tHash[ti], uint64(p))
			for b := range ids {
				ids[b] = blockID(nsGenerated, base, b)
			}
			g.sys[ti][p] = ids
		}
	}
	if c := cfg.Conversations; c != nil {
		switch {
		case c.Sessions <= 0:
			return nil, fmt.Errorf("Conversations.Sessions = %d, want > 0", c.Sessions)
		case !(c.TurnsMean >= 1) || math.IsInf(c.TurnsMean, 0):
			return nil, fmt.Errorf("Conversations.TurnsMean = %v, want finite and >= 1", c.TurnsMean)
		case c.ThinkTime < 0:
			return nil, fmt.Errorf("Conversations.ThinkTime = %v, want >= 0", c.ThinkTime)
		case c.MaxPromptTokens < 0:
			return nil, fmt.Errorf("Conversations.MaxPromptTokens = %d, want >= 0", c.MaxPromptTokens)
		}
	}
	if l := cfg.LoRA; l != nil {
		switch {
		case l.Adapters <= 0:
			return nil, fmt.Errorf("LoRA.Adapters = %d, want > 0", l.Adapters)
		case !(l.ZipfS >= 0) || math.IsInf(l.ZipfS, 0):
			return nil, fmt.Errorf("LoRA.ZipfS = %v, want finite and >= 0", l.ZipfS)
		case !(l.Fraction >= 0 && l.Fraction <= 1):
			return nil, fmt.Errorf("LoRA.Fraction = %v, want in [0, 1]", l.Fraction)
		}
		g.loraCum = make([]float64, l.Adapters)
		g.adapters = make([]string, l.Adapters)
		acc := 0.0
		for i := range l.Adapters {
			acc += math.Pow(float64(i+1), -l.ZipfS)
			g.loraCum[i] = acc
			g.adapters[i] = AdapterName(i)
		}
	}
	return g, nil
}

// pickCum draws an index with probability proportional to the increments
// of the cumulative weights cum.
func (g *generator) pickCum(cum []float64) int {
	x := g.rng.Float64() * cum[len(cum)-1]
	i, _ := slices.BinarySearch(cum, x)
	// BinarySearch finds the first cum >= x; an exact hit on a boundary
	// belongs to the next bucket.
	for i < len(cum)-1 && cum[i] <= x {
		i++
	}
	return i
}

// start describes the fixed part of a new request or conversation.
type start struct {
	tenant  int
	sys     []uint64 // full system-prompt blocks
	sysTok  int
	adapter string
}

func (g *generator) newStart() start {
	ti := g.pickCum(g.cumW)
	s := start{tenant: ti}
	if ps := g.sys[ti]; len(ps) > 0 {
		s.sys = ps[g.rng.IntN(len(ps))]
		s.sysTok = g.tenants[ti].SystemPromptTokens
	}
	if l := g.cfg.LoRA; l != nil && g.rng.Float64() < l.Fraction {
		s.adapter = g.adapters[g.pickCum(g.loraCum)]
	}
	return s
}

func (g *generator) lengths(ti int) (user, out int) {
	ls := g.tenants[ti].Lengths
	if ls == nil {
		ls = g.cfg.Lengths
	}
	user, out = ls.Sample(g.rng)
	return max(user, 1), max(out, 1)
}

// blocks returns the block ids of a prompt of promptTokens tokens whose
// first len(prefix) blocks are prefix and whose other blocks are new text
// of request idx.
func (g *generator) blocks(prefix []uint64, promptTokens int, tenant int, idx int) []uint64 {
	n := (promptTokens + g.bt - 1) / g.bt
	ids := make([]uint64, n)
	copy(ids, prefix)
	base := idBase(g.cfg.Seed, g.nameHash, tagOwnText, g.tHash[tenant], uint64(idx))
	for b := len(prefix); b < n; b++ {
		ids[b] = blockID(nsGenerated, base, b)
	}
	return ids
}

func (g *generator) request(s start, arrival time.Duration) Request {
	t := g.tenants[s.tenant]
	model := t.Model
	if model == "" {
		model = g.cfg.Model
	}
	return Request{
		Arrival:     arrival,
		Tenant:      t.Name,
		Model:       model,
		Adapter:     s.adapter,
		BlockTokens: g.bt,
		Priority:    t.Priority,
	}
}

// conversation is one open slot of the conversation pool.
type conversation struct {
	live      bool
	start     start
	name      string
	turnsLeft int
	last      time.Duration // arrival of the last turn
	prompt    int           // last turn's prompt tokens
	output    int           // last turn's output tokens
	blocks    []uint64      // last turn's blocks
}

// turns draws a conversation length from the geometric distribution on
// {1, 2, ...} with mean m: P(k) = (1-p)^(k-1) p, p = 1/m, by inversion.
func (g *generator) turns(m float64) int {
	p := 1 / m
	if p >= 1 {
		return 1
	}
	u := 1 - g.rng.Float64() // (0, 1]
	k := 1 + math.Floor(math.Log(u)/math.Log1p(-p))
	return int(min(k, 1<<30))
}

func (g *generator) run() *Workload {
	cfg := g.cfg
	if r, ok := cfg.Arrivals.(Resetter); ok {
		r.Reset()
	}
	arr := rand.New(rand.NewPCG(cfg.Seed, streamArrivals))
	g.rng = rand.New(rand.NewPCG(cfg.Seed, streamContent))
	w := &Workload{Name: cfg.Name, Requests: make([]Request, cfg.N)}
	var pool []conversation
	if cfg.Conversations != nil {
		pool = make([]conversation, cfg.Conversations.Sessions)
	}
	ready := make([]int, 0, len(pool))
	serial := 0
	var now time.Duration
	for i := range w.Requests {
		gap := cfg.Arrivals.Next(arr)
		if gap > math.MaxInt64-now {
			now = math.MaxInt64
		} else {
			now += max(gap, 0)
		}
		if pool == nil {
			s := g.newStart()
			user, out := g.lengths(s.tenant)
			req := g.request(s, now)
			req.PromptTokens = s.sysTok + user
			req.OutputTokens = out
			req.Blocks = g.blocks(s.sys, req.PromptTokens, s.tenant, i)
			w.Requests[i] = req
			continue
		}
		// Pick the conversation this arrival continues.
		ready = ready[:0]
		oldest := 0
		for c := range pool {
			if !pool[c].live || now-pool[c].last >= cfg.Conversations.ThinkTime {
				ready = append(ready, c)
			}
			if pool[c].last < pool[oldest].last {
				oldest = c
			}
		}
		ci := oldest
		if len(ready) > 0 {
			ci = ready[g.rng.IntN(len(ready))]
		}
		c := &pool[ci]
		if c.live && c.turnsLeft > 0 {
			user, out := g.lengths(c.start.tenant)
			next := c.prompt + c.output + user
			if m := cfg.Conversations.MaxPromptTokens; m > 0 && next > m {
				c.live = false // context full: the user starts over
			} else {
				req := g.request(c.start, now)
				req.PromptTokens = next
				req.OutputTokens = out
				req.Session = c.name
				req.Blocks = g.blocks(c.blocks[:c.prompt/g.bt], next, c.start.tenant, i)
				g.advance(c, req)
				w.Requests[i] = req
				continue
			}
		}
		// A new conversation in this slot.
		serial++
		s := g.newStart()
		*c = conversation{
			live:      true,
			start:     s,
			name:      sessionName(g.tenants[s.tenant].Name, serial),
			turnsLeft: g.turns(cfg.Conversations.TurnsMean),
		}
		user, out := g.lengths(s.tenant)
		req := g.request(s, now)
		req.PromptTokens = s.sysTok + user
		req.OutputTokens = out
		req.Session = c.name
		req.Blocks = g.blocks(s.sys, req.PromptTokens, s.tenant, i)
		g.advance(c, req)
		w.Requests[i] = req
	}
	return w
}

// sessionName names the serial-th conversation: "tenant/conv-N", or
// "conv-N" for the anonymous tenant.
func sessionName(tenant string, serial int) string {
	if tenant == "" {
		return fmt.Sprintf("conv-%d", serial)
	}
	return fmt.Sprintf("%s/conv-%d", tenant, serial)
}

// advance records req as the latest turn of c.
func (g *generator) advance(c *conversation, req Request) {
	c.turnsLeft--
	c.last = req.Arrival
	c.prompt = req.PromptTokens
	c.output = req.OutputTokens
	c.blocks = req.Blocks
}
