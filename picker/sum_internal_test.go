package picker

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestWeightedSumIsARunningSum checks weightedSum bit for bit against the
// plain running sum in scorer order, for pool sizes on both sides of its
// four-wide blocks: a reordered sum can differ in the last bit, and a tie
// broken differently would change a pick.
func TestWeightedSumIsARunningSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n <= 13; n++ {
		for k := 0; k <= 7; k++ {
			scores := make([]float64, n*k)
			for i := range scores {
				scores[i] = rng.Float64()
			}
			weights := make([]float64, k)
			for s := range weights {
				weights[s] = rng.Float64() * 12
			}
			got := make([]float64, n)
			for i := range got {
				got[i] = math.NaN() // every total must be written
			}
			weightedSum(got, scores, weights)
			for i := range n {
				want := 0.0
				for s, w := range weights {
					want += w * scores[s*n+i]
				}
				if math.Float64bits(got[i]) != math.Float64bits(want) {
					t.Fatalf("n=%d k=%d: total[%d] = %v, want %v", n, k, i, got[i], want)
				}
			}
		}
	}
}
