package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// Capacity is a fleet's measured capacity for one workload.
type Capacity struct {
	// Rate is the fleet's capacity in requests per second: the sum of
	// PerPod.
	Rate float64
	// PerPod is each pod's saturated throughput in requests per second, in
	// pod order.
	PerPod []float64
}

// CapacitySample is the largest number of requests MeasureCapacity feeds
// one pod. The measure depends on it (a deeper queue fills the KV cache and
// brings preemptions, as in vLLM), so the suite always measures on
// CapacityRequests requests.
const CapacitySample = 600

// MeasureCapacity measures the capacity of the fleet pods for workload w.
//
// Method. A pod's capacity is its saturated throughput on the share of the
// traffic that round-robin would give it: with n pods, pod i serves every
// n-th request of w (at most CapacitySample of them), all queued at time
// zero, as vLLM's benchmark_throughput.py measures offline throughput. Its
// rate is the number of completions between the 10th and the 90th
// percentile completion times divided by that time, which leaves out the
// ramp-up and the drain. The fleet's capacity is the sum over pods. Loads
// in the suite are fractions of it: at load 1.0 a perfect router would keep
// every pod's queue exactly stable; round-robin, blind to the pods'
// differences, falls behind earlier. Pods with equal engine configurations
// and equal shares are measured once.
//
// MeasureCapacity is deterministic and does not modify w. It returns an
// error when a pod completes too few requests to measure a rate.
func MeasureCapacity(pods []Pod, w *workload.Workload) (Capacity, error) {
	if len(pods) == 0 {
		return Capacity{}, ErrNoPods
	}
	c := Capacity{PerPod: make([]float64, len(pods))}
	memo := map[string]float64{}
	for i, p := range pods {
		// Equal configurations see statistically equal shares; measuring
		// the first share for each configuration keeps the cost at one run
		// per distinct pod type.
		key := fmt.Sprintf("%+v", p.Engine)
		r, ok := memo[key]
		if !ok {
			var err error
			r, err = saturatedRate(p.Engine, w, len(pods), i%len(pods))
			if err != nil {
				return Capacity{}, fmt.Errorf("sim: capacity of pod %d (%s): %w", i, p.Engine.Profile.Name, err)
			}
			memo[key] = r
		}
		c.PerPod[i] = r
		c.Rate += r
	}
	return c, nil
}

// saturatedRate runs one engine on every n-th request of w from offset,
// all queued at time zero, and returns its throughput between the 10th and
// 90th percentile completion.
func saturatedRate(cfg engine.Config, w *workload.Workload, n, offset int) (float64, error) {
	eng := engine.New(cfg)
	reqs := make([]engine.Request, 0, CapacitySample)
	for i := offset; i < len(w.Requests) && len(reqs) < CapacitySample; i += n {
		r := &w.Requests[i]
		reqs = append(reqs, engine.Request{
			ID:           uint64(len(reqs)),
			Blocks:       r.Blocks,
			BlockTokens:  r.BlockTokens,
			PromptTokens: r.PromptTokens,
			OutputTokens: r.OutputTokens,
			Adapter:      r.Adapter,
		})
	}
	added := 0
	for i := range reqs {
		if eng.Add(0, &reqs[i]) == nil {
			added++
		}
	}
	if added < 10 {
		return 0, fmt.Errorf("only %d requests to measure", added)
	}
	ends := make([]time.Duration, 0, added)
	var now time.Duration
	var evs []engine.Event
	for {
		d, ok := eng.StartStep(now)
		if !ok {
			break
		}
		now += d
		evs = eng.FinishStep(now, evs[:0])
		for _, ev := range evs {
			if ev.Kind == engine.Finished {
				ends = append(ends, ev.At)
			}
		}
	}
	if len(ends) < 10 {
		return 0, fmt.Errorf("only %d of %d requests completed", len(ends), added)
	}
	slices.Sort(ends)
	lo, hi := len(ends)/10, len(ends)*9/10
	span := (ends[hi] - ends[lo]).Seconds()
	if span <= 0 {
		return 0, fmt.Errorf("zero completion span")
	}
	return float64(hi-lo) / span, nil
}
