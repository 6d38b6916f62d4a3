package picker

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
)

// DoneInfo is the outcome of a picked request, reported through
// Result.Done.
type DoneInfo = signals.Outcome

// Result is the outcome of a successful Pick.
type Result struct {
	// Endpoint is the chosen endpoint.
	Endpoint *signals.Endpoint
	// Fallbacks are the next-best endpoints, best first, for retries. The
	// slice is owned by the picker and valid only until Done is called:
	// copy it if you need it afterwards.
	Fallbacks []*signals.Endpoint
	// Done must be called exactly once with the outcome, whether the request
	// succeeded, failed, or was abandoned (a cancelled context included):
	// it releases the endpoint's in-flight accounting and feeds the outcome
	// to the signals. Calls after the first are no-ops. Never nil, also in
	// the Result returned with an error. Done may be wrapped: keep the
	// previous function and call it.
	Done func(DoneInfo)
	// Breakdown explains the decision: each candidate's score from each
	// scorer. Like Fallbacks, it is valid only until Done is called.
	Breakdown Breakdown

	tokens int // the uncached prompt tokens the pick counted as prefilling
}

// FirstToken reports that the request's first response byte arrived from
// the endpoint: its prompt is prefilled, so it leaves the endpoint's
// prefill queue (signals.Endpoint.Prefilling) while it decodes. Calling it
// is optional; without it the request counts as prefilling until Done,
// which makes the prefill scorer see decoding requests as queued work. A
// proxy calls it when the first body byte arrives (router.Proxy does).
// Calls after the first, after Done, and on the Result of a failed pick
// are no-ops. It is safe to call concurrently with Done, does not block
// and does not allocate.
func (r Result) FirstToken() {
	rec := r.Breakdown.rec
	if rec != nil && rec.prefill.CompareAndSwap(r.Breakdown.gen+1, 0) {
		r.Endpoint.EndPrefill(r.tokens)
	}
}

// noopDone is the Done of failed picks.
func noopDone(DoneInfo) {}

// Picker chooses an endpoint per request: filters, then weighted scorers,
// then a selection strategy. It is safe for concurrent use. Pick never
// blocks on I/O and takes no lock of its own: it reads an immutable
// endpoint snapshot and an immutable compiled configuration, both swapped
// atomically by writers (SetEndpoints, Reconfigure). The plugins and
// observers it calls may take short locks; the default prefix index and
// latency predictor do (see the package documentation).
type Picker struct {
	opts      options
	observers []signals.Observer
	inst      instruments
	tracer    trace.Tracer

	eps   atomic.Pointer[[]*signals.Endpoint]
	cfg   atomic.Pointer[compiled]
	seq   atomic.Uint64
	rotor atomic.Uint64 // round-robin position for banded ties

	records sync.Pool
	// inputs holds the filters' and scorers' working memory (the memo of
	// candidate loads), apart from the records: it is needed only while a
	// pick runs, so a few stay warm in cache however many picks await
	// their Done.
	inputs sync.Pool
}

// New returns a Picker with configuration cfg and no endpoints. It fails
// if cfg is invalid; the error names the bad field and value.
func New(cfg Config, opts ...Option) (*Picker, error) {
	p := &Picker{}
	p.opts.seed = 1
	for _, o := range opts {
		o(&p.opts)
	}
	if p.opts.clock == nil {
		p.opts.clock = signals.SystemClock{}
	}
	if p.opts.logger == nil {
		p.opts.logger = slog.New(slog.DiscardHandler)
	}
	if p.opts.registry == nil {
		p.opts.registry = scorer.NewRegistry()
	}
	if err := p.defaultSources(cfg); err != nil {
		return nil, err
	}
	if o, ok := p.opts.matcher.(signals.Observer); ok {
		p.observers = append(p.observers, o)
	}
	if o, ok := p.opts.estimator.(signals.Observer); ok && any(p.opts.estimator) != any(p.opts.matcher) {
		p.observers = append(p.observers, o)
	}
	p.observers = append(p.observers, p.opts.observers...)
	if p.opts.tracer != nil {
		p.tracer = p.opts.tracer.Tracer(instrumentationName)
	}
	if err := p.inst.init(p.opts.meter, p.opts.meterAttr); err != nil {
		return nil, err
	}
	empty := []*signals.Endpoint{}
	p.eps.Store(&empty)
	if err := p.Reconfigure(cfg); err != nil {
		return nil, err
	}
	p.records.New = func() any {
		r := &record{p: p}
		r.rand = rand.New(&r.rng)
		return r
	}
	return p, nil
}

