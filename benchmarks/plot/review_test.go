package plot

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestQuantileFractionalRank: the nearest-rank q-quantile of 1..n is
// ⌈q × n⌉, computed here in integers (q in thousandths).
func TestQuantileFractionalRank(t *testing.T) {
	for _, tt := range []struct{ milli, n int }{{35, 200}, {35, 400}, {17, 3000}, {999, 1000}} {
		v := make([]float64, tt.n)
		for i := range v {
			v[i] = float64(i + 1)
		}
		want := float64((tt.milli*tt.n + 999) / 1000)
		q := float64(tt.milli) / 1000
		assert.Equal(t, want, Quantile(q)(v), "q %v of %d", q, tt.n)
	}
}
