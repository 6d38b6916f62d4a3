package plot

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestBinnedSkipsNonFiniteX: a point without a finite x belongs to no bin;
// the others are binned as usual (and the call returns).
func TestBinnedSkipsNonFiniteX(t *testing.T) {
	xs := []float64{math.NaN(), 0.2, 0.7, math.Inf(1), math.Inf(-1)}
	ys := []float64{100, 1, 3, 100, 100}
	s := Binned("b", xs, ys, 0.5, Mean)
	assert.Equal(t, []float64{0.25, 0.75}, s.X)
	assert.Equal(t, []float64{1, 3}, s.Y)
}

// TestBinnedSparseBins: two points 10^15 bins apart make two points of the
// series, without visiting the empty bins between them.
func TestBinnedSparseBins(t *testing.T) {
	s := Binned("b", []float64{0.1, 1e15}, []float64{1, 2}, 1, Mean)
	assert.Equal(t, []float64{0.5, 1e15 + 0.5}, s.X)
	assert.Equal(t, []float64{1, 2}, s.Y)
}

// TestTicksTinySpanAtLargeMagnitude: on an axis two float64 steps wide at
// 10^22, a tick step below half a unit in the last place cannot advance;
// ticks must still return a handful of ticks inside the axis.
func TestTicksTinySpanAtLargeMagnitude(t *testing.T) {
	lo := 1e22
	hi := math.Nextafter(math.Nextafter(lo, math.Inf(1)), math.Inf(1))
	a := &axis{lo: lo, hi: hi}
	got := ticks(a)
	require.NotEmpty(t, got)
	assert.LessOrEqual(t, len(got), 11)
	for _, v := range got {
		assert.True(t, v >= lo && v <= hi, "tick %v outside [%v, %v]", v, lo, hi)
	}
}