// defaultSources gives the picker its own prefix index and latency
// predictor when the caller supplied none, so that DefaultConfig's prefix
// and latency scorers work out of the box. Pass
// WithPrefixMatcher(signals.NoPrefixMatcher{}) or
// WithLatencyEstimator(signals.NoLatencyEstimator{}) to run without them.
func (p *Picker) defaultSources(cfg Config) error {
	if p.opts.matcher == nil {
		idx, err := prefix.NewIndex(prefix.IndexConfig{})
		if err != nil {
			return err
		}
		p.opts.matcher = idx
	}
	if p.opts.estimator == nil {
		hl := time.Duration(cfg.StalenessHalfLife)
		if hl <= 0 {
			hl = DefaultHalfLife
		}
		p.opts.estimator = latency.New(latency.Config{Clock: p.opts.clock, HalfLife: hl})
	}
	return nil
}

// Check reports the error Reconfigure would return for cfg, without
// applying it: a caller that reconfigures several pickers together (a
// gateway reloading every pool from one file) checks them all first, so
// that a bad pool leaves every picker as it was.
func (p *Picker) Check(cfg Config) error {
	_, err := p.compile(cfg)
	return err
}

// compile compiles cfg against the picker's plugin registry and signal
// sources.
func (p *Picker) compile(cfg Config) (*compiled, error) {
	env := scorer.Env{Matcher: p.opts.matcher, Estimator: p.opts.estimator}
	c, err := compile(cfg, p.opts.registry, env)
	if err != nil {
		return nil, fmt.Errorf("picker config: %w", err)
	}
	return c, nil
}

// Reconfigure validates cfg and swaps it into the running picker
// atomically. Picks in progress finish with the configuration they started
// with; outstanding Results keep working and their Done is unaffected. On
// error the current configuration stays in force.
func (p *Picker) Reconfigure(cfg Config) error {
	c, err := p.compile(cfg)
	if err != nil {
		return err
	}
	p.cfg.Store(c)
	return nil
}

// SetEndpoints replaces the set of candidate endpoints. The picker keeps
// its own copy of the slice (not of the endpoints, whose counters must
// outlive snapshots), without nils and with each endpoint once, so that a
// pick's fallbacks are distinct. Safe to call concurrently with Pick. A prefix matcher
// or latency estimator with a Retain([]*signals.Endpoint) method is told
// the new set, so the state of endpoints that left is freed.
func (p *Picker) SetEndpoints(eps []*signals.Endpoint) {
	snap := make([]*signals.Endpoint, 0, len(eps))
	for _, ep := range eps {
		if ep != nil && !slices.Contains(snap, ep) {
			snap = append(snap, ep)
		}
	}
	p.eps.Store(&snap)
	type retainer interface{ Retain([]*signals.Endpoint) }
	if r, ok := p.opts.matcher.(retainer); ok {
		r.Retain(snap)
	}
	if r, ok := p.opts.estimator.(retainer); ok {
		r.Retain(snap)
	}
	p.inst.retain(snap)
}

// Close unregisters the picker's metric callback from the meter provider
// (WithMeterProvider), so that a picker dropped for good (a gateway's
// pool removed by a reload) is no longer called at each collection and
// its per-endpoint counts (inferroute.picks,
// inferroute.requests.completed) stop being reported; the series of its
// synchronous instruments (pick duration, pick errors) stay, as the SDK
// keeps every series recorded. The picker itself keeps working: picks,
// and the Done of picks in flight, are served as before. Close is
// idempotent, as metric.Registration.Unregister is bound to be.
func (p *Picker) Close() error { return p.inst.close() }

// Endpoints returns the current endpoint snapshot. The slice must not be
// modified.
func (p *Picker) Endpoints() []*signals.Endpoint { return *p.eps.Load() }

// zeroRequest stands in for a nil *signals.Request. It is never written.
var zeroRequest signals.Request

