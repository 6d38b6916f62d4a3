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
	if worst > 4e-6 {
		t.Fatalf("worst relative error %g > 4e-6", worst)
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

// TestDecayBurstMatchesExp2 checks the table-driven decay against
// math.Exp2 for every whole-millisecond age up to the point where it is
// zero, and across the wrap of the millisecond clock.
func TestDecayBurstMatchesExp2(t *testing.T) {
	const count = 3.0
	for _, start := range []uint32{0, 1 << 31, math.MaxUint32 - 500} {
		packed := uint64(math.Float32bits(count))<<32 | uint64(start)
		for age := int64(-5); age < 102300; age++ {
			got := decayBurst(packed, start+uint32(age))
			want := count
			if age > 0 {
				want = count * math.Exp2(-float64(age)/float64(burstHalfLifeMs))
			}
			if age >= 1022*int64(burstHalfLifeMs) {
				want = 0
			}
			// The reference rounds age/100 before exponentiating, an error of
			// up to ~1e-14 at the largest ages; the table does not.
			if math.Abs(got-want) > 1e-13*want {
				t.Fatalf("start %d age %d ms: got %v, want %v", start, age, got, want)
			}
		}
	}
}
