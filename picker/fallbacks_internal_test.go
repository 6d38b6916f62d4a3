package picker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferroute/inferroute/signals"
)

// TestRankFallbacksOrder checks both fallback rankings against a sort: the
// k best candidates other than the chosen one, by total (highest first),
// equal totals in candidate order. Totals come from a small set so that
// ties are common.
func TestRankFallbacksOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 2000; trial++ {
		n := 1 + rng.IntN(40)
		eps := make([]*signals.Endpoint, n)
		total := make([]float64, n)
		for i := range eps {
			eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprint(i)})
			total[i] = float64(rng.IntN(5)) / 4
		}
		best := rng.IntN(n)
		k := rng.IntN(12)

		idx := make([]int, 0, n)
		for i := range n {
			if i != best {
				idx = append(idx, i)
			}
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case total[a] > total[b]:
				return -1
			case total[a] < total[b]:
				return 1
			}
			return 0
		})
		want := []*signals.Endpoint{}
		for _, i := range idx[:min(k, len(idx))] {
			want = append(want, eps[i])
		}

		assert.Equal(t, want, rankFallbacks([]*signals.Endpoint{}, eps, total, best, k), "trial %d: n=%d k=%d", trial, n, k)
		assert.Equal(t, want, rankFallbacksSlow([]*signals.Endpoint{}, eps, total, best, min(k, n-1)), "slow, trial %d", trial)
	}
}