// Pick chooses an endpoint for req. A nil req is treated as a zero Request.
//
// Errors, all of type *Error:
//   - ErrNoEndpoints when the pool is empty, or when a filter removes every
//     candidate and the configuration fails closed (Stage "filter", Plugin
//     naming the filter). Failing open, a filter that would remove every
//     candidate is skipped instead.
//   - ErrSaturated when the admission check rejects the request (Stage
//     "admission"): answer 429 and let the client retry.
//
// On error the Result's Done is a no-op and nothing was dispatched. On
// success the caller must call Result.Done exactly once.
func (p *Picker) Pick(ctx context.Context, req *signals.Request) (Result, error) {
	if req == nil {
		req = &zeroRequest
	}
	clock := p.opts.clock
	now := clock.Now()
	cfg := p.cfg.Load()
	eps := *p.eps.Load()
	if len(eps) == 0 {
		return p.fail(ctx, now, &Error{Err: ErrNoEndpoints, Stage: "pool", Reason: "no endpoints configured"})
	}

	var span trace.Span
	if p.tracer != nil {
		ctx, span = p.tracer.Start(ctx, "inferroute.Pick")
		defer span.End()
	}

	rec := p.records.Get().(*record)
	rec.cfg = cfg
	rec.req = req
	rec.cands = append(rec.cands[:0], eps...)
	in, _ := p.inputs.Get().(*scorer.Input)
	if in == nil {
		in = new(scorer.Input)
	}
	in.Reset(req, rec.cands, now)
	rec.in = in

	for _, f := range cfg.filters {
		kept := f.filter.Filter(ctx, in)
		if len(kept) > 0 {
			in.Keep(kept)
			continue
		}
		if cfg.failClosed {
			e := &Error{Err: ErrNoEndpoints, Stage: "filter", Plugin: f.name, Candidates: len(in.Endpoints),
				Reason: "every candidate was filtered out"}
			p.release(rec)
			return p.fail(ctx, now, e)
		}
	}
	n := len(in.Endpoints)
	rec.grow(n, len(cfg.scorers))

	in.Cached = rec.cached[:n]
	if p.opts.matcher != nil && len(req.PromptBlocks) > 0 {
		p.opts.matcher.Match(req, in.Endpoints, in.Cached)
		for i, v := range in.Cached {
			if !(v >= 0 && v <= 1) { // also NaN
				in.Cached[i] = scorer.Clamp01(v)
			}
		}
	} else {
		clear(in.Cached)
	}

	if a := p.opts.admitter; a != nil {
		if ok, reason := a.Admit(ctx, in); !ok {
			e := &Error{Err: ErrSaturated, Stage: "admission", Candidates: n, Reason: reason}
			p.release(rec)
			return p.fail(ctx, now, e)
		}
	}

	for s, w := range cfg.scorers {
		row := rec.scores[s*n : (s+1)*n]
		raw := rec.raw[s*n : (s+1)*n]
		in.Raw = raw
		if cfg.normalized[s] {
			// The scorer writes every raw entry and scores in [0, 1].
			w.Scorer.Score(ctx, in, row)
			continue
		}
		copy(raw, rec.nans[:n])
		w.Scorer.Score(ctx, in, row)
		for i, v := range row {
			row[i] = scorer.Clamp01(v)
		}
	}
	in.Raw = nil
	total := rec.total[:n]
	weightedSum(total, rec.scores[:len(cfg.scorers)*n], cfg.weights)
	rec.n = n

	rec.rng.Seed(p.opts.seed, p.seq.Add(1))
	best := choose(cfg, total, rec.rand, &p.rotor)
	rec.ep = in.Endpoints[best]
	rec.fallbacks = rankFallbacks(rec.fallbacks[:0], in.Endpoints, total, best, cfg.fallbacks)
	rec.eps = in.Endpoints
	p.releaseInput(rec)
	p.dispatch(rec, rec.cached[best], now)
	ep := rec.ep

	if span != nil && span.IsRecording() {
		p.annotate(span, rec, best)
	}
	if p.inst.enabled {
		p.inst.picked(ctx, ep, clock.Now().Sub(now))
	}
	if l := p.opts.logger; l.Enabled(ctx, slog.LevelDebug) {
		l.LogAttrs(ctx, slog.LevelDebug, "picked", slog.String("endpoint", ep.Name),
			slog.Int("candidates", n), slog.Float64("score", total[best]), slog.String("request", req.ID))
	}
	return rec.result(), nil
}

