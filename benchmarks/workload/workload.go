package workload

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Request is one inference request of a workload.
//
// Blocks describe the prompt's content: Blocks[i] covers tokens
// [i*BlockTokens, (i+1)*BlockTokens) of the prompt, the last block possibly
// partial. Two requests share a prefix of k blocks exactly when their first
// k ids are equal (and their Adapter is equal, since an adapter changes the
// KV values). len(Blocks) == ceil(PromptTokens/BlockTokens) for every
// request produced by this package. Blocks may be shared with other
// requests and workloads and must be treated as read-only.
type Request struct {
	// Arrival is the request's arrival time as an offset from the start of
	// the run.
	Arrival time.Duration
	// Tenant names the client or service that sent the request; "" when
	// the source has no tenants.
	Tenant string
	// Model is the requested model; "" means the default model.
	Model string
	// Adapter is the LoRA adapter the request needs, or "".
	Adapter string
	// Blocks are the prompt's content-block ids (see the type comment).
	Blocks []uint64
	// BlockTokens is the number of tokens per content block: 16 for the
	// generators (one vLLM KV block), 512 for Mooncake hash_ids and the
	// Azure traces.
	BlockTokens int
	// PromptTokens is the prompt length in tokens, >= 1.
	PromptTokens int
	// OutputTokens is the number of tokens the request generates, >= 1.
	OutputTokens int
	// Session identifies the conversation a multi-turn request belongs
	// to, or "".
	Session string
	// Priority orders requests under overload: 0 is the default, negative
	// is sheddable, positive is critical.
	Priority int
}

// Workload is a named request stream. Requests are sorted by Arrival (ties
// keep their source order). The zero value is an empty workload.
type Workload struct {
	// Name labels the workload in reports.
	Name string
	// Requests are sorted by Arrival.
	Requests []Request
	// Start is the wall-clock time of offset 0 when the source has one
	// (the Azure traces' TIMESTAMP of the first request), or the zero
	// time. Merge uses it to align traces recorded side by side.
	Start time.Time
}

// Merge interleaves the requests of ws by arrival into a new workload, for
// example the Azure code and conv traces as two tenants. If every input
// has a Start time, the inputs are aligned on the wall clock: each one's
// arrivals are shifted by its Start minus the earliest Start, which
// becomes the result's Start (the Azure conv trace starts 77 s before the
// code trace). Otherwise arrivals are merged as they are. Ties keep the
// order of ws, then each workload's own order. Nil workloads are skipped.
// The name joins the inputs' names with "+". Blocks slices are shared with
// the inputs.
func Merge(ws ...*Workload) *Workload {
	n := 0
	var names []string
	var origin time.Time
	aligned := true
	for _, w := range ws {
		if w == nil {
			continue
		}
		n += len(w.Requests)
		names = append(names, w.Name)
		if w.Start.IsZero() {
			aligned = false
		} else if origin.IsZero() || w.Start.Before(origin) {
			origin = w.Start
		}
	}
	out := &Workload{Name: strings.Join(names, "+"), Requests: make([]Request, 0, n)}
	if aligned {
		out.Start = origin
	}
	for _, w := range ws {
		if w == nil {
			continue
		}
		k := len(out.Requests)
		out.Requests = append(out.Requests, w.Requests...)
		if aligned {
			shift := w.Start.Sub(origin)
			for i := k; i < len(out.Requests); i++ {
				out.Requests[i].Arrival += shift
			}
		}
	}
	sortByArrival(out.Requests)
	return out
}

// sortByArrival sorts rs by arrival, keeping the order of ties; traces are
// usually sorted already, which is checked first.
func sortByArrival(rs []Request) {
	byArrival := func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) }
	if !slices.IsSortedFunc(rs, byArrival) {
		slices.SortStableFunc(rs, byArrival)
	}
}

// clone returns a copy of w with its own Requests slice (Blocks shared).
func (w *Workload) clone() *Workload {
	return &Workload{Name: w.Name, Requests: slices.Clone(w.Requests), Start: w.Start}
}

