package tune

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/sim"
)

// TestTuneRejectsBadLoads: a load is a positive finite fraction of
// capacity; anything else is an error, not a panic in the rate scaling.
func TestTuneRejectsBadLoads(t *testing.T) {
	for _, l := range []float64{0, -1, math.Inf(1), math.NaN()} {
		var err error
		require.NotPanics(t, func() {
			_, err = Tune(context.Background(), Options{
				Scenarios: []sim.Scenario{scenario(t, "uniform")},
				Loads:     []float64{l}, Requests: 10, Budget: 1,
			})
		}, "load %v", l)
		require.Error(t, err, "load %v", l)
		assert.Contains(t, err.Error(), "load", "load %v", l)
	}
}
