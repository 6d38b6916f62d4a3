package scorer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/inferroute/inferroute/signals"
)

var (
	_ Filter   = (*SLOFilter)(nil)
	_ Admitter = (*SLOAdmitter)(nil)
)

// SLOParams configures the SLO filter and the SLO admitter. Zero fields
// are valid values, not defaults: start from DefaultSLOParams.
type SLOParams struct {
	// Slack multiplies the request's objectives before comparing them with
	// predictions: 1 compares as is, 1.2 tolerates predictions 20% over.
	// Must be > 0.
	Slack float64 `json:"slack" yaml:"slack"`
	// MinConfidence is the prediction confidence (ConfidenceReporter) below
	// which an endpoint is not judged: the filter keeps it and the admitter
	// admits. A model that has not seen an endpoint must not exclude it, or
	// it would never learn that the endpoint is fine. In [0, 1].
	MinConfidence float64 `json:"minConfidence" yaml:"minConfidence"`
	// ShedTTFTMs is, for the admitter only, the predicted TTFT in
	// milliseconds above which a sheddable request without an SLO is
	// rejected when every candidate exceeds it. 0 never sheds requests
	// without an SLO.
	ShedTTFTMs float64 `json:"shedTTFTMs" yaml:"shedTTFTMs"`
}

// DefaultSLOParams returns the defaults: no slack, judging only endpoints
// of confidence 0.25 or more (with the latency package's defaults, about
// three observations' worth; a GPU label alone gives 0.2, not enough), and
// no shedding of requests without an SLO.
func DefaultSLOParams() SLOParams {
	return SLOParams{Slack: 1, MinConfidence: 0.25}
}

func (p SLOParams) validate() error {
	switch {
	case !(p.Slack > 0) || math.IsInf(p.Slack, 0):
		return fmt.Errorf("slo: slack %v must be a finite number > 0", p.Slack)
	case !(p.MinConfidence >= 0 && p.MinConfidence <= 1):
		return fmt.Errorf("slo: minConfidence %v is not in [0, 1]", p.MinConfidence)
	case !(p.ShedTTFTMs >= 0) || math.IsInf(p.ShedTTFTMs, 0):
		return fmt.Errorf("slo: shedTTFTMs %v must be a finite number ≥ 0", p.ShedTTFTMs)
	}
	return nil
}

// sloJudge holds what the filter and the admitter share: the estimator and
// a pool of buffers for prefix matches.
type sloJudge struct {
	p       SLOParams
	est     signals.LatencyEstimator
	tpot    TPOTEstimator
	conf    ConfidenceReporter
	matcher signals.PrefixMatcher
	bufs    sync.Pool // *[]float64
}

func newSLOJudge(p SLOParams, env Env) (*sloJudge, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	j := &sloJudge{p: p, est: env.Estimator, matcher: env.Matcher}
	j.tpot, _ = env.Estimator.(TPOTEstimator)
	j.conf, _ = env.Estimator.(ConfidenceReporter)
	return j, nil
}

// verdict is the judgement of one endpoint against an objective.
type verdict struct {
	judged bool    // a confident prediction exists
	ratio  float64 // worst predicted/objective ratio; ≤ 1 meets it
	ttft   float64 // predicted TTFT in seconds, when judged
}

// judge predicts req on ep and compares it with the objectives ttftObj and
// tpotObj in seconds (0: none).
func (j *sloJudge) judge(req *signals.Request, ep *signals.Endpoint, cached, ttftObj, tpotObj float64) verdict {
	if j.conf != nil && j.conf.Confidence(ep) < j.p.MinConfidence {
		return verdict{}
	}
	ttft, ok := j.est.PredictTTFT(req, ep, cached)
	if !ok || unknown(ttft) || ttft < 0 {
		return verdict{}
	}
	v := verdict{judged: true, ttft: ttft}
	if ttftObj > 0 {
		v.ratio = ttft / ttftObj
	}
	if tpotObj > 0 && j.tpot != nil {
		if tp, ok := j.tpot.PredictTPOT(req, ep); ok && !unknown(tp) && tp >= 0 {
			v.ratio = max(v.ratio, tp/tpotObj)
		}
	}
	return v
}

