package scorer

import (
	"context"
	"fmt"
	"math"
	"time"
)

var _ Scorer = (*PrefixScorer)(nil)

// PrefixParams configures the prefix-affinity scorer. Zero fields are
// valid values, not defaults: start from DefaultPrefixParams.
type PrefixParams struct {
	// MinMatch is the cached fraction of the prompt below which the best
	// candidate's match counts as a miss: a hit that small saves less
	// prefill than a queue costs, so the request is spread by load instead.
	MinMatch float64 `json:"minMatch" yaml:"minMatch"`
	// Tolerance is how far, as a fraction of the prompt, a candidate's match
	// may fall short of the best one and still count as holding the prefix:
	// such candidates all score 1 and load chooses among them.
	Tolerance float64 `json:"tolerance" yaml:"tolerance"`
	// PartialCredit scales the score of candidates holding a shorter prefix
	// than the preferred ones: they score PartialCredit × match / best. Small
	// values keep a conversation on the pod with its whole history rather
	// than the pod with an older part of it, even when the latter is a little
	// less loaded.
	PartialCredit float64 `json:"partialCredit" yaml:"partialCredit"`
	// YieldAbsolute and YieldRelative are the anti-hot-spot margins, in
	// requests on the endpoint (waiting plus running). A candidate loses its
	// affinity when its load exceeds the least-loaded candidate's load by
	// more than YieldAbsolute requests AND by more than YieldRelative times
	// that load. The absolute margin keeps a lightly loaded pool from
	// scattering a prefix over every pod for a difference of one or two
	// requests; the relative margin makes the rule scale with load.
	YieldAbsolute float64 `json:"yieldAbsolute" yaml:"yieldAbsolute"`
	YieldRelative float64 `json:"yieldRelative" yaml:"yieldRelative"`
}

// DefaultPrefixParams returns the defaults: a miss below 5% of the prompt,
// a 2% tolerance, a partial credit of 0.25, and yielding at 4 requests and
// 50% more load than the least-loaded candidate. The margins follow the idea of consistent hashing with bounded
// loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
// Bounded Loads", SODA 2018: a key stays on its preferred bin unless that
// bin's load exceeds (1+ε) times the average), applied against the
// least-loaded candidate, with an absolute floor so that small loads do not
// trigger it.
func DefaultPrefixParams() PrefixParams {
	return PrefixParams{MinMatch: 0.05, Tolerance: 0.02, PartialCredit: 0.25, YieldAbsolute: 4, YieldRelative: 0.5}
}

// validate checks the parameters.
func (p PrefixParams) validate() error {
	switch {
	case !(p.MinMatch >= 0 && p.MinMatch <= 1):
		return fmt.Errorf("prefix: minMatch %v is not in [0, 1]", p.MinMatch)
	case !(p.Tolerance >= 0 && p.Tolerance <= 1):
		return fmt.Errorf("prefix: tolerance %v is not in [0, 1]", p.Tolerance)
	case !(p.PartialCredit >= 0 && p.PartialCredit <= 1):
		return fmt.Errorf("prefix: partialCredit %v is not in [0, 1]", p.PartialCredit)
	case !(p.YieldAbsolute >= 0) || math.IsInf(p.YieldAbsolute, 0):
		return fmt.Errorf("prefix: yieldAbsolute %v must be a finite number ≥ 0", p.YieldAbsolute)
	case !(p.YieldRelative >= 0) || math.IsInf(p.YieldRelative, 0):
		return fmt.Errorf("prefix: yieldRelative %v must be a finite number ≥ 0", p.YieldRelative)
	}
	return nil
}

