package signals_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferroute/inferroute/signals"
)

// TestRelativeSpeed: the speed NewEndpoint reads from the labels, the
// explicit label first, out-of-range values clamped, bad ones ignored.
func TestRelativeSpeed(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{"none", nil, 1, false},
		{"h100", map[string]string{signals.LabelGPU: "H100-80GB"}, 2.2, true},
		{"h200", map[string]string{signals.LabelGPU: "h200"}, 2.2, true},
		{"a100", map[string]string{signals.LabelGPU: "A100-SXM4-40GB"}, 1, true},
		{"l40s", map[string]string{signals.LabelGPU: "L40S"}, 1.16, true},
		{"l4", map[string]string{signals.LabelGPU: "l4"}, 0.39, true},
		{"a10g", map[string]string{signals.LabelGPU: "a10g"}, 0.40, true},
		{"unknown gpu", map[string]string{signals.LabelGPU: "tpu-v5"}, 1, false},
		{"explicit wins", map[string]string{signals.LabelGPU: "h100", signals.LabelRelativeSpeed: "3"}, 3, true},
		{"explicit clamped", map[string]string{signals.LabelRelativeSpeed: "1e9"}, 100, true},
		{"explicit tiny", map[string]string{signals.LabelRelativeSpeed: "1e-9"}, 0.01, true},
		{"bad explicit falls back", map[string]string{signals.LabelGPU: "l4", signals.LabelRelativeSpeed: "-2"}, 0.39, true},
		{"NaN", map[string]string{signals.LabelRelativeSpeed: "NaN"}, 1, false},
		{"Inf", map[string]string{signals.LabelRelativeSpeed: "Inf"}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "x", Labels: tt.labels})
			got, ok := ep.RelativeSpeed()
			assert.Equal(t, tt.ok, ok)
			assert.InDelta(t, tt.want, got, 1e-12)
		})
	}
}

// TestGPURelativeSpeed pins the documented GPU classes and the suffix
// rules: a class name followed by more digits is another card, not that
// class (an L40 is not an L4); the vendor words of Kubernetes node labels
// are skipped, and a MIG slice runs at its share of the card's sevenths.
func TestGPURelativeSpeed(t *testing.T) {
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"H100", 2.2, true}, {"h100-sxm5-80gb", 2.2, true}, {"h100sxm", 2.2, true}, {"H200-141GB", 2.2, true},
		{"A100", 1, true}, {"a100-pcie-40gb", 1, true}, {" A100-SXM4-80GB ", 1, true}, {"a100_80gb", 1, true}, {"a100 80gb", 1, true},
		{"L40S", 1.16, true}, {"L40S-48GB", 1.16, true}, {"L40", 0.58, true}, {"L40-48GB", 0.58, true},
		{"A10", 0.40, true}, {"A10G", 0.40, true}, {"a10-24gb", 0.40, true},
		{"L4", 0.39, true}, {"L4-24GB", 0.39, true}, {"l4_24gb", 0.39, true}, {"l4-llama3-8b", 0.39, true},
		{"a1000", 0, false}, {"h1000", 0, false}, {"l400", 0, false}, {"h20", 0, false},
		{"a1", 0, false}, {"h1", 0, false}, {"l", 0, false}, {"", 0, false},
		// Kubernetes node labels: GPU Feature Discovery's and GKE's names.
		{"NVIDIA-H100-80GB-HBM3", 2.2, true}, {"NVIDIA-A100-SXM4-40GB", 1, true}, {"NVIDIA-L4", 0.39, true},
		{"NVIDIA-A10G", 0.40, true}, {"NVIDIA-L40S", 1.16, true}, {"nvidia-h100-80gb", 2.2, true},
		{"nvidia-tesla-a100", 1, true}, {"nvidia-a100-80gb", 1, true}, {"nvidia-l4", 0.39, true},
		{"NVIDIA H200", 2.2, true}, {"Tesla-T4", 0, false}, {"nvidia-tesla-t4", 0, false},
		{"NVIDIA-GeForce-RTX-4090", 0, false}, {"nvidia", 0, false}, {"nvidia-", 0, false}, {"nvidiah100", 0, false},
		// MIG slices under Feature Discovery's single strategy: k sevenths.
		{"A100-SXM4-40GB-MIG-1g.5gb", 1.0 / 7, true}, {"NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 3.0 / 7, true},
		{"NVIDIA-H100-80GB-HBM3-MIG-7g.80gb", 2.2, true}, {"H100-MIG-2g.20gb", 2.2 * 2 / 7, true},
		{"A100-MIG-8g.40gb", 0, false}, {"A100-MIG-0g.5gb", 0, false}, {"A100-MIG-xg", 0, false}, {"A100-MIG-", 0, false},
		{"L4-MIG-1g.6gb", 0, false},
	}
	for _, tt := range tests {
		got, ok := signals.GPURelativeSpeed(tt.name)
		assert.Equal(t, tt.ok, ok, "%q known", tt.name)
		assert.InDelta(t, tt.want, got, 1e-12, "%q speed", tt.name)
	}
}