// Scale returns a copy of w whose arrival offsets are multiplied by one
// common factor so that its mean rate (see Stats.MeanRate) becomes rate
// requests per second. Multiplying by one factor keeps the burst shape: the
// ratios between inter-arrival times, hence their coefficient of
// variation, are unchanged. Arrivals that would pass the largest Duration
// (a rate so low that the run outlasts about 292 years) saturate at it,
// so the result stays sorted. A workload with fewer than two requests or a
// zero span has no rate and is returned as an unchanged copy. Scale panics
// if rate is not a positive finite number (a programming error, like a
// non-positive time.NewTicker period). Start is kept.
func (w *Workload) Scale(rate float64) *Workload {
	if !(rate > 0) || math.IsInf(rate, 0) {
		panic(fmt.Sprintf("workload: Scale rate must be positive and finite, got %v", rate))
	}
	out := w.clone()
	cur := meanRate(w.Requests)
	if cur == 0 {
		return out
	}
	f := cur / rate
	for i := range out.Requests {
		// Float-to-integer conversion of an out-of-range value is
		// implementation-defined, so saturate explicitly.
		a := math.Round(float64(out.Requests[i].Arrival) * f)
		if a >= math.MaxInt64 {
			out.Requests[i].Arrival = math.MaxInt64
		} else {
			out.Requests[i].Arrival = time.Duration(a)
		}
	}
	return out
}

// Limit returns a copy of w holding at most its first n requests (none if
// n <= 0).
func (w *Workload) Limit(n int) *Workload {
	n = max(0, min(n, len(w.Requests)))
	return &Workload{Name: w.Name, Requests: slices.Clone(w.Requests[:n]), Start: w.Start}
}

// Window returns a copy of w holding the requests with from <= Arrival <
// to, with arrivals shifted by -from so that the window starts the run
// (and Start, if set, moved forward by from).
func (w *Workload) Window(from, to time.Duration) *Workload {
	lo, _ := slices.BinarySearchFunc(w.Requests, from, func(r Request, t time.Duration) int { return cmp.Compare(r.Arrival, t) })
	hi, _ := slices.BinarySearchFunc(w.Requests, to, func(r Request, t time.Duration) int { return cmp.Compare(r.Arrival, t) })
	hi = max(hi, lo)
	out := &Workload{Name: w.Name, Requests: slices.Clone(w.Requests[lo:hi])}
	if !w.Start.IsZero() {
		out.Start = w.Start.Add(from)
	}
	for i := range out.Requests {
		out.Requests[i].Arrival -= from
	}
	return out
}

// Stats summarises a workload. Percentiles are nearest-rank, the method of
// ../shared/traces/PROVENANCE.md, so its published numbers can be checked.
type Stats struct {
	// Requests is the number of requests.
	Requests int
	// Duration is the span from the first to the last arrival.
	Duration time.Duration
	// MeanRate is (Requests-1)/Duration in requests per second: the
	// reciprocal of the mean inter-arrival time. 0 with fewer than two
	// requests or a zero span.
	MeanRate float64
	// InterArrivalCV is the coefficient of variation (population standard
	// deviation over mean) of the inter-arrival times: 1 for Poisson
	// arrivals, larger for bursty ones. 0 when undefined.
	InterArrivalCV float64
	// PromptMean, PromptP50, PromptP90 and PromptP99 describe prompt
	// lengths in tokens.
	PromptMean                      float64
	PromptP50, PromptP90, PromptP99 int
	// OutputMean, OutputP50, OutputP90 and OutputP99 describe output
	// lengths in tokens.
	OutputMean                      float64
	OutputP50, OutputP90, OutputP99 int
	// SharedPrefixFraction is the fraction of all prompt tokens that lie in
	// the leading run of a request's blocks that some earlier request
	// already had (same ids at the same positions, same adapter): the
	// prefix-cache hit rate of one infinite global cache. It is the
	// "prefix-hit, tokens" figure of PROVENANCE.md.
	SharedPrefixFraction float64
	// SharedBlockFraction is the same measure counted in blocks.
	SharedBlockFraction float64
	// Tenants, Sessions and Adapters count distinct non-empty values.
	Tenants, Sessions, Adapters int
	// AdapterFraction is the fraction of requests that name an adapter.
	AdapterFraction float64
}

