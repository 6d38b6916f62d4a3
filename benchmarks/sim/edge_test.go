package sim

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
)

// TestPercentileFractionalRank checks the nearest-rank definition,
// rank = ⌈P/100 × N⌉, for percentiles that are not whole numbers: with
// the values 1..N the P-th percentile is the rank itself, computed here in
// integers (P in thousandths).
func TestPercentileFractionalRank(t *testing.T) {
	for _, tt := range []struct {
		milli int // P × 1000
		n     int
	}{
		{99900, 1000}, // p99.9 of 1000: rank 999, not the maximum
		{99900, 2000},
		{99500, 200},
		{280, 2500},
		{1100, 3000},
	} {
		sorted := make([]float64, tt.n)
		for i := range sorted {
			sorted[i] = float64(i + 1)
		}
		want := float64((tt.milli*tt.n + 99999) / 100000)
		p := float64(tt.milli) / 1000
		assert.Equal(t, want, Percentile(sorted, p), "p%v of %d", p, tt.n)
	}
}

// TestRunSuiteRejectsBadLoads: a load is a positive finite fraction of
// capacity; anything else is an error, not a panic deep in the suite.
func TestRunSuiteRejectsBadLoads(t *testing.T) {
	for _, l := range []float64{0, -0.5, math.Inf(1), math.NaN()} {
		var err error
		require.NotPanics(t, func() {
			_, err = RunSuite(context.Background(), Options{
				Scenarios: []string{"uniform"}, Policies: []string{policy.RoundRobin},
				Loads: []float64{l}, Requests: 20, Pods: 1,
			})
		}, "load %v", l)
		require.Error(t, err, "load %v", l)
		assert.Contains(t, err.Error(), "load", "load %v", l)
	}
}
