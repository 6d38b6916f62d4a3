package scorer

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// ConfidenceReporter is implemented by a signals.LatencyEstimator that can
// say how far its predictions for an endpoint can be trusted
// (latency.Predictor does). Confidence returns a value in [0, 1]; it must be
// safe for concurrent use and must not block or allocate. An estimator
// without it is trusted fully.
type ConfidenceReporter interface {
	Confidence(ep *signals.Endpoint) float64
}

// TimedEstimator is implemented by a signals.LatencyEstimator that can
// predict, and report its confidence, at a time the caller read once for
// the whole pick (latency.Predictor does); the scorer then reads the clock
// once per pick instead of twice per candidate. now is the pick's time,
// scorer.Input.Now, from the same clock as the estimator's.
type TimedEstimator interface {
	PredictTTFTAt(req *signals.Request, ep *signals.Endpoint, cachedFraction float64, now time.Time) (seconds float64, ok bool)
	ConfidenceAt(ep *signals.Endpoint, now time.Time) float64
}

// LoadEstimator is implemented by a signals.LatencyEstimator that predicts
// from the load the pick already read for a candidate (Input.Load), and
// returns the prediction and its confidence in one call (latency.Predictor
// does): per candidate, the estimator's state is looked up once and the
// endpoint's counters are not read again. The values must be those of
// TimedEstimator's two calls at the same now. It must be safe for
// concurrent use and must not block or allocate; load may be nil.
type LoadEstimator interface {
	PredictTTFTLoad(req *signals.Request, ep *signals.Endpoint, load *signals.Load, cachedFraction float64, now time.Time) (seconds, confidence float64, ok bool)
}

// TPOTEstimator is implemented by a signals.LatencyEstimator that also
// predicts the time per output token (latency.Predictor does). PredictTPOT
// returns seconds and whether a prediction is available; it must be safe for
// concurrent use and must not block or allocate.
type TPOTEstimator interface {
	PredictTPOT(req *signals.Request, ep *signals.Endpoint) (seconds float64, ok bool)
}

var _ Scorer = (*LatencyScorer)(nil)

// Normalisations the latency scorer offers.
const (
	// NormalizeRatio scores a candidate best/predicted (RelativeToBest).
	NormalizeRatio = "ratio"
	// NormalizeMinMax scores min-max across candidates (InverseMinMax).
	NormalizeMinMax = "minmax"
)

// LatencyParams configures the predicted-latency scorer. Zero fields are
// valid values, not defaults: start from DefaultLatencyParams.
type LatencyParams struct {
	// FloorMs is the smallest predicted TTFT, in milliseconds, that the
	// ratio normalisation distinguishes: predictions below it count as it,
	// so 2 ms against 4 ms is not a factor of two. Must be > 0 for "ratio".
	FloorMs float64 `json:"floorMs" yaml:"floorMs"`
	// Normalize is "ratio" (score = best / predicted: twice as slow scores
	// 0.5, whatever the other candidates) or "minmax" (the fastest scores 1,
	// the slowest 0). Ratio is the default because min-max lets one outlier
	// squeeze every other candidate's differences into nothing, and blows a
	// 1 ms difference between two candidates up to the whole [0, 1] range.
	Normalize string `json:"normalize" yaml:"normalize"`
	// IgnoreConfidence uses predictions as they are, without blending those
	// of low confidence toward the best candidate's (see LatencyScorer).
	IgnoreConfidence bool `json:"ignoreConfidence" yaml:"ignoreConfidence"`
}

// DefaultLatencyParams returns the defaults: ratio normalisation with a
// 10 ms floor (below a network round trip plus one decode step, times no
// router can tell apart), confidence blending on.
func DefaultLatencyParams() LatencyParams {
	return LatencyParams{FloorMs: 10, Normalize: NormalizeRatio}
}

func (p LatencyParams) validate() error {
	switch p.Normalize {
	case NormalizeRatio:
		if !(p.FloorMs > 0) || math.IsInf(p.FloorMs, 0) {
			return fmt.Errorf("latency: floorMs %v must be a finite number > 0", p.FloorMs)
		}
	case NormalizeMinMax:
	default:
		return fmt.Errorf("latency: normalize %q is not %q or %q", p.Normalize, NormalizeRatio, NormalizeMinMax)
	}
	return nil
}

