package scorer

import (
	"context"
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
	pick  uint64
	loads []loadMemo
}

// loadMemo is one candidate's memoised Load.
type loadMemo struct {
	ep   *signals.Endpoint
	pick uint64
	load signals.Load
}

// Reset prepares in for a new pick of req over eps at now, keeping its
// internal buffers so that a pooled Input does not allocate; Cached and Raw
// are cleared. Loads memoised for an earlier pick are never returned again.
func (in *Input) Reset(req *signals.Request, eps []*signals.Endpoint, now time.Time) {
	in.Request, in.Endpoints, in.Now = req, eps, now
	in.Cached, in.Raw = nil, nil
	in.pick++
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
	if i >= len(in.loads) {
		n := max(len(in.Endpoints), i+1)
		if n > cap(in.loads) {
			in.loads = append(in.loads[:cap(in.loads)], make([]loadMemo, n-cap(in.loads))...)
		}
		in.loads = in.loads[:n]
	}
	m := &in.loads[i]
	if in.pick == 0 || m.ep != ep || m.pick != in.pick || m.load.HalfLife != halfLife {
		m.ep, m.pick = ep, in.pick
		ep.ReadLoad(&m.load, in.Now, halfLife)
	}
	return &m.load
}

// Keep makes kept the candidates, where kept is what a filter returned: a
// sub-slice of in.Endpoints holding some of its endpoints in their original
// order. The loads already read for the kept candidates move along with
// them. A kept slice in any other order is valid too; loads that cannot be
// matched are read again when asked for.
func (in *Input) Keep(kept []*signals.Endpoint) {
	if len(kept) == len(in.Endpoints) && (len(kept) == 0 || &kept[0] == &in.Endpoints[0]) {
		return // the filter kept every candidate where it was
	}
	in.Endpoints = kept
	k := 0
	for j, ep := range kept {
		for k < len(in.loads) && in.loads[k].ep != ep {
			k++
		}
		if k == len(in.loads) {
			return
		}
		if k != j {
			in.loads[j] = in.loads[k]
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
