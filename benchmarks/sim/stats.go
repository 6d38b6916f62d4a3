package sim

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// SLO is the latency objective that goodput counts against: a request is
// "good" when its time to first token is at most TTFT and its mean time per
// output token is at most TPOT. A zero field is no objective.
//
// In JSON an SLO is {"ttft_s": seconds, "tpot_s": seconds}, like the
// report's other times.
type SLO struct {
	// TTFT is the time-to-first-token objective.
	TTFT time.Duration
	// TPOT is the objective on the mean time per output token.
	TPOT time.Duration
}

type sloJSON struct {
	TTFT float64 `json:"ttft_s"`
	TPOT float64 `json:"tpot_s"`
}

// MarshalJSON encodes the objectives in seconds.
func (s SLO) MarshalJSON() ([]byte, error) {
	return json.Marshal(sloJSON{TTFT: s.TTFT.Seconds(), TPOT: s.TPOT.Seconds()})
}

// UnmarshalJSON decodes objectives in seconds.
func (s *SLO) UnmarshalJSON(data []byte) error {
	var v sloJSON
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	s.TTFT = time.Duration(math.Round(v.TTFT * float64(time.Second)))
	s.TPOT = time.Duration(math.Round(v.TPOT * float64(time.Second)))
	return nil
}

// met reports whether a request with the given TTFT and TPOT (seconds) met s.
func (s SLO) met(ttft, tpot float64) bool {
	if s.TTFT > 0 && ttft > s.TTFT.Seconds() {
		return false
	}
	if s.TPOT > 0 && tpot > s.TPOT.Seconds() {
		return false
	}
	return true
}

