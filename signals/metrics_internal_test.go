package signals

import (
	"math"
	"testing"
)

func TestExp2NegMatchesMathExp2(t *testing.T) {
	worst := 0.0
	for x := 0.0; x < 60; x += 0.0007 {
		got, want := exp2Neg(x), math.Exp2(-x)
		worst = max(worst, math.Abs(got/want-1))
	}
	if worst > 1e-4 {
		t.Fatalf("worst relative error %g > 1e-4", worst)
	}
	for _, x := range []float64{1022, 5000, math.Inf(1), math.NaN()} {
		if got := exp2Neg(x); got != 0 {
			t.Errorf("exp2Neg(%v) = %v, want 0", x, got)
		}
	}
	if exp2Neg(0) != 1 {
		t.Errorf("exp2Neg(0) = %v", exp2Neg(0))
	}
}

func BenchmarkConfidence(b *testing.B) {
	var sink float64
	for i := 0; i < b.N; i++ {
		sink += exp2Neg(float64(i&1023) / 97)
	}
	_ = sink
}
