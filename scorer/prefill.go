package scorer

import (
	"context"
	"fmt"
	"math"

	"github.com/inferroute/inferroute/signals"
)

var _ Scorer = (*PrefillScorer)(nil)

// PrefillParams configures the prefill scorer. Zero fields are valid values,
// not defaults: start from DefaultPrefillParams.
type PrefillParams struct {
	// FloorMs is the smallest estimated time to prefill, in milliseconds,
	// that the scorer distinguishes: estimates below it count as it, so
	// 1 ms against 3 ms is not a factor of three. Must be > 0.
	FloorMs float64 `json:"floorMs" yaml:"floorMs"`
}

// DefaultPrefillParams returns the defaults: a 10 ms floor, about one
// decode step plus a network round trip.
func DefaultPrefillParams() PrefillParams { return PrefillParams{FloorMs: 10} }

func (p PrefillParams) validate() error {
	if !(p.FloorMs > 0) || math.IsInf(p.FloorMs, 0) {
		return fmt.Errorf("prefill: floorMs %v must be a finite number > 0", p.FloorMs)
	}
	return nil
}

// PrefillScorer prefers the endpoint that would finish prefilling the
// request soonest by this process's own, lag-free account: the uncached
// prompt tokens it sent to the endpoint that have not produced a first
// token yet (signals.Endpoint.Prefilling), plus the request's own uncached
// tokens there (PromptTokens × (1 − Cached[i])), over the endpoint's
// prefill rate (signals.Endpoint.PrefillRate). This is least-work-left
// dispatching with the job's own size counted on each server (M.
// Harchol-Balter, Performance Modeling and Design of Computer Systems,
// 2013, ch. 24: when job sizes vary widely, sending each job where the
// least work is queued beats balancing job counts): a long prompt avoids a
// pod that is still prefilling another long one, a slow pod counts for what
// it is, and a prefix hit shortens the request's own part.
//
// Candidates whose labels give them all one speed (signals.LabelGPU or
// signals.LabelRelativeSpeed, the same for each) share one rate, the mean
// of those measured: their measured rates then differ by measurement
// noise, which least-work-left would otherwise follow, sending work to
// the pods that happened to measure fast. Without such labels each
// candidate keeps its own measured rate, the only sign of a speed
// difference the picker has.
//
// The queue is exact only when the caller reports first tokens
// (picker.Result.FirstToken, which router.Proxy calls at the first body
// byte); otherwise requests count until Done, decode included. It counts
// only this process's requests: with several routers in front of one pool
// each sees its own share.
//
// Each candidate's estimate in seconds goes to in.Raw; scores are
// best/estimate (RelativeToBest) with PrefillParams.FloorMs as the floor.
// Score is safe for concurrent use and does not allocate.
type PrefillScorer struct {
	p     PrefillParams
	floor float64
}

// NewPrefillScorer returns a PrefillScorer with parameters p. It fails
// when a parameter is out of range.
func NewPrefillScorer(p PrefillParams) (*PrefillScorer, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &PrefillScorer{p: p, floor: p.FloorMs / 1000}, nil
}

// NewPrefillScorerFromParams decodes YAML/JSON parameters over
// DefaultPrefillParams and builds the scorer; it has the shape of a
// registry ScorerFactory.
func NewPrefillScorerFromParams(p Params, _ Env) (Scorer, error) {
	pp := DefaultPrefillParams()
	if err := p.Decode(&pp); err != nil {
		return nil, err
	}
	return NewPrefillScorer(pp)
}

// Params returns the scorer's parameters.
func (s *PrefillScorer) Params() PrefillParams { return s.p }

// Score implements Scorer.
func (s *PrefillScorer) Score(_ context.Context, in *Input, out []float64) {
	n := min(len(in.Endpoints), len(out))
	var prompt float64
	if in.Request != nil {
		prompt = float64(max(in.Request.PromptTokens, 0))
	}
	c := in.unagedColumns()
	shared := sharedInvRate(c.speed[:n], c.labelled[:n], c.throughput[:n])
	for i, queued := range c.prefillTokens[:n] {
		own := prompt
		if i < len(in.Cached) {
			own *= 1 - Clamp01(in.Cached[i])
		}
		inv := c.invThroughput[i]
		if shared > 0 {
			inv = shared
		}
		if inv <= 0 {
			inv = 1 / signals.DefaultPrefillRate // as signals.Load.PrefillRate
		}
		v := (queued + own) * inv
		if i < len(in.Raw) {
			in.Raw[i] = v
		}
		out[i] = v
	}
	RelativeToBest(out[:n], s.floor)
}

// sharedInvRate returns the inverse of the mean of the measured
// throughputs (those > 0) when every candidate's speed comes from a label
// and all are equal; otherwise, or when none is measured, 0.
func sharedInvRate(speed, labelled, throughput []float64) float64 {
	var sum float64
	var k int
	for i, s := range speed {
		if labelled[i] == 0 || s != speed[0] {
			return 0
		}
		if tp := throughput[i]; tp > 0 {
			sum += tp
			k++
		}
	}
	if k == 0 {
		return 0
	}
	return float64(k) / sum
}