// objectives returns the request's objectives in seconds, scaled by Slack.
func (j *sloJudge) objectives(req *signals.Request) (ttft, tpot float64) {
	return j.p.Slack * req.SLO.TTFT.Seconds(), j.p.Slack * req.SLO.TPOT.Seconds()
}

// matches returns the prefix match of every candidate, from in.Cached when
// the picker set it, else from the matcher into a pooled buffer that the
// caller returns with release.
func (j *sloJudge) matches(in *Input) (cached []float64, buf *[]float64) {
	n := len(in.Endpoints)
	if len(in.Cached) == n {
		return in.Cached, nil
	}
	if j.matcher == nil || len(in.Request.PromptBlocks) == 0 {
		return nil, nil
	}
	buf, _ = j.bufs.Get().(*[]float64)
	if buf == nil {
		buf = new([]float64)
	}
	if cap(*buf) < n {
		*buf = make([]float64, n)
	}
	cached = (*buf)[:n]
	j.matcher.Match(in.Request, in.Endpoints, cached)
	return cached, buf
}

func (j *sloJudge) release(buf *[]float64) {
	if buf != nil {
		j.bufs.Put(buf)
	}
}

func matchAt(cached []float64, i int) float64 {
	if i < len(cached) {
		return Clamp01(cached[i])
	}
	return 0
}

// SLOFilter keeps the endpoints predicted to meet the request's latency
// objectives (signals.Request.SLO, scaled by SLOParams.Slack): predicted
// TTFT within the TTFT objective and, when the estimator predicts TPOT
// (TPOTEstimator), predicted TPOT within the TPOT objective. Endpoints
// without a prediction, or whose prediction confidence is below
// SLOParams.MinConfidence, are kept: they are not judged on a guess.
//
// A request without objectives, or a filter without an estimator, keeps
// every endpoint. When no endpoint is predicted to meet the objectives the
// filter fails open to the best one: it returns a one-element sub-slice
// holding the endpoint with the smallest ratio of prediction to objective,
// so a request with an SLO that nobody can meet still goes where it will
// miss it least. It returns an empty slice only for empty input. Kept
// endpoints are compacted to the front of in.Endpoints in their original
// order. Filter is safe for concurrent use and does not allocate after
// warm-up (match buffers are pooled).
type SLOFilter struct {
	j *sloJudge
}

// NewSLOFilter returns an SLOFilter with parameters p reading env.Estimator
// and, for prefix matches, env.Matcher. It fails when a parameter is out of
// range.
func NewSLOFilter(p SLOParams, env Env) (*SLOFilter, error) {
	j, err := newSLOJudge(p, env)
	if err != nil {
		return nil, err
	}
	return &SLOFilter{j: j}, nil
}

// NewSLOFilterFromParams decodes YAML/JSON parameters over DefaultSLOParams
// and builds the filter; it has the shape of a registry FilterFactory.
func NewSLOFilterFromParams(p Params, env Env) (Filter, error) {
	sp := DefaultSLOParams()
	if err := p.Decode(&sp); err != nil {
		return nil, err
	}
	return NewSLOFilter(sp, env)
}

// Params returns the filter's parameters.
func (f *SLOFilter) Params() SLOParams { return f.j.p }