// Stats computes the workload's summary statistics. It runs in time linear
// in the total number of blocks (plus sorting the lengths) and does not
// modify w.
func (w *Workload) Stats() Stats {
	rs := w.Requests
	s := Stats{Requests: len(rs)}
	if len(rs) == 0 {
		return s
	}
	s.Duration = rs[len(rs)-1].Arrival - rs[0].Arrival
	s.MeanRate = meanRate(rs)
	s.InterArrivalCV = interArrivalCV(rs)

	prompts := make([]int, len(rs))
	outputs := make([]int, len(rs))
	tenants := map[string]struct{}{}
	sessions := map[string]struct{}{}
	adapters := map[string]struct{}{}
	withAdapter := 0
	var promptSum, outputSum float64
	for i := range rs {
		r := &rs[i]
		prompts[i], outputs[i] = r.PromptTokens, r.OutputTokens
		promptSum += float64(r.PromptTokens)
		outputSum += float64(r.OutputTokens)
		if r.Tenant != "" {
			tenants[r.Tenant] = struct{}{}
		}
		if r.Session != "" {
			sessions[r.Session] = struct{}{}
		}
		if r.Adapter != "" {
			adapters[r.Adapter] = struct{}{}
			withAdapter++
		}
	}
	n := float64(len(rs))
	s.PromptMean, s.OutputMean = promptSum/n, outputSum/n
	slices.Sort(prompts)
	slices.Sort(outputs)
	s.PromptP50, s.PromptP90, s.PromptP99 = nearestRank(prompts, 50), nearestRank(prompts, 90), nearestRank(prompts, 99)
	s.OutputP50, s.OutputP90, s.OutputP99 = nearestRank(outputs, 50), nearestRank(outputs, 90), nearestRank(outputs, 99)
	s.Tenants, s.Sessions, s.Adapters = len(tenants), len(sessions), len(adapters)
	s.AdapterFraction = float64(withAdapter) / n
	s.SharedPrefixFraction, s.SharedBlockFraction = sharedPrefix(rs)
	return s
}

// meanRate returns (n-1)/span in requests per second, or 0.
func meanRate(rs []Request) float64 {
	if len(rs) < 2 {
		return 0
	}
	span := rs[len(rs)-1].Arrival - rs[0].Arrival
	if span <= 0 {
		return 0
	}
	return float64(len(rs)-1) / span.Seconds()
}

// interArrivalCV returns the population coefficient of variation of the
// gaps between consecutive arrivals, or 0 when undefined.
func interArrivalCV(rs []Request) float64 {
	if len(rs) < 3 {
		return 0
	}
	var sum, sumSq float64
	for i := 1; i < len(rs); i++ {
		g := (rs[i].Arrival - rs[i-1].Arrival).Seconds()
		sum += g
		sumSq += g * g
	}
	k := float64(len(rs) - 1)
	mean := sum / k
	if mean <= 0 {
		return 0
	}
	variance := max(0, sumSq/k-mean*mean)
	return math.Sqrt(variance) / mean
}

