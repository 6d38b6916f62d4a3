package scorer

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/inferroute/inferroute/internal/canon"
	"github.com/inferroute/inferroute/signals"
)

// Compile-time guards.
var (
	_ Normalized = (*QueueScorer)(nil)
	_ Normalized = (*KVCacheScorer)(nil)
	_ Normalized = (*RunningScorer)(nil)
	_ Normalized = (*LoRAScorer)(nil)
	_ Normalized = (*TokenLoadScorer)(nil)
	_ Normalized = BurstScorer{}
	_ Normalized = (*PrefillScorer)(nil)
	_ Normalized = (*PrefixScorer)(nil)
)

// NormalizedScores implements Normalized: InverseMinMax scores.
func (*QueueScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: Invert scores.
func (*KVCacheScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: InverseMinMax scores.
func (*RunningScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: scores from a fixed table.
func (LoRAScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: InverseMinMax scores.
func (TokenLoadScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: 1/(1+r) with r ≥ 0.
func (BurstScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: RelativeToBest scores.
func (*PrefillScorer) NormalizedScores() {}

// NormalizedScores implements Normalized: 0, 1, or PartialCredit (≤ 1)
// times a fraction of the best match.
func (*PrefixScorer) NormalizedScores() {}

// QueueScorer prefers endpoints with fewer waiting requests. Raw values are
// the corrected queue depths (signals.Endpoint.QueueDepth) in the fastest
// candidate's terms (see fastestTerms): on a fleet of one GPU the depths
// themselves, while a request waiting on an endpoint labelled half as fast
// counts twice. Scores are InverseMinMax across the candidates, so the
// shortest queue scores 1.
type QueueScorer struct {
	// HalfLife ages scraped values; 0 never ages them.
	HalfLife time.Duration
}

// Score implements Scorer.
func (s *QueueScorer) Score(_ context.Context, in *Input, out []float64) {
	c := in.columns(s.HalfLife)
	if fastest, mixed := fastestSpeed(c.speed); mixed {
		for i, w := range c.waiting[:min(len(c.waiting), len(out))] {
			out[i] = fastestTerms(w, c.speed[i], fastest)
		}
	} else {
		copy(out, c.waiting)
	}
	copy(in.Raw, out)
	InverseMinMax(out)
}

// fastestSpeed returns the highest of the candidates' relative speeds
// (signals.Endpoint.RelativeSpeed, 1 for an endpoint without a speed
// label) and whether any candidate is slower. On a fleet of one speed
// there is nothing to scale: the callers then copy the counts, or pass a
// fastest of 0, which fastestTerms scales nothing by.
func fastestSpeed(speeds []float64) (fastest float64, mixed bool) {
	if len(speeds) == 0 {
		return 1, false
	}
	fastest, slowest := speeds[0], speeds[0]
	for _, s := range speeds[1:] {
		if s > fastest {
			fastest = s
		} else if s < slowest {
			slowest = s
		}
	}
	return fastest, slowest < fastest
}

// fastestTerms converts a count of waiting requests on an endpoint of
// relative speed s into the fastest candidate's terms: scaled by fastest/s,
// so that on an endpoint labelled a fifth as fast one waiting request
// weighs as much as five on the fastest. A waiting request holds a slow
// pod for longer, and counts that ignore this equalise queue lengths in
// requests instead of in time: on routebench's mixed fleet at 90% load (2
// H100, 3 A100, 3 L4) the L4 pods, which serve about a twentieth of an
// H100's requests, held as many waiting requests as the H100s and the
// whole of the p99. Without speed labels every endpoint counts at speed 1
// and nothing is scaled.
func fastestTerms(waiting, s, fastest float64) float64 {
	if s < fastest {
		return waiting * (fastest / s)
	}
	return waiting
}

// BurstScorer prefers endpoints that received less work in the last few
// hundred milliseconds (signals.Endpoint.RecentDispatches): those requests
// are probably still in prefill, and a new one would share the prefill
// budget with them. It is the local signal that keeps a burst from
// colliding on one pod between scrapes and spaces requests like
// round-robin when nothing else differs.
//
// On a mixed fleet a recent dispatch costs a slow pod more: each one is
// counted as fastest/own times as heavy, from the throughputs the latency
// predictor publishes (signals.Endpoint.Throughput; a pod not measured yet
// counts as the mean of those measured), so a pod four times slower is
// spaced four times wider. Scores are 1/(1+weighted count), an absolute
// scale: one recent dispatch to the fastest pod halves its score whatever
// the others hold.
type BurstScorer struct{}

// Score implements Scorer.
func (BurstScorer) Score(_ context.Context, in *Input, out []float64) {
	c := in.unagedColumns()
	var fastest, sum float64
	var n int
	for _, tp := range c.throughput {
		if tp > 0 {
			fastest = max(fastest, tp)
			sum += tp
			n++
		}
	}
	raw := in.Raw[:len(c.recent)]
	out = out[:len(c.recent)]
	if n == 0 {
		for i, r := range c.recent {
			raw[i] = r
			out[i] = 1 / (1 + r)
		}
		return
	}
	unmeasured := fastest / (sum / float64(n)) // the weight of a pod at the mean
	for i, r := range c.recent {
		if r > 0 { // an idle pod stays at 0 whatever its weight (0 × Inf is NaN)
			w := unmeasured
			if inv := c.invThroughput[i]; inv > 0 {
				w = fastest * inv
			}
			// Throughputs far apart can make the weight or the product
			// overflow: capped, so that raw values stay finite.
			r = min(r*w, math.MaxFloat64)
		}
		raw[i] = r
		out[i] = 1 / (1 + r)
	}
}

// RunningScorer prefers endpoints with smaller running batches. Raw values
// are the corrected running counts; scores are InverseMinMax.
type RunningScorer struct {
	// HalfLife ages scraped values; 0 never ages them.
	HalfLife time.Duration
}

// Score implements Scorer.
func (s *RunningScorer) Score(_ context.Context, in *Input, out []float64) {
	loads := in.Loads(s.HalfLife)
	for i := range loads {
		out[i] = loads[i].Running
	}
	copy(in.Raw, out)
	InverseMinMax(out)
}

// KVCacheScorer prefers endpoints with free KV cache. The score is
// 1 − utilisation on a fixed scale, so a half-full cache scores 0.5 in every
// pick (unlike a min-max score, which would call the emptier of two nearly
// full caches perfect). Unknown utilisation scores Neutral.
type KVCacheScorer struct {
	// HalfLife ages scraped values; 0 never ages them.
	HalfLife time.Duration
}

// Score implements Scorer.
func (s *KVCacheScorer) Score(_ context.Context, in *Input, out []float64) {
	copy(out, in.columns(s.HalfLife).kv) // NaN when not known
	copy(in.Raw, out)
	Invert(out)
}

// LoRAScorer prefers endpoints where the request's adapter is already
// resident: running 1, waiting 0.8, a free slot 0.6, unknown Neutral, every
// slot taken by other adapters 0. Requests without an adapter score 1
// everywhere.
type LoRAScorer struct{}

// loraScores maps a Residency to its score.
var loraScores = [...]float64{
	signals.ResidencyUnknown:  Neutral,
	signals.ResidencyEvict:    0,
	signals.ResidencyFreeSlot: 0.6,
	signals.ResidencyWaiting:  0.8,
	signals.ResidencyRunning:  1,
}

// Score implements Scorer.
func (LoRAScorer) Score(_ context.Context, in *Input, out []float64) {
	if in.Request.Adapter == "" {
		// Every endpoint serves the base model as it is
		// (signals.Endpoint.LoRAResidency): no need to look at them.
		for i := range in.Endpoints {
			in.Raw[i] = float64(signals.ResidencyRunning)
			out[i] = loraScores[signals.ResidencyRunning]
		}
		return
	}
	for i, ep := range in.Endpoints {
		r := ep.LoRAResidency(in.Request.Adapter, in.Now)
		in.Raw[i] = float64(r)
		out[i] = loraScores[r]
	}
}

// TokenLoadScorer prefers endpoints with the least prefill work in flight
// from this process: in-flight uncached prompt tokens divided by the
// endpoint's measured throughput when known (seconds of work), else the raw
// token count. Scores are InverseMinMax. When some candidates have a
// measured throughput and others do not, the unmeasured ones are assumed to
// run at the mean of the measured ones, so the units stay comparable.
type TokenLoadScorer struct{}

// Score implements Scorer.
func (TokenLoadScorer) Score(_ context.Context, in *Input, out []float64) {
	loads := in.unagedLoads()
	var sum float64
	var n int
	for i := range loads {
		if tp := loads[i].Throughput; tp > 0 {
			sum += tp
			n++
		}
	}
	mean := 1.0
	if n > 0 {
		mean = sum / float64(n)
	}
	for i := range loads {
		tp := loads[i].Throughput
		if tp <= 0 {
			tp = mean
		}
		out[i] = float64(loads[i].InFlightTokens) / tp
	}
	copy(in.Raw, out)
	InverseMinMax(out)
}

// Compile-time guards.
var (
	_ Filter = (*ModelFilter)(nil)
	_ Filter = (*HealthyFilter)(nil)
	_ Filter = (*SaturationFilter)(nil)
	_ Filter = (*SubsetFilter)(nil)
)

// keep compacts the endpoints for which ok is true to the front of eps, in
// order, and returns them. When none is kept eps is left unchanged.
func keep(eps []*signals.Endpoint, ok func(*signals.Endpoint) bool) []*signals.Endpoint {
	n := 0
	for _, ep := range eps {
		if ok(ep) {
			eps[n] = ep
			n++
		}
	}
	return eps[:n]
}

// ModelFilter keeps endpoints that serve the request's model and adapter.
// An endpoint with no Model serves any model; an endpoint with nil Adapters
// may load any adapter. A request with no model passes the model check on
// every endpoint, and one with no adapter the adapter check; a request with
// an adapter but no model still keeps only the endpoints that list it (or
// list no adapters).
type ModelFilter struct{}

// Filter implements Filter.
func (ModelFilter) Filter(_ context.Context, in *Input) []*signals.Endpoint {
	req := in.Request
	return keep(in.Endpoints, func(ep *signals.Endpoint) bool {
		if req.Model != "" && ep.Model != "" && ep.Model != req.Model {
			return false
		}
		if req.Adapter == "" || ep.Adapters == nil {
			return true
		}
		for _, a := range ep.Adapters {
			if a == req.Adapter {
				return true
			}
		}
		return false
	})
}

// HealthyFilter keeps endpoints marked healthy: not after consecutive
// failed scrapes, not after a connect error reported through Done, until a
// success brings them back.
type HealthyFilter struct{}

// Filter implements Filter.
func (HealthyFilter) Filter(_ context.Context, in *Input) []*signals.Endpoint {
	return keep(in.Endpoints, (*signals.Endpoint).Healthy)
}

// SaturationFilter drops endpoints whose KV cache utilisation or queue depth
// is at or over its threshold. Queue depths count in the fastest
// candidate's terms (as the queue scorer's): among endpoints labelled with
// their speed (signals.Endpoint.RelativeSpeed) a pod a fifth as fast as the
// fastest candidate is saturated at a fifth of QueueThreshold. If every
// endpoint is over, it keeps the least saturated one (the lowest of
// max(kv/KVThreshold, queue/QueueThreshold), the queue so scaled), so
// saturation alone never empties the pool. A zero threshold disables that
// check.
type SaturationFilter struct {
	// KVThreshold is the utilisation in (0, 1] at which an endpoint is saturated.
	KVThreshold float64 `yaml:"kvThreshold" json:"kvThreshold"`
	// QueueThreshold is the queue depth at which the fastest candidate is
	// saturated (every candidate, on a fleet of one speed).
	QueueThreshold float64 `yaml:"queueThreshold" json:"queueThreshold"`
	// HalfLife ages the scraped values (set from Env by the registry).
	HalfLife time.Duration `yaml:"-" json:"-"`
}

// DefaultSaturationFilter returns the thresholds used when none are
// configured: KV 0.95 (vLLM starts preempting as the cache fills; a pod this
// full will preempt on the next long prompt) and 10 waiting requests.
//
// The queue threshold counts requests, not work, so the slowest pods a
// fleet mixes in set it: on routebench's mixed fleet an L4 pod serves about
// 0.3 requests/s, so 10 waiting there is half a minute of queue, while the
// faster pods' queues stay far below it until the fleet saturates. Lowered
// from 64 to 10, it cut that scenario's p99 TTFT at 90% load by 2–3× in
// each of five seeds (146 → 62 s with seed 1, 172 → 70 s with seed 4,
// below llm-d's in each), left the bursty scenario unchanged and moved
// the uniform, prefix and Azure ones by less than the seeds' spread.
// Much lower, it turns away long-prompt traffic that queues in requests
// but not in time (the Mooncake trace at 90% load: p99 4.8 s at 10, 22 s
// at 4). Since then the count is taken in the fastest candidate's terms
// (fastestTerms), which saturates labelled slow pods sooner still: with 10
// an L4 among H100s saturates at 1.8 waiting requests, and that scenario's
// p99 at 90% load fell by another 3× (63.4 s to 23.6 s with seed 1; the
// figures are in picker.DefaultConfig's comment). 16 in those terms did no better over
// seeds 1–4 (the mixed fleet's p99 0.99 times, the uniform fleet's at 90%
// load 1.07 times 10's).
func DefaultSaturationFilter() SaturationFilter {
	return SaturationFilter{KVThreshold: 0.95, QueueThreshold: 10}
}

func (f *SaturationFilter) validate() error {
	if f.KVThreshold < 0 || f.KVThreshold > 1 || math.IsNaN(f.KVThreshold) {
		return fmt.Errorf("kvThreshold: %v is not in [0, 1]", f.KVThreshold)
	}
	if f.QueueThreshold < 0 || math.IsNaN(f.QueueThreshold) {
		return fmt.Errorf("queueThreshold: %v is negative", f.QueueThreshold)
	}
	return nil
}

// saturation returns how saturated a candidate with the given KV-cache
// utilisation (NaN when not known) and queue depth is: ≥ 1 means at or over
// a threshold.
func (f *SaturationFilter) saturation(kv, waiting float64) float64 {
	var s float64
	if f.KVThreshold > 0 && kv == kv {
		s = kv / f.KVThreshold
	}
	if f.QueueThreshold > 0 {
		s = max(s, waiting/f.QueueThreshold)
	}
	return s
}

// under reports whether a candidate is under every threshold, comparing
// with the thresholds themselves (no division on the common path).
func (f *SaturationFilter) under(kv, waiting float64) bool {
	if f.KVThreshold > 0 && kv >= f.KVThreshold { // false for NaN: not known
		return false
	}
	return f.QueueThreshold <= 0 || waiting < f.QueueThreshold
}

// Filter implements Filter. Endpoints under every threshold are compacted
// to the front; only when none is does a second pass look for the least
// saturated one.
func (f *SaturationFilter) Filter(_ context.Context, in *Input) []*signals.Endpoint {
	c := in.columns(f.HalfLife)
	fastest, mixed := fastestSpeed(c.speed)
	if !mixed {
		fastest = 0 // one speed: fastestTerms scales nothing
	}
	n := 0
	for i, ep := range in.Endpoints {
		if f.under(c.kv[i], fastestTerms(c.waiting[i], c.speed[i], fastest)) {
			in.Endpoints[n] = ep
			n++
		}
	}
	if n > 0 || len(in.Endpoints) == 0 {
		return in.Endpoints[:n]
	}
	best, bestSat := 0, math.Inf(1)
	for i := range in.Endpoints {
		if s := f.saturation(c.kv[i], fastestTerms(c.waiting[i], c.speed[i], fastest)); s < bestSat {
			best, bestSat = i, s
		}
	}
	in.Endpoints[0] = in.Endpoints[best]
	return in.Endpoints[:1]
}

// SubsetFilter restricts the candidates to a subset named in request
// headers: a comma-separated list of endpoint addresses (the Gateway API
// Inference Extension's subset hint) and/or a comma-separated list of
// key=value labels that must all match. A request without the headers
// passes every endpoint. Unknown addresses in the hint are ignored; a hint
// that matches nothing empties the set (the picker's fail policy decides).
type SubsetFilter struct {
	// AddressHeader names the header with the address subset.
	AddressHeader string `yaml:"addressHeader" json:"addressHeader"`
	// LabelHeader names the header with the label selector.
	LabelHeader string `yaml:"labelHeader" json:"labelHeader"`

	// canonical is set when the names are in canonical form (the
	// registry's filter), so that Filter looks them up without
	// canonicalizing them on every request.
	canonical bool
}

// DefaultSubsetFilter returns the header names used when none are
// configured.
func DefaultSubsetFilter() SubsetFilter {
	return SubsetFilter{
		AddressHeader: "x-gateway-destination-endpoint-subset",
		LabelHeader:   "x-inferroute-labels",
	}
}

// Filter implements Filter.
func (f *SubsetFilter) Filter(_ context.Context, in *Input) []*signals.Endpoint {
	h := in.Request.Headers
	if h == nil {
		return in.Endpoints
	}
	get := http.Header.Get
	if f.canonical {
		get = canon.Get
	}
	addrs := get(h, f.AddressHeader)
	labels := get(h, f.LabelHeader)
	if addrs == "" && labels == "" {
		return in.Endpoints
	}
	return keep(in.Endpoints, func(ep *signals.Endpoint) bool {
		if addrs != "" && !listHas(addrs, ep.Address) {
			return false
		}
		return labels == "" || labelsMatch(labels, ep.Labels)
	})
}

// listHas reports whether the comma-separated list contains s, ignoring
// spaces around items, without allocating.
func listHas(list, s string) bool {
	for list != "" {
		item := list
		if i := strings.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = ""
		}
		if strings.TrimSpace(item) == s {
			return true
		}
	}
	return false
}

// labelsMatch reports whether every key=value item of the comma-separated
// selector is in labels. An item without '=' requires the key to exist.
func labelsMatch(sel string, labels map[string]string) bool {
	for sel != "" {
		item := sel
		if i := strings.IndexByte(sel, ','); i >= 0 {
			item, sel = sel[:i], sel[i+1:]
		} else {
			sel = ""
		}
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, hasV := item, "", false
		if i := strings.IndexByte(item, '='); i >= 0 {
			k, v, hasV = strings.TrimSpace(item[:i]), strings.TrimSpace(item[i+1:]), true
		}
		got, ok := labels[k]
		if !ok || (hasV && got != v) {
			return false
		}
	}
	return true
}