// Metrics are the figures of one simulation run (one scenario, load and
// policy). Times are in seconds. Percentiles are nearest-rank over the
// completed requests.
type Metrics struct {
	// Policy is the policy's name.
	Policy string `json:"name"`
	// Requests is the number of requests in the workload; Completed of them
	// finished; Failed were rejected by the policy or did not finish before
	// the run's time limit.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`

	// TTFT is the time to first token, from arrival at the router to the
	// first output token (network delay to the pod included).
	TTFTMean float64 `json:"ttft_mean_s"`
	TTFTP50  float64 `json:"ttft_p50_s"`
	TTFTP90  float64 `json:"ttft_p90_s"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	// TPOT is the time per output token after the first:
	// (end − first token) / (output tokens − 1), over requests with at least
	// two output tokens.
	TPOTMean float64 `json:"tpot_mean_s"`
	TPOTP99  float64 `json:"tpot_p99_s"`
	// E2E is the end-to-end latency from arrival to the last token.
	E2EMean float64 `json:"e2e_mean_s"`
	E2EP99  float64 `json:"e2e_p99_s"`

	// OutputTokensPerSec is the output tokens of completed requests divided
	// by the run's span (first arrival to last completion).
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// Goodput is the number of completed requests that met the SLO per
	// second of span; SLOAttainment is their fraction of all requests.
	Goodput       float64 `json:"goodput"`
	SLOAttainment float64 `json:"slo_attainment"`

	// PrefixHitRate is the servers' own prefix-cache hit rate over the run:
	// Σ hit tokens / Σ queried tokens across pods (vLLM's
	// prefix_cache_hits / prefix_cache_queries).
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// Preemptions is the number of recompute preemptions across pods.
	Preemptions uint64 `json:"preemptions"`
	// Imbalance is max / mean of the requests routed to each pod (1 is an
	// even spread). On a heterogeneous fleet an even spread is not the goal;
	// read it next to the pod list.
	Imbalance float64 `json:"imbalance"`
	// PerPod is the number of requests routed to each pod, in pod order.
	PerPod []int `json:"per_pod"`
	// Span is the virtual time from the first arrival to the last
	// completion, in seconds.
	Span float64 `json:"span_s"`

	// TTFTs holds every completed request's TTFT in seconds in completion
	// order, for plots (CDFs). Not serialised.
	TTFTs []float64 `json:"-"`
	// Arrivals holds, aligned with TTFTs, each completed request's arrival
	// time in seconds from the start of the run, for plots of TTFT over
	// time. Not serialised.
	Arrivals []float64 `json:"-"`
}

// collector accumulates per-request figures during a run.
type collector struct {
	slo          SLO
	ttft, tpot   []float64
	e2e          []float64
	arrivals     []float64
	good         int
	outputTokens int64
	first, last  time.Duration
	seen         bool
}

func (c *collector) reset(n int, slo SLO) {
	c.slo = slo
	c.ttft = slices.Grow(c.ttft[:0], n)
	c.tpot = slices.Grow(c.tpot[:0], n)
	c.e2e = slices.Grow(c.e2e[:0], n)
	c.arrivals = slices.Grow(c.arrivals[:0], n)
	c.good, c.outputTokens, c.first, c.last, c.seen = 0, 0, 0, 0, false
}

func (c *collector) arrival(at time.Duration) {
	if !c.seen {
		c.first, c.seen = at, true
	}
}

func (c *collector) complete(arrival, first, end time.Duration, outputTokens int) {
	ttft := (first - arrival).Seconds()
	tpot := 0.0
	if outputTokens > 1 {
		tpot = (end - first).Seconds() / float64(outputTokens-1)
		c.tpot = append(c.tpot, tpot)
	}
	c.ttft = append(c.ttft, ttft)
	c.arrivals = append(c.arrivals, arrival.Seconds())
	c.e2e = append(c.e2e, (end - arrival).Seconds())
	c.outputTokens += int64(outputTokens)
	if c.slo.met(ttft, tpot) {
		c.good++
	}
	if end > c.last {
		c.last = end
	}
}

// fill writes the collected figures into m.
func (c *collector) fill(m *Metrics) {
	m.Completed = len(c.ttft)
	m.TTFTs = slices.Clone(c.ttft)
	m.Arrivals = slices.Clone(c.arrivals)
	m.TTFTMean = mean(c.ttft)
	m.TPOTMean = mean(c.tpot)
	m.E2EMean = mean(c.e2e)
	slices.Sort(c.ttft)
	slices.Sort(c.tpot)
	slices.Sort(c.e2e)
	m.TTFTP50 = Percentile(c.ttft, 50)
	m.TTFTP90 = Percentile(c.ttft, 90)
	m.TTFTP99 = Percentile(c.ttft, 99)
	m.TPOTP99 = Percentile(c.tpot, 99)
	m.E2EP99 = Percentile(c.e2e, 99)
	if span := (c.last - c.first).Seconds(); span > 0 {
		m.Span = span
		m.OutputTokensPerSec = float64(c.outputTokens) / span
		m.Goodput = float64(c.good) / span
	}
	if m.Requests > 0 {
		m.SLOAttainment = float64(c.good) / float64(m.Requests)
	}
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, which must be sorted ascending; 0 for an empty slice.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	return sorted[nearestRank(p/100, n)-1]
}

// nearestRank returns the nearest rank ⌈q × n⌉ of the q-quantile of n
// values, clamped to [1, n]. q × n is rounded first when it is within
// floating-point error of a whole number: p = 99.9 of 1000 values is
// 0.9990000000000001 × 1000 in float64, and its ceiling would be rank 1000
// instead of 999.
func nearestRank(q float64, n int) int {
	x := q * float64(n)
	if r := math.Round(x); math.Abs(x-r) <= 1e-9*r {
		x = r
	}
	return min(max(int(math.Ceil(x)), 1), n)
}

// imbalance returns max / mean of counts, 0 when there are none.
func imbalance(counts []int) float64 {
	total, mx := 0, 0
	for _, c := range counts {
		total += c
		mx = max(mx, c)
	}
	if total == 0 {
		return 0
	}
	return float64(mx) / (float64(total) / float64(len(counts)))
}