// PrefixScorer prefers endpoints that already hold the request's prompt
// prefix in their KV cache, without piling a shared prefix onto one pod.
//
// It reads in.Cached (the fraction of the prompt each candidate holds, from
// the picker's PrefixMatcher) and each candidate's load in requests,
// waiting plus running, corrected and faded by scrape age
// (signals.Endpoint.Requests).
//
// Scores, 1 best:
//   - on a hit, a candidate whose load exceeds the least-loaded
//     candidate's by both margins (PrefixParams.YieldAbsolute and
//     YieldRelative) yields: it scores 0, whatever it holds, and when it
//     was the only holder the request is a miss;
//   - on a hit (the best remaining candidate holds at least MinMatch of the
//     prompt) the remaining candidates within Tolerance of the best match
//     score 1, so pods holding the same prefix tie and load chooses among
//     them, and the others score PartialCredit × their match over the best;
//   - on a miss no pod is preferred for its cache or turned away for its
//     load: every candidate scores 1, and the picker's load scorers spread
//     the misses (the margins' raw request counts are not compared: on a
//     mixed fleet the fast pods run the bigger batches).
//
// Weights: the yield margins decide when affinity gives way only if the
// load scorers in the same chain cannot outvote it first. With min-max load
// scorers (queue, running), whose scores swing by their whole weight for a
// one-request difference, keep weight(prefix) × (1 − PartialCredit) above
// the sum of their weights; for example prefix 5 against queue 2 and
// running 1 with the default PartialCredit of 0.25.
//
// Raw values (in.Raw) are the cached fractions. Score is safe for
// concurrent use and does not allocate.
type PrefixScorer struct {
	p        PrefixParams
	halfLife time.Duration
}

// NewPrefixScorer returns a PrefixScorer with parameters p, ageing scraped
// values with env.HalfLife. It fails when a parameter is out of range.
func NewPrefixScorer(p PrefixParams, env Env) (*PrefixScorer, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &PrefixScorer{p: p, halfLife: env.HalfLife}, nil
}

// Params returns the scorer's parameters.
func (s *PrefixScorer) Params() PrefixParams { return s.p }

// NewPrefixScorerFromParams decodes YAML/JSON parameters over
// DefaultPrefixParams and builds the scorer; it has the shape of a registry
// ScorerFactory.
func NewPrefixScorerFromParams(p Params, env Env) (Scorer, error) {
	pp := DefaultPrefixParams()
	if err := p.Decode(&pp); err != nil {
		return nil, err
	}
	return NewPrefixScorer(pp, env)
}

// Score implements Scorer.
func (s *PrefixScorer) Score(_ context.Context, in *Input, out []float64) {
	n := len(in.Endpoints)
	out = out[:n]
	if n == 0 {
		return
	}
	cached := in.Cached
	if len(cached) > 0 && len(in.Raw) >= n {
		copy(in.Raw[:n], cached[:n])
	}
	// out holds the loads until the scores are written.
	lmin := math.Inf(1)
	for i, r := range in.columns(s.halfLife).requests {
		out[i] = r
		lmin = min(lmin, r)
	}
	limitAbs := lmin + s.p.YieldAbsolute
	limitRel := lmin * (1 + s.p.YieldRelative)
	over := func(l float64) bool { return l > limitAbs && l > limitRel }

	best := 0.0
	if len(cached) >= n {
		for i, l := range out {
			if !over(l) {
				best = max(best, Clamp01(cached[i]))
			}
		}
	}
	// A best match below the smallest normal float64 is a miss whatever
	// MinMatch says: it is less than one token of any prompt, and
	// PartialCredit / best would overflow (Inf × 0 = NaN for a candidate
	// holding nothing).
	if best >= max(s.p.MinMatch, 0x1p-1022) {
		near := best - s.p.Tolerance
		credit := s.p.PartialCredit / best
		for i, l := range out {
			c := Clamp01(cached[i])
			switch {
			case over(l):
				out[i] = 0
			case c >= near:
				out[i] = 1
			default:
				out[i] = credit * c
			}
		}
		return
	}
	// A miss: no candidate is preferred for its cache, or turned away for
	// its load. Every candidate scores 1 and the load scorers (queue, KV
	// cache, prefill, burst) spread the misses. The yield margins are not
	// applied: they compare raw request counts, a load signal of their own
	// that on a miss would outvote the load scorers by the prefix weight.
	// On a mixed fleet a fast pod runs a bigger batch, and the margins sent
	// misses, long prompts included, to the slow pods; on one GPU type,
	// the pods with the fewest requests are not the ones with the least
	// work queued (Mooncake trace at 90% load: applying them on a miss gave
	// a p99 TTFT 1.14 times this, seeds 1–10).
	for i := range out {
		out[i] = 1
	}
}