// LatencyScorer prefers the endpoints where the request's first token is
// predicted to come soonest, from env.Estimator given each candidate's
// prefix match (in.Cached).
//
// Each candidate's predicted TTFT, in seconds, goes to in.Raw (the pick
// breakdown shows it). When the estimator reports confidence
// (ConfidenceReporter), a prediction of confidence c is blended as
// c × prediction + (1 − c) × best, where best is the smallest prediction
// among the candidates of non-zero confidence. This is optimism in the
// face of uncertainty, the exploration rule of the upper-confidence-bound
// bandit algorithms (Auer, Cesa-Bianchi and Fischer, "Finite-time Analysis
// of the Multiarmed Bandit Problem", Machine Learning 2002): an endpoint
// the model knows little about ties with the best one, so it receives the
// few requests that teach the model what it is worth, and as its
// confidence grows its own prediction takes over. Blending toward the mean
// instead starves it: once one endpoint is known to be faster than
// average, an unknown one never wins a pick and is never learned (a 4×
// endpoint of a 1×/2×/4× fleet stayed unsampled that way). Since
// confidence fades without observations (latency.Config.ConfidenceHalfLife)
// an endpoint that stopped receiving traffic is explored again. The
// blended values are normalised (lower is better) by
// LatencyParams.Normalize.
//
// Every candidate scores Neutral when there is no estimator, when no
// prediction is known, or when every confidence is zero; a candidate
// without a prediction scores Neutral. Score is safe for concurrent use
// and does not allocate.
type LatencyScorer struct {
	p        LatencyParams
	est      signals.LatencyEstimator
	loadEst  LoadEstimator
	conf     ConfidenceReporter
	floor    float64
	halfLife time.Duration
}

// NewLatencyScorer returns a LatencyScorer with parameters p reading
// env.Estimator (nil: every candidate scores Neutral). It fails when a
// parameter is out of range.
func NewLatencyScorer(p LatencyParams, env Env) (*LatencyScorer, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	s := &LatencyScorer{p: p, est: env.Estimator, floor: p.FloorMs / 1000, halfLife: env.HalfLife}
	s.loadEst, _ = env.Estimator.(LoadEstimator)
	if c, ok := env.Estimator.(ConfidenceReporter); ok && !p.IgnoreConfidence {
		s.conf = c
	}
	return s, nil
}

// NewLatencyScorerFromParams decodes YAML/JSON parameters over
// DefaultLatencyParams and builds the scorer; it has the shape of a
// registry ScorerFactory.
func NewLatencyScorerFromParams(p Params, env Env) (Scorer, error) {
	lp := DefaultLatencyParams()
	if err := p.Decode(&lp); err != nil {
		return nil, err
	}
	return NewLatencyScorer(lp, env)
}

// Params returns the scorer's parameters.
func (s *LatencyScorer) Params() LatencyParams { return s.p }

// Score implements Scorer.
func (s *LatencyScorer) Score(_ context.Context, in *Input, out []float64) {
	n := min(len(in.Endpoints), len(out))
	if s.est == nil || in.Request == nil {
		latencyFill(out[:n], Neutral)
		return
	}
	// Pass 1: predictions, and the best confident one. Predictions go
	// to in.Raw and confidences to out when the picker gave a Raw slice, so
	// that each is computed once; without one, predictions go to out and
	// confidences are asked again in pass 2.
	raw := len(in.Raw) >= n && s.conf != nil
	best := math.Inf(1)
	known := false
	timed, _ := s.est.(TimedEstimator)
	for i := 0; i < n; i++ {
		ep := in.Endpoints[i]
		var v, c float64
		var ok, haveC bool
		switch {
		case s.loadEst != nil:
			v, c, ok = s.loadEst.PredictTTFTLoad(in.Request, ep, in.Load(i, s.halfLife), latencyCached(in, i), in.Now)
			haveC = true
		case timed != nil:
			v, ok = timed.PredictTTFTAt(in.Request, ep, latencyCached(in, i), in.Now)
		default:
			v, ok = s.est.PredictTTFT(in.Request, ep, latencyCached(in, i))
		}
		if !ok || unknown(v) || v < 0 {
			v = math.NaN()
		} else {
			known = true
		}
		if i < len(in.Raw) {
			in.Raw[i] = v
		}
		if s.conf == nil || math.IsNaN(v) {
			out[i] = v
			continue
		}
		switch {
		case haveC:
			c = Clamp01(c)
		case timed != nil:
			c = Clamp01(timed.ConfidenceAt(ep, in.Now))
		default:
			c = Clamp01(s.conf.Confidence(ep))
		}
		if c > 0 {
			best = min(best, v)
		}
		if raw {
			out[i] = c
		} else {
			out[i] = v
		}
	}
	if !known || (s.conf != nil && math.IsInf(best, 1)) {
		latencyFill(out[:n], Neutral)
		return
	}
	// Pass 2: blend toward the best by confidence.
	if s.conf != nil {
		m := best
		for i := 0; i < n; i++ {
			var v, c float64
			if raw {
				v, c = in.Raw[i], out[i]
			} else {
				v = out[i]
				if !math.IsNaN(v) {
					c = Clamp01(s.conf.Confidence(in.Endpoints[i]))
				}
			}
			if math.IsNaN(v) {
				out[i] = v
				continue
			}
			out[i] = c*v + (1-c)*m
		}
	}
	if s.p.Normalize == NormalizeMinMax {
		InverseMinMax(out[:n])
		return
	}
	RelativeToBest(out[:n], s.floor)
}

// latencyCached returns in.Cached[i], or 0 when the picker gave none.
func latencyCached(in *Input, i int) float64 {
	if i < len(in.Cached) {
		return in.Cached[i]
	}
	return 0
}

func latencyFill(vals []float64, v float64) {
	for i := range vals {
		vals[i] = v
	}
}
