package endpointflag_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/examples/internal/endpointflag"
	"github.com/inferroute/inferroute/signals"
)

// TestParseGPUs: -gpus gives every endpoint one GPU, or named
// endpoints theirs, and the picker reads the speed from it; the rest stay
// unlabelled.
func TestParseGPUs(t *testing.T) {
	speed := func(ep *signals.Endpoint) float64 {
		s, ok := ep.RelativeSpeed()
		if !ok {
			return 0
		}
		return s
	}
	eps, err := endpointflag.Parse("a=10.0.0.1:8000, b=10.0.0.2:8000,c=10.0.0.3:8000", "a=h100, b=NVIDIA-L4", "sglang", "m")
	require.NoError(t, err)
	require.Len(t, eps, 3)
	assert.Equal(t, []string{"a", "b", "c"}, []string{eps[0].Name, eps[1].Name, eps[2].Name})
	assert.Equal(t, []float64{2.2, 0.39, 0}, []float64{speed(eps[0]), speed(eps[1]), speed(eps[2])})
	assert.Equal(t, "h100", eps[0].Labels[signals.LabelGPU])
	assert.Empty(t, eps[2].Labels)
	assert.Equal(t, "sglang", eps[0].Engine)
	assert.Equal(t, "m", eps[0].Model)

	eps, err = endpointflag.Parse("10.0.0.1:8000,[::1]:8000", "a100", "vllm", "m")
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 1}, []float64{speed(eps[0]), speed(eps[1])})

	eps, err = endpointflag.Parse("10.0.0.1:8000", "", "vllm", "m")
	require.NoError(t, err)
	assert.Equal(t, 0.0, speed(eps[0]))
}

func TestParseErrors(t *testing.T) {
	for _, tt := range []struct {
		list, gpus, model, want string
	}{
		{"", "", "m", "no endpoints"},
		{" , ", "", "m", "no endpoints"},
		{"10.0.0.1", "", "m", `endpoint "10.0.0.1"`},
		{"a=10.0.0.1:8000", "b100", "m", `"b100" is not a GPU`},
		{"a=10.0.0.1:8000", "a=b100", "m", `"b100" is not a GPU`},
		{"a=10.0.0.1:8000", "z=h100", "m", `"z=h100" names no endpoint`},
		{"10.0.0.1:8000", "=h100", "m", `"=h100" names no endpoint`},
		{"a=10.0.0.1:8000", "a=h100,h100", "m", `"h100" names no endpoint`},
		{"a=10.0.0.1:8000", "h100,a100", "m", `"h100" names no endpoint`}, // one GPU for all takes one name
	} {
		_, err := endpointflag.Parse(tt.list, tt.gpus, "vllm", tt.model)
		assert.ErrorContains(t, err, tt.want, "%+v", tt)
	}
}
