package scorer

import (
	"context"
	"math"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// Input is what filters and scorers see for one pick. The picker owns it and
// every slice in it; filters and scorers must not retain any of them after
// they return.
type Input struct {
	// Request is the request being placed. Read-only.
	Request *signals.Request
	// Endpoints are the candidates. A filter may reorder and overwrite the
	// elements of this slice (the picker gave it a private copy); a scorer
	// must not modify it.
	Endpoints []*signals.Endpoint
	// Now is the time of the pick, read once from the picker's clock.
	Now time.Time
	// Cached is set for scorers only: Cached[i] is the fraction of the
	// request's prompt that Endpoints[i] is believed to hold in its prefix
	// cache, as reported by the picker's PrefixMatcher (all zero without one).
	Cached []float64
	// Raw is set for scorers only: a scorer may write into Raw[i] the raw
	// value behind Endpoints[i]'s score (a queue length, a predicted TTFT in
	// seconds) for the pick's breakdown. Entries left alone read as NaN.
	Raw []float64

	// pick numbers the pick the memo entries belong to (Reset increments
	// it), so that a reused Input never serves a previous pick's loads.
	// loads[i] is the memoised Load of keys[i].ep, and cols mirrors the
	// fields of it that built-in scorers read. aligned is the pick (0:
	// none) for which Loads verified every entry against Endpoints, whose
	// first element and length it also remembers.
	pick  uint64
	loads []signals.Load
	keys  []loadKey
	cols  columns

	aligned    uint64
	alignedHL  time.Duration
	alignedLen int
	alignedAt  *signals.Endpoint
	// readPick is the pick (0: none) in which some entry was read: until then
	// Loads reads the whole pool in one signals.ReadLoadsAt.
	readPick uint64
}

// loadKey says whose Load a memo entry holds, for which pick and half-life.
type loadKey struct {
	ep       *signals.Endpoint
	pick     uint64
	halfLife time.Duration
}

// columns holds the fields of the memoised loads that the built-in filters
// and scorers read, one slice per field (kv is NaN when not known), so
// that a pass over one field of 512 candidates reads 4 KB rather than
// every candidate's whole Load. Entry i mirrors loads[i]; labelled is 1
// where a label gave the speed, else 0.
type columns struct {
	waiting, requests, kv, prefillTokens, throughput, invThroughput, recent, speed, labelled []float64
}

// set mirrors l into entry i.
func (c *columns) set(i int, l *signals.Load) {
	c.waiting[i] = l.Waiting
	c.requests[i] = l.Requests
	kv := l.KV
	if !l.KVKnown {
		kv = math.NaN()
	}
	c.kv[i] = kv
	c.prefillTokens[i] = float64(l.PrefillTokens)
	c.throughput[i] = l.Throughput
	c.invThroughput[i] = l.InvThroughput
	c.recent[i] = l.Recent
	c.speed[i] = l.Speed
	c.labelled[i] = 0
	if l.SpeedLabelled {
		c.labelled[i] = 1
	}
}

// move copies entry k to entry j.
func (c *columns) move(j, k int) {
	c.waiting[j] = c.waiting[k]
	c.requests[j] = c.requests[k]
	c.kv[j] = c.kv[k]
	c.prefillTokens[j] = c.prefillTokens[k]
	c.throughput[j] = c.throughput[k]
	c.invThroughput[j] = c.invThroughput[k]
	c.recent[j] = c.recent[k]
	c.speed[j] = c.speed[k]
	c.labelled[j] = c.labelled[k]
}

// grow makes every column n long.
func (c *columns) grow(n int) {
	for _, col := range []*[]float64{&c.waiting, &c.requests, &c.kv, &c.prefillTokens, &c.throughput, &c.invThroughput, &c.recent, &c.speed, &c.labelled} {
		*col = extend(*col, n)
	}
}

// prefix returns the first n entries of every column.
func (c *columns) prefix(n int) columns {
	return columns{
		waiting: c.waiting[:n], requests: c.requests[:n], kv: c.kv[:n],
		prefillTokens: c.prefillTokens[:n], throughput: c.throughput[:n], invThroughput: c.invThroughput[:n],
		recent: c.recent[:n], speed: c.speed[:n], labelled: c.labelled[:n],
	}
}

// Reset prepares in for a new pick of req over eps at now, keeping its
// internal buffers so that a pooled Input does not allocate; Cached and Raw
// are cleared. Loads memoised for an earlier pick are never returned again.
func (in *Input) Reset(req *signals.Request, eps []*signals.Endpoint, now time.Time) {
	in.Request, in.Endpoints, in.Now = req, eps, now
	in.Cached, in.Raw = nil, nil
	in.pick++
	in.aligned = 0
}

// grow makes the memo hold at least n entries.
func (in *Input) grow(n int) {
	if n <= len(in.loads) {
		return
	}
	// Each slice grows on its own: append rounds capacities up to size
	// classes, which differ with the element size.
	in.loads = extend(in.loads, n)
	in.keys = extend(in.keys, n)
	in.cols.grow(n)
}

// extend returns s with length n (n ≥ len(s)), keeping its elements and
// reusing its array when it is large enough.
func extend[E any](s []E, n int) []E {
	if n > cap(s) {
		s = append(s[:cap(s)], make([]E, n-cap(s))...)
	}
	return s[:n]
}

// read reads ep's load at at into memo entry i.
func (in *Input) read(i int, ep *signals.Endpoint, at *signals.Instant) {
	in.keys[i] = loadKey{ep: ep, pick: in.pick, halfLife: at.HalfLife()}
	l := &in.loads[i]
	ep.ReadLoadAt(l, at)
	in.cols.set(i, l)
	in.readPick = in.pick
	// An entry read again (for another half-life, say) breaks the
	// alignment Loads relies on to skip its checks.
	in.aligned = 0
}

// Load returns candidate in.Endpoints[i]'s load at in.Now corrected with
// halfLife (signals.Endpoint.LoadAt). The first call for a candidate reads
// it; later calls in the same pick with the same half-life return the same
// values, so every filter and scorer of a pick sees one consistent reading
// and none recomputes it. The result points into in and is valid until the
// next Reset; callers must not modify it. Load does not allocate once in has
// held as many candidates before.
//
// An Input that was never Reset (one a test or a caller built by hand)
// memoises nothing: every call reads afresh. The memo follows the endpoint,
// not only the index: a filter that moves
// candidates (or a caller that edits in.Endpoints) gets a fresh reading for
// a moved candidate unless Keep carried its memo along.
func (in *Input) Load(i int, halfLife time.Duration) *signals.Load {
	ep := in.Endpoints[i]
	in.grow(max(len(in.Endpoints), i+1))
	if k := &in.keys[i]; in.pick == 0 || k.ep != ep || k.pick != in.pick || k.halfLife != halfLife {
		at := signals.NewInstant(in.Now, halfLife)
		in.read(i, ep, &at)
	}
	return &in.loads[i]
}

// Loads returns every candidate's Load, loads[i] being Load(i, halfLife),
// in one slice aligned with in.Endpoints: what a filter or scorer that
// visits every candidate should use, since after its first call in a pick
// it costs no per-candidate check at all. The slice points into in and is
// valid until in.Endpoints changes or the next Keep or Reset; callers must
// not modify it.
//
// Loads trusts that nobody rewrote the elements of in.Endpoints in place
// since its last call in the pick without calling Keep; filters that
// compact candidates do so after reading their loads, and scorers must not
// modify in.Endpoints at all (Scorer).
func (in *Input) Loads(halfLife time.Duration) []signals.Load {
	n := len(in.Endpoints)
	if n == 0 {
		return nil
	}
	if in.pick != 0 && in.aligned == in.pick && in.alignedHL == halfLife &&
		in.alignedLen == n && in.alignedAt == in.Endpoints[0] {
		return in.loads[:n]
	}
	in.grow(n)
	at := signals.NewInstant(in.Now, halfLife)
	keys := in.keys[:n]
	if in.pick != 0 && in.readPick != in.pick {
		// Nothing of this pick is memoised yet: read every candidate.
		signals.ReadLoadsAt(in.loads[:n], in.Endpoints, &at)
		for i, ep := range in.Endpoints {
			keys[i] = loadKey{ep: ep, pick: in.pick, halfLife: halfLife}
			in.cols.set(i, &in.loads[i])
		}
		in.readPick = in.pick
	} else {
		for i, ep := range in.Endpoints {
			if k := &keys[i]; in.pick == 0 || k.ep != ep || k.pick != in.pick || k.halfLife != halfLife {
				in.read(i, ep, &at)
			}
		}
	}
	if in.pick != 0 {
		in.aligned, in.alignedHL, in.alignedLen, in.alignedAt = in.pick, halfLife, n, in.Endpoints[0]
	}
	return in.loads[:n]
}

// columns returns the column view of Loads(halfLife), for the built-in
// filters and scorers.
func (in *Input) columns(halfLife time.Duration) columns {
	return in.cols.prefix(len(in.Loads(halfLife)))
}

// unagedLoads is Loads for fields that do not depend on the half-life
// (InFlight, InFlightTokens, PrefillRequests, PrefillTokens, Throughput,
// Recent): it asks with the half-life of the loads already read in this
// pick, if any, so that they are reused rather than read again.
func (in *Input) unagedLoads() []signals.Load {
	var hl time.Duration
	switch {
	case in.pick != 0 && in.aligned == in.pick:
		hl = in.alignedHL
	case len(in.keys) > 0 && in.keys[0].pick == in.pick:
		hl = in.keys[0].halfLife
	}
	return in.Loads(hl)
}

// unagedColumns is the column view of unagedLoads.
func (in *Input) unagedColumns() columns {
	return in.cols.prefix(len(in.unagedLoads()))
}

// Keep makes kept the candidates, where kept is what a filter returned: a
// sub-slice of in.Endpoints holding some of its endpoints in their original
// order. The loads already read for the kept candidates move along with
// them. A kept slice in any other order is valid too; loads that cannot be
// matched are read again when asked for.
func (in *Input) Keep(kept []*signals.Endpoint) {
	in.aligned = 0
	if len(kept) == len(in.Endpoints) && (len(kept) == 0 || &kept[0] == &in.Endpoints[0]) {
		return // the filter kept every candidate where it was
	}
	in.Endpoints = kept
	k := 0
	for j, ep := range kept {
		for k < len(in.keys) && in.keys[k].ep != ep {
			k++
		}
		if k == len(in.keys) {
			return
		}
		if k != j {
			in.keys[j], in.loads[j] = in.keys[k], in.loads[k]
			in.cols.move(j, k)
		}
		k++
	}
}

// Filter removes the endpoints that cannot serve a request.
//
// Filter returns the endpoints to keep as a sub-slice of in.Endpoints,
// typically by compacting kept endpoints to the front in their original
// order. A filter that keeps nothing must return an empty slice and leave
// in.Endpoints unchanged; the picker then applies its policy (fail open to
// the candidates before this filter, or fail closed with an error). Filter
// must be safe for concurrent use, must not block, and should not allocate.
type Filter interface {
	Filter(ctx context.Context, in *Input) []*signals.Endpoint
}

// Scorer rates how well each candidate would serve a request.
//
// Score writes into out[i] a score in [0, 1] for in.Endpoints[i], 1 being
// best; len(out) == len(in.Endpoints). out is owned by the caller and its
// initial contents are unspecified. NaN and out-of-range values are clamped
// by the picker. Score must be safe for concurrent use, must not block, and
// must not allocate.
type Scorer interface {
	Score(ctx context.Context, in *Input, out []float64)
}

// Normalized is implemented by scorers that promise more than Scorer asks
// of them: given an Input whose Raw and Cached are set, as the picker sets
// them, Score writes every entry of out with a value in [0, 1] (never NaN)
// and every entry of in.Raw. The picker then skips the work it does for
// any other scorer: pre-filling Raw with NaN and clamping the scores. The
// built-in scorers implement it (TestNormalizedPromise checks each on
// hostile inputs); a scorer that cannot keep the promise must not.
type Normalized interface {
	Scorer
	// NormalizedScores marks the promise; it does nothing.
	NormalizedScores()
}

// FilterFunc adapts a function to Filter.
type FilterFunc func(ctx context.Context, in *Input) []*signals.Endpoint

// Filter calls f(ctx, in).
func (f FilterFunc) Filter(ctx context.Context, in *Input) []*signals.Endpoint { return f(ctx, in) }

// ScorerFunc adapts a function to Scorer.
type ScorerFunc func(ctx context.Context, in *Input, out []float64)

// Score calls f(ctx, in, out).
func (f ScorerFunc) Score(ctx context.Context, in *Input, out []float64) { f(ctx, in, out) }

// Weighted is a scorer with its name and weight in a chain. Weights apply
// after normalisation: a candidate's total is the sum of Weight × score.
type Weighted struct {
	Name   string
	Weight float64
	Scorer Scorer
}

// Env carries what built-in filters and scorers need from the picker that
// builds them. The zero Env reads no prefix index, no estimator, and never
// ages scraped values.
type Env struct {
	// HalfLife is the age at which a scraped value's confidence halves.
	HalfLife time.Duration
	// Matcher is the prefix index; nil means none.
	Matcher signals.PrefixMatcher
	// Estimator predicts TTFT; nil means none.
	Estimator signals.LatencyEstimator
}

// Admitter decides, after filtering and before scoring, whether a request is
// admitted at all. Admit returns ok == false with a short reason to reject
// it; the picker then fails the pick with an error that wraps
// picker.ErrSaturated, so a router can answer 429. Admit must be safe for
// concurrent use, must not block, and must not allocate when it admits.
type Admitter interface {
	Admit(ctx context.Context, in *Input) (ok bool, reason string)
}
