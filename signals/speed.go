package signals

import (
	"math"
	"strconv"
	"strings"
)

// Endpoint labels that give an endpoint's speed (Endpoint.RelativeSpeed):
// the latency predictor's cold-start prior and the saturation filter's and
// queue scorer's scaling read them.
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
// carry a memory or form-factor suffix ("h100-80gb", "A100-SXM4-40GB"),
// but not one that starts with a digit: a name is taken for a class only
// if the class name is not followed by a digit, so "l40" is not an "l4"
// and "a1000" (an RTX A1000) is not an "a100". Unlisted names are unknown.
//
// Sources. H100 and H200: 2.2, the measured ratio of A100-80GB to
// H100-80GB prompt (prefill) time for Llama-2-70B at 2k–8k prompt tokens in
// the Splitwise simulator's measured performance model (Patel et al.,
// "Splitwise: Efficient Generative LLM Inference Using Phase Splitting",
// ISCA 2024; data/perf_model.csv, copied in perf/splitwise_perf_model.csv);
// the H200 has the H100's compute. The others have no measurement in perf/
// and use the ratio of dense BF16 tensor throughput on NVIDIA's data sheets
// to the A100's 312 TFLOPS: L40S 362 (1.16), L40 181 (0.58; the L40 data
// sheet's 181.05 TFLOPS, 362.1 with sparsity), A10 125 (0.40), L4 121
// (0.39). Prefill is compute-bound, so peak compute orders the cards; the
// data-sheet ratios are optimistic for big cards (the H100's is 3.2,
// measured 2.2), and the learned model replaces all of them after a few
// samples.
func GPURelativeSpeed(name string) (float64, bool) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, g := range gpuSpeeds {
		rest, ok := strings.CutPrefix(n, g.class)
		if ok && (rest == "" || rest[0] < '0' || rest[0] > '9') {
			return g.speed, true
		}
	}
	return 0, false
}

// gpuSpeeds lists the GPU classes GPURelativeSpeed knows, a class before
// any other that is a prefix of it ("l40s" before "l40").
var gpuSpeeds = [...]struct {
	class string
	speed float64
}{
	{"h100", 2.2}, {"h200", 2.2}, {"a100", 1}, {"l40s", 1.16}, {"l40", 0.58}, {"a10", 0.40}, {"l4", 0.39},
}

// labelSpeed returns the speed the labels give (LabelRelativeSpeed, else
// LabelGPU), clamped to [0.01, 100], or 0 when no label gives one.
func labelSpeed(labels map[string]string) float64 {
	if s, ok := labels[LabelRelativeSpeed]; ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err == nil && v > 0 && !math.IsInf(v, 0) {
			return min(max(v, 0.01), 100)
		}
	}
	if g, ok := labels[LabelGPU]; ok {
		if v, ok := GPURelativeSpeed(g); ok {
			return v
		}
	}
	return 0
}

// RelativeSpeed returns the endpoint's prefill speed relative to an A100
// from its labels (LabelRelativeSpeed, else LabelGPU) and whether a label
// gave it; without one it returns 1, false. Speeds are clamped to
// [0.01, 100]. NewEndpoint reads the labels once (they are read-only), so
// this is a field read, cheap enough for every pick.
func (ep *Endpoint) RelativeSpeed() (float64, bool) {
	if ep.speed == 0 {
		return 1, false
	}
	return ep.speed, true
}