// dispatch accounts rec's request as sent to rec.ep, of whose prompt the
// fraction cached is in the endpoint's prefix cache: its in-flight and
// prefill counters, its dispatch and adapter notes, and the observers.
func (p *Picker) dispatch(rec *record, cached float64, now time.Time) {
	ep, req := rec.ep, rec.req
	rec.mark = ep.HealthMark()
	rec.epGen = ep.Generation()
	rec.tokens = int(float64(req.PromptTokens) * (1 - cached))
	ep.Dispatch(rec.tokens)
	ep.StartPrefill(rec.tokens)
	ep.NoteDispatch(now)
	ep.NoteAdapter(req.Adapter, now)
	for _, o := range p.observers {
		o.Dispatched(req, ep)
	}
}

// result hands out the dispatched rec as a Result.
func (rec *record) result() Result {
	gen := rec.gen.Load()
	rec.prefill.Store(gen + 1)
	return Result{
		tokens:    rec.tokens,
		Endpoint:  rec.ep,
		Fallbacks: rec.fallbacks,
		Done:      func(info DoneInfo) { rec.finish(gen, info) },
		Breakdown: Breakdown{rec: rec, gen: gen},
	}
}

// Assign accounts req as sent to ep without a pick: a retry on one of a
// Result's fallbacks, or on an endpoint the caller chose itself. ep is
// dispatched as Pick dispatches its choice, so the signals learn of the
// request: its in-flight and prefill counters (less the share of the
// prompt the prefix matcher finds cached on ep), the observers (the prefix
// index records the prompt on ep, the latency predictor times it) and the
// picker's counts. No filter, scorer or admission check runs, and ep need
// not be one of the picker's endpoints. The Result's Done and FirstToken
// behave as a pick's, and Done must be called exactly once; it has no
// Fallbacks and an empty Breakdown. A nil req is treated as a zero
// Request, a nil ep is a programming error (Assign panics).
func (p *Picker) Assign(ctx context.Context, req *signals.Request, ep *signals.Endpoint) Result {
	if ep == nil {
		panic("picker: Assign with a nil endpoint")
	}
	if req == nil {
		req = &zeroRequest
	}
	now := p.opts.clock.Now()
	rec := p.records.Get().(*record)
	rec.cfg = p.cfg.Load()
	rec.req, rec.ep = req, ep
	rec.n, rec.eps, rec.fallbacks = 0, nil, rec.fallbacks[:0]
	cached := 0.0
	if p.opts.matcher != nil && len(req.PromptBlocks) > 0 {
		rec.grow(1, 0)
		rec.cands = append(rec.cands[:0], ep)
		p.opts.matcher.Match(req, rec.cands[:1], rec.cached[:1])
		cached = scorer.Clamp01(rec.cached[0]) // also NaN
	}
	p.dispatch(rec, cached, now)
	if p.inst.enabled {
		p.inst.counts(ep).picked.Add(1)
	}
	return rec.result()
}

func (p *Picker) fail(ctx context.Context, now time.Time, e *Error) (Result, error) {
	if p.inst.enabled {
		p.inst.failed(ctx, e, p.opts.clock.Now().Sub(now))
	}
	return Result{Done: noopDone}, e
}

// release returns a record that was not handed out.
func (p *Picker) release(rec *record) {
	p.releaseInput(rec)
	rec.req, rec.cfg, rec.ep, rec.eps = nil, nil, nil, nil
	p.records.Put(rec)
}

// releaseInput returns the pick's Input to its pool, holding nothing of
// the pick.
func (p *Picker) releaseInput(rec *record) {
	if in := rec.in; in != nil {
		in.Reset(nil, nil, time.Time{})
		rec.in = nil
		p.inputs.Put(in)
	}
}

