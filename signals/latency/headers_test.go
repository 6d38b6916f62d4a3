package latency

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

func TestParseSLOHeaders(t *testing.T) {
	tests := []struct {
		name    string
		ttft    string
		tpot    string
		want    signals.SLO
		wantErr bool
	}{
		{name: "none"},
		{name: "ttft only", ttft: "250", want: signals.SLO{TTFT: 250 * time.Millisecond}},
		{name: "both", ttft: " 1500.5 ", tpot: "40", want: signals.SLO{TTFT: 1500500 * time.Microsecond, TPOT: 40 * time.Millisecond}},
		{name: "tpot only", tpot: "0.5", want: signals.SLO{TPOT: 500 * time.Microsecond}},
		{name: "below a nanosecond", ttft: "1e-9", want: signals.SLO{TTFT: 1}},
		{name: "zero", ttft: "0", wantErr: true},
		{name: "negative", ttft: "-5", wantErr: true},
		{name: "NaN", ttft: "NaN", wantErr: true},
		{name: "Inf", tpot: "+Inf", wantErr: true},
		{name: "text", ttft: "fast", wantErr: true},
		{name: "huge", ttft: "1e300", wantErr: true},
		{name: "over a day", tpot: "86400001", wantErr: true},
		{name: "bad tpot keeps ttft", ttft: "100", tpot: "x", want: signals.SLO{TTFT: 100 * time.Millisecond}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.ttft != "" {
				h.Set(HeaderSLOTTFT, tt.ttft)
			}
			if tt.tpot != "" {
				h.Set(HeaderSLOTPOT, tt.tpot)
			}
			got, err := ParseSLOHeaders(h)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrBadSLOHeader)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("nil header", func(t *testing.T) {
		got, err := ParseSLOHeaders(nil)
		require.NoError(t, err)
		assert.Equal(t, signals.SLO{}, got)
	})
}

func TestRelativeSpeed(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{"none", nil, 1, false},
		{"h100", map[string]string{LabelGPU: "H100-80GB"}, 2.2, true},
		{"h200", map[string]string{LabelGPU: "h200"}, 2.2, true},
		{"a100", map[string]string{LabelGPU: "A100-SXM4-40GB"}, 1, true},
		{"l40s", map[string]string{LabelGPU: "L40S"}, 1.16, true},
		{"l4", map[string]string{LabelGPU: "l4"}, 0.39, true},
		{"a10g", map[string]string{LabelGPU: "a10g"}, 0.40, true},
		{"unknown gpu", map[string]string{LabelGPU: "tpu-v5"}, 1, false},
		{"explicit wins", map[string]string{LabelGPU: "h100", LabelRelativeSpeed: "3"}, 3, true},
		{"explicit clamped", map[string]string{LabelRelativeSpeed: "1e9"}, 100, true},
		{"explicit tiny", map[string]string{LabelRelativeSpeed: "1e-9"}, 0.01, true},
		{"bad explicit falls back", map[string]string{LabelGPU: "l4", LabelRelativeSpeed: "-2"}, 0.39, true},
		{"NaN", map[string]string{LabelRelativeSpeed: "NaN"}, 1, false},
		{"Inf", map[string]string{LabelRelativeSpeed: "Inf"}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "x", Labels: tt.labels})
			got, ok := RelativeSpeed(ep)
			assert.Equal(t, tt.ok, ok)
			assert.InDelta(t, tt.want, got, 1e-12)
		})
	}
	got, ok := RelativeSpeed(nil)
	assert.False(t, ok)
	assert.Equal(t, 1.0, got)
}

// TestGPURelativeSpeedFamilies: a class name followed by more digits is
// another card, not that class (an L40 is not an L4).
func TestGPURelativeSpeedFamilies(t *testing.T) {
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"l4", 0.39, true},
		{"L4-24GB", 0.39, true},
		{"l40", 0.58, true},
		{"L40-48GB", 0.58, true},
		{"l40s", 1.16, true},
		{"L40S-48GB", 1.16, true},
		{" A100-SXM4-80GB ", 1, true},
		{"a100_80gb", 1, true},
		{"h100sxm", 2.2, true},
		{"a10", 0.40, true},
		{"a1000", 0, false},
		{"h1000", 0, false},
		{"l400", 0, false},
		{"l", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := GPURelativeSpeed(tt.name)
		assert.Equal(t, tt.ok, ok, "%q known", tt.name)
		assert.InDelta(t, tt.want, got, 1e-12, "%q speed", tt.name)
	}
}
