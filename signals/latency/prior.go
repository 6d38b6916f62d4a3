package latency

import (
	"math"
	"strconv"
	"strings"

	"github.com/inferroute/inferroute/signals"
)

// Endpoint labels the predictor reads for its cold-start prior.
const (
	// LabelRelativeSpeed is a positive float: the endpoint's prefill speed
	// relative to an NVIDIA A100 serving the same model (2 = twice as fast).
	// It takes precedence over LabelGPU.
	LabelRelativeSpeed = "inferroute.io/relative-speed"
	// LabelGPU names the endpoint's accelerator ("h100", "a100", "l4", …);
	// GPURelativeSpeed lists the known names.
	LabelGPU = "inferroute.io/gpu"
)

// GPURelativeSpeed returns the prefill speed of a GPU class relative to an
// A100, and whether the name is known. Names are case-insensitive and may
// carry a memory or form-factor suffix ("h100-80gb", "A100-SXM4-40GB").
//
// Sources. H100 and H200: 2.2, the measured ratio of A100-80GB to
// H100-80GB prompt (prefill) time for Llama-2-70B at 2k–8k prompt tokens in
// the Splitwise simulator's measured performance model (Patel et al.,
// "Splitwise: Efficient Generative LLM Inference Using Phase Splitting",
// ISCA 2024; data/perf_model.csv, copied in perf/splitwise_perf_model.csv);
// the H200 has the H100's compute. The others have no measurement in perf/
// and use the ratio of dense BF16 tensor throughput on NVIDIA's data sheets
// to the A100's 312 TFLOPS: L40S 362 (1.16), A10 125 (0.40), L4 121 (0.39).
// Prefill is compute-bound, so peak compute orders the cards; the data-sheet
// ratios are optimistic for big cards (the H100's is 3.2, measured 2.2), and
// the learned model replaces all of them after a few samples.
func GPURelativeSpeed(name string) (float64, bool) {
	n := strings.ToLower(strings.TrimSpace(name))
	switch {
	case strings.HasPrefix(n, "h100"), strings.HasPrefix(n, "h200"):
		return 2.2, true
	case strings.HasPrefix(n, "a100"):
		return 1, true
	case strings.HasPrefix(n, "l40s"):
		return 1.16, true
	case strings.HasPrefix(n, "a10"):
		return 0.40, true
	case strings.HasPrefix(n, "l4"):
		return 0.39, true
	}
	return 0, false
}

// RelativeSpeed returns the endpoint's prefill speed relative to an A100
// from its labels (LabelRelativeSpeed, else LabelGPU) and whether a label
// gave it; without one it returns 1, false. Speeds are clamped to
// [0.01, 100]. It is safe for concurrent use (labels are read-only).
func RelativeSpeed(ep *signals.Endpoint) (float64, bool) {
	if ep == nil {
		return 1, false
	}
	if s, ok := ep.Labels[LabelRelativeSpeed]; ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err == nil && v > 0 && !math.IsInf(v, 0) {
			return min(max(v, 0.01), 100), true
		}
	}
	if g, ok := ep.Labels[LabelGPU]; ok {
		if v, ok := GPURelativeSpeed(g); ok {
			return v, true
		}
	}
	return 1, false
}
