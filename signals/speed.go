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
// Names may also start with the vendor words "NVIDIA" and "Tesla" and a
// separator, as Kubernetes node labels spell them: NVIDIA GPU Feature
// Discovery's nvidia.com/gpu.product ("NVIDIA-H100-80GB-HBM3",
// "NVIDIA-A100-SXM4-40GB"; https://github.com/NVIDIA/k8s-device-plugin,
// docs/gpu-feature-discovery) and GKE's cloud.google.com/gke-accelerator
// ("nvidia-l4", "nvidia-tesla-a100";
// https://cloud.google.com/kubernetes-engine/docs/how-to/gpus). A MIG
// slice of an A100, H100 or H200 as Feature Discovery names it under its
// single strategy ("A100-SXM4-40GB-MIG-3g.20gb") has k of the card's
// seven compute slices, so k/7 of its speed (the NVIDIA Multi-Instance
// GPU User Guide: a "<k>g" profile gets k of the seven compute slices of
// an A100 or H100); a MIG name whose slice count cannot be read, or on
// another card, is unknown.
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
	n = cutVendor(cutVendor(n, "nvidia"), "tesla")
	for _, g := range gpuSpeeds {
		rest, ok := strings.CutPrefix(n, g.class)
		if !ok || (rest != "" && rest[0] >= '0' && rest[0] <= '9') {
			continue
		}
		_, mig, isMIG := strings.Cut(rest, "-mig-")
		if !isMIG {
			return g.speed, true
		}
		k, ok := migSlices(mig)
		if !ok || !g.mig {
			return 0, false
		}
		return g.speed * float64(k) / 7, true
	}
	return 0, false
}

// cutVendor removes the vendor word and one separator ('-', '_' or ' ')
// from the start of name, if name starts with both.
func cutVendor(name, vendor string) string {
	rest, ok := strings.CutPrefix(name, vendor)
	if ok && rest != "" && (rest[0] == '-' || rest[0] == '_' || rest[0] == ' ') {
		return rest[1:]
	}
	return name
}

// migSlices reads the compute slices k of a MIG profile "<k>g.<memory>"
// (as in "3g.20gb"); k must be 1 to 7.
func migSlices(profile string) (int, bool) {
	digits, _, ok := strings.Cut(profile, "g")
	if !ok {
		return 0, false
	}
	k, err := strconv.Atoi(digits)
	if err != nil || k < 1 || k > 7 {
		return 0, false
	}
	return k, true
}

// gpuSpeeds lists the GPU classes GPURelativeSpeed knows, a class before
// any other that is a prefix of it ("l40s" before "l40").
var gpuSpeeds = [...]struct {
	class string
	speed float64
	mig   bool // the card can be split into MIG slices of sevenths
}{
	{"h100", 2.2, true}, {"h200", 2.2, true}, {"a100", 1, true}, {"l40s", 1.16, false}, {"l40", 0.58, false},
	{"a10", 0.40, false}, {"l4", 0.39, false},
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