// Filter implements Filter.
func (f *SLOFilter) Filter(_ context.Context, in *Input) []*signals.Endpoint {
	eps := in.Endpoints
	req := in.Request
	if len(eps) == 0 || req == nil || f.j.est == nil || (req.SLO.TTFT <= 0 && req.SLO.TPOT <= 0) {
		return eps
	}
	ttftObj, tpotObj := f.j.objectives(req)
	cached, buf := f.j.matches(in)
	defer f.j.release(buf)

	// One pass, each endpoint judged once (a prediction may move between
	// two judgements, as in-flight counts change under concurrent picks),
	// compacting the kept endpoints to the front. Nothing is written until
	// one is kept, so when none is, in.Endpoints is untouched and the best
	// can be returned in place.
	best, bestRatio := 0, math.Inf(1)
	k := 0
	for i, ep := range eps {
		v := f.j.judge(req, ep, matchAt(cached, i), ttftObj, tpotObj)
		switch {
		case !v.judged || v.ratio <= 1:
			eps[k] = ep
			k++
		case k == 0 && v.ratio < bestRatio:
			best, bestRatio = i, v.ratio
		}
	}
	if k == 0 {
		return eps[best : best+1]
	}
	return eps[:k]
}

// SLOAdmitter rejects sheddable requests (Priority < 0) that no candidate
// is predicted to serve acceptably, so that a router can answer 429
// instead of sending them to certain failure; the picker turns a rejection
// into an error wrapping picker.ErrSaturated.
//
// A sheddable request with an objective (signals.Request.SLO, scaled by
// SLOParams.Slack) is rejected when no candidate is predicted to meet it.
// One without an objective is rejected when SLOParams.ShedTTFTMs > 0 and
// every candidate's predicted TTFT exceeds it. Requests of priority 0 or
// more are always admitted, and so is any request when some candidate has
// no prediction or one of confidence below SLOParams.MinConfidence
// (admission never sheds on a guess), when there are no candidates, or
// without an estimator. The reason names the objective and the best
// prediction. Admit is safe for concurrent use and does not allocate when
// it admits (after warm-up).
type SLOAdmitter struct {
	j *sloJudge
}

// NewSLOAdmitter returns an SLOAdmitter with parameters p reading
// env.Estimator and env.Matcher. It fails when a parameter is out of range.
func NewSLOAdmitter(p SLOParams, env Env) (*SLOAdmitter, error) {
	j, err := newSLOJudge(p, env)
	if err != nil {
		return nil, err
	}
	return &SLOAdmitter{j: j}, nil
}

// Params returns the admitter's parameters.
func (a *SLOAdmitter) Params() SLOParams { return a.j.p }

// Admit implements Admitter.
func (a *SLOAdmitter) Admit(_ context.Context, in *Input) (bool, string) {
	req := in.Request
	if req == nil || req.Priority >= 0 || a.j.est == nil || len(in.Endpoints) == 0 {
		return true, ""
	}
	ttftObj, tpotObj := a.j.objectives(req)
	hasSLO := ttftObj > 0 || tpotObj > 0
	shed := a.j.p.ShedTTFTMs / 1000
	if !hasSLO && shed <= 0 {
		return true, ""
	}
	cached, buf := a.j.matches(in)
	defer a.j.release(buf)

	bestTTFT, bestRatio := math.Inf(1), math.Inf(1)
	for i, ep := range in.Endpoints {
		v := a.j.judge(req, ep, matchAt(cached, i), ttftObj, tpotObj)
		if !v.judged {
			return true, ""
		}
		if hasSLO && v.ratio <= 1 {
			return true, ""
		}
		if !hasSLO && v.ttft <= shed {
			return true, ""
		}
		bestTTFT = min(bestTTFT, v.ttft)
		bestRatio = min(bestRatio, v.ratio)
	}
	best := time.Duration(bestTTFT * float64(time.Second)).Round(time.Millisecond)
	if !hasSLO {
		return false, fmt.Sprintf("sheddable request: every endpoint's predicted TTFT exceeds %v (best %v)",
			time.Duration(shed*float64(time.Second)), best)
	}
	return false, fmt.Sprintf("sheddable request: no endpoint predicted to meet its SLO (ttft %v, tpot %v; best predicted TTFT %v, %.2f× the objective)",
		req.SLO.TTFT, req.SLO.TPOT, best, bestRatio)
}