func (p *Picker) annotate(span trace.Span, rec *record, best int) {
	n := rec.n
	span.SetAttributes(
		attribute.String("inferroute.endpoint", rec.ep.Name),
		attribute.String("inferroute.address", rec.ep.Address),
		attribute.Int("inferroute.candidates", n),
		attribute.Float64("inferroute.score", rec.total[best]),
	)
	for s, w := range rec.cfg.scorers {
		span.SetAttributes(attribute.Float64("inferroute.score."+w.Name, w.Weight*rec.scores[s*n+best]))
	}
}

// weightedSum sets total[i] to Σ_s weights[s] × scores[s·n+i], where n is
// len(total), adding in scorer order, so that each total is bit-identical
// to a running sum. Each total is stored once, and four candidates are
// summed side by side: one candidate's sum is a chain of dependent
// additions, and four independent chains keep the adder busy (at 512
// candidates and six scorers, 25.1 → 23.5 µs per pick).
func weightedSum(total, scores, weights []float64) {
	n := len(total)
	i := 0
	for ; i+4 <= n; i += 4 {
		var t0, t1, t2, t3 float64
		for s, w := range weights {
			r := scores[s*n+i : s*n+i+4 : s*n+i+4]
			t0 += w * r[0]
			t1 += w * r[1]
			t2 += w * r[2]
			t3 += w * r[3]
		}
		total[i], total[i+1], total[i+2], total[i+3] = t0, t1, t2, t3
	}
	for ; i < n; i++ {
		t := 0.0
		for s, w := range weights {
			t += w * scores[s*n+i]
		}
		total[i] = t
	}
}

// record is the per-pick scratch space and the state Done needs. Records
// are pooled: a record goes back to the pool when Done is called, and its
// generation counter makes Done calls on a recycled record no-ops.
type record struct {
	p   *Picker
	gen atomic.Uint64
	// prefill is gen+1 while the pick of generation gen counts as
	// prefilling on its endpoint, 0 once FirstToken or Done ended that.
	// Holding the generation makes a late FirstToken of an earlier pick of
	// this (pooled, reused) record a no-op.
	prefill atomic.Uint64

	cfg    *compiled
	req    *signals.Request
	ep     *signals.Endpoint
	mark   uint64 // ep's HealthMark when it was picked
	epGen  uint64 // ep's Generation when it was picked
	tokens int
	n      int

	in        *scorer.Input       // while the pick runs
	cands     []*signals.Endpoint // the pool, then the candidates filtered in place
	eps       []*signals.Endpoint // the candidates scored: a prefix of cands
	cached    []float64
	scores    []float64 // scorer-major: scores[s*n+i]
	raw       []float64 // aligned with scores
	total     []float64
	nans      []float64 // all NaN: copied over each scorer's raw row
	fallbacks []*signals.Endpoint

	rng  rand.PCG
	rand *rand.Rand // reads rng
}

// grow sizes the scratch slices for n candidates and k scorers.
func (r *record) grow(n, k int) {
	if cap(r.cached) < n {
		r.cached = make([]float64, n)
		r.total = make([]float64, n)
		r.nans = make([]float64, n)
		for i := range r.nans {
			r.nans[i] = math.NaN()
		}
	}
	if cap(r.scores) < n*k {
		r.scores = make([]float64, n*k)
		r.raw = make([]float64, n*k)
	}
	r.scores, r.raw = r.scores[:n*k], r.raw[:n*k]
}

// finish is Done: it runs once per generation.
func (r *record) finish(gen uint64, info DoneInfo) {
	if !r.gen.CompareAndSwap(gen, gen+1) {
		return
	}
	p, ep, req := r.p, r.ep, r.req
	if r.prefill.CompareAndSwap(gen+1, 0) {
		ep.EndPrefill(r.tokens) // no FirstToken came
	}
	ep.Complete(r.tokens)
	switch {
	case info.ConnectError:
		ep.ReportConnectError()
	case info.Err == nil:
		ep.ReportSuccess(r.mark)
	}
	info.Generation = r.epGen
	for _, o := range p.observers {
		o.Completed(req, ep, info)
	}
	p.inst.done(ep, info)
	p.release(r)
}