// nearestRank returns the p-th percentile of sorted by the nearest-rank
// method: the value at rank ceil(p/100*n).
func nearestRank(sorted []int, p float64) int {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// sharedPrefix returns the token and block fractions of prompts that lie in
// a leading run of blocks already seen, at the same positions, in an
// earlier request. Positions are identified by chaining the ids, the way a
// prefix cache hashes blocks (vLLM's hash of parent hash + block content).
func sharedPrefix(rs []Request) (tokens, blocks float64) {
	total := 0
	for i := range rs {
		total += len(rs[i].Blocks)
	}
	seen := newHashSet(total)
	var hitTokens, allTokens, hitBlocks, allBlocks int
	for i := range rs {
		r := &rs[i]
		h := hashString(r.Adapter)
		hit, inRun := 0, true
		for _, id := range r.Blocks {
			h = mix(h, id)
			if seen.add(h) && inRun {
				hit++
				continue
			}
			inRun = false
		}
		hitBlocks += hit
		allBlocks += len(r.Blocks)
		hitTokens += min(hit*r.BlockTokens, r.PromptTokens)
		allTokens += r.PromptTokens
	}
	if allTokens > 0 {
		tokens = float64(hitTokens) / float64(allTokens)
	}
	if allBlocks > 0 {
		blocks = float64(hitBlocks) / float64(allBlocks)
	}
	return tokens, blocks
}

// hashSet is a set of 64-bit hashes with open addressing and linear
// probing, sized once for its capacity: a flat array, several times faster
// to fill than a Go map for the hundreds of thousands of prefix positions
// of a workload.
type hashSet struct {
	slots []uint64 // 0 is an empty slot
	mask  uint64
	zero  bool // whether 0 is in the set
}

// newHashSet returns a set that holds up to n hashes at load at most 1/2.
func newHashSet(n int) *hashSet {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	return &hashSet{slots: make([]uint64, size), mask: uint64(size - 1)}
}

// add inserts h and reports whether it was already in the set. The hashes
// are splitmix64 outputs, so their low bits index the table directly. At
// most the capacity given to newHashSet may be added.
func (s *hashSet) add(h uint64) bool {
	if h == 0 {
		had := s.zero
		s.zero = true
		return had
	}
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		switch s.slots[i] {
		case h:
			return true
		case 0:
			s.slots[i] = h
			return false
		}
	}
}

// Burstiness counts arrivals in consecutive windows of the given length,
// starting at the first arrival and covering the span up to the last, and
// returns the index of dispersion of the counts (variance over mean; 1 for
// Poisson arrivals) and the peak-to-mean ratio (largest count over mean
// count). Both are 0 for an empty workload or a non-positive window.
// These are the burstiness measures of PROVENANCE.md.
func (w *Workload) Burstiness(window time.Duration) (idc, peakToMean float64) {
	rs := w.Requests
	if len(rs) == 0 || window <= 0 {
		return 0, 0
	}
	first := rs[0].Arrival
	nw := int((rs[len(rs)-1].Arrival-first)/window) + 1
	counts := make([]int, nw)
	for i := range rs {
		counts[int((rs[i].Arrival-first)/window)]++
	}
	var sum, sumSq float64
	peak := 0
	for _, c := range counts {
		sum += float64(c)
		sumSq += float64(c) * float64(c)
		peak = max(peak, c)
	}
	mean := sum / float64(nw)
	variance := max(0, sumSq/float64(nw)-mean*mean)
	return variance / mean, float64(peak) / mean
}

// String formats the statistics on one line for logs and reports.
func (s Stats) String() string {
	return fmt.Sprintf("%d requests over %v (%.2f req/s, inter-arrival CV %.2f); prompt mean %.0f p50 %d p99 %d; output mean %.0f p50 %d p99 %d; shared prefix %.1f%% of prompt tokens",
		s.Requests, s.Duration.Round(time.Millisecond), s.MeanRate, s.InterArrivalCV,
		s.PromptMean, s.PromptP50, s.PromptP99, s.OutputMean, s.OutputP50, s.OutputP99, 100*s.SharedPrefixFraction)
}

// Tenant returns a copy of w holding only the requests of the named
// tenant, with arrivals and Start unchanged (so Stats of the result
// describe that tenant's stream inside the merged run).
func (w *Workload) Tenant(name string) *Workload {
	out := &Workload{Name: name, Start: w.Start}
	for i := range w.Requests {
		if w.Requests[i].Tenant == name {
			out.Requests = append(out.Requests, w.Requests[i])
		}
	}
	return out
}