// choose returns the index of the winner among totals (len ≥ 1).
func choose(cfg *compiled, total []float64, rng *rand.Rand, rotor *atomic.Uint64) int {
	switch cfg.strategy {
	case StrategyWeightedRandom:
		return weightedRandom(total, rng)
	case StrategySoftmax:
		return softmax(total, cfg.temperature, rng)
	}
	if cfg.tieBand > 0 {
		return maxScoreBanded(total, cfg.tieBand, rotor)
	}
	return maxScore(total, rng)
}

// maxScoreBanded returns, among the candidates whose total is within band
// of the highest, the first at or after a rotating position: round-robin
// over the near-best.
func maxScoreBanded(total []float64, band float64, rotor *atomic.Uint64) int {
	hi := total[0]
	for _, v := range total[1:] {
		hi = max(hi, v)
	}
	n := len(total)
	start := int(rotor.Add(1) % uint64(n))
	for k := 0; k < n; k++ {
		i := start + k
		if i >= n {
			i -= n
		}
		if total[i] >= hi-band {
			return i
		}
	}
	return start // unreachable: the best is within the band
}

// maxScore returns the index of the highest total, choosing uniformly among
// exact ties (reservoir sampling, one pass).
func maxScore(total []float64, rng *rand.Rand) int {
	best, ties := 0, 1
	for i := 1; i < len(total); i++ {
		switch {
		case total[i] > total[best]:
			best, ties = i, 1
		case total[i] == total[best]:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// weightedRandom draws index i with probability total[i]/Σtotal using
// Efraimidis–Spirakis keys u^(1/w), compared as log(u)/w (Efraimidis and
// Spirakis, "Weighted random sampling with a reservoir", IPL 2006). If all
// weights are zero it draws uniformly.
func weightedRandom(total []float64, rng *rand.Rand) int {
	best, bestKey := -1, math.Inf(-1)
	for i, w := range total {
		if w <= 0 {
			continue
		}
		key := math.Log(1-rng.Float64()) / w // 1-u is in (0, 1]
		if key > bestKey {
			best, bestKey = i, key
		}
	}
	if best < 0 {
		return rng.IntN(len(total))
	}
	return best
}

// softmax draws index i with probability ∝ exp(total[i]/t).
func softmax(total []float64, t float64, rng *rand.Rand) int {
	hi := math.Inf(-1)
	for _, v := range total {
		hi = max(hi, v)
	}
	var sum float64
	for _, v := range total {
		sum += math.Exp((v - hi) / t)
	}
	u := rng.Float64() * sum
	for i, v := range total {
		u -= math.Exp((v - hi) / t)
		if u < 0 {
			return i
		}
	}
	return len(total) - 1
}

// rankFallbacks appends to dst up to k candidates other than best, highest
// total first (ties in candidate order). O(n·k), k is small.
func rankFallbacks(dst []*signals.Endpoint, eps []*signals.Endpoint, total []float64, best, k int) []*signals.Endpoint {
	k = min(k, len(eps)-1)
	var buf [8]int
	if k <= 0 || k > len(buf) {
		return rankFallbacksSlow(dst, eps, total, best, k)
	}
	// One pass keeping the k best in order: by total, highest first, and
	// among equal totals the earlier candidate first.
	top := buf[:0]
	for i, v := range total {
		if i == best || (len(top) == k && v <= total[top[k-1]]) {
			continue
		}
		j := len(top)
		if j < k {
			top = append(top, i)
		} else {
			j = k - 1
		}
		for ; j > 0 && v > total[top[j-1]]; j-- {
			top[j] = top[j-1]
		}
		top[j] = i
	}
	for _, i := range top {
		dst = append(dst, eps[i])
	}
	return dst
}

// rankFallbacksSlow is rankFallbacks by k passes, for large k.
func rankFallbacksSlow(dst []*signals.Endpoint, eps []*signals.Endpoint, total []float64, best, k int) []*signals.Endpoint {
	prev := math.Inf(1)
	prevIdx := -1
	for len(dst) < k {
		next := -1
		for i, v := range total {
			if i == best {
				continue
			}
			// Strictly below the previous pick, or equal and later in order.
			if v > prev || (v == prev && i <= prevIdx) {
				continue
			}
			if next < 0 || v > total[next] {
				next = i
			}
		}
		if next < 0 {
			break
		}
		dst = append(dst, eps[next])
		prev, prevIdx = total[next], next
	}
	return dst
}
