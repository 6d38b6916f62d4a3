package scorer

import "math"

// Normalisation steps. Each rewrites vals in place into scores in [0, 1]
// (1 best) and never allocates. NaN and infinite entries are treated as
// unknown and get the neutral score 0.5, so a missing value neither wins nor
// loses a pick; a scorer that means "worst" must say so with a finite value.

// Neutral is the score given to a candidate whose raw value is unknown.
const Neutral = 0.5

// MinMax maps the smallest known value to 0 and the largest to 1 (higher raw
// values are better). When all known values are equal every known entry
// scores 1: no candidate is worse than another. This is the Kubernetes
// scheduler's DefaultNormalizeScore, made range-aware.
//
// Every score is finite and in [0, 1] whatever the known values, also when
// their spread hi − lo overflows (values near ±math.MaxFloat64) or is so
// small that its reciprocal does (subnormal differences).
func MinMax(vals []float64) {
	lo, hi, ok := bounds(vals)
	f, scale := spread(lo, hi)
	for i, v := range vals {
		switch {
		case unknown(v) || !ok:
			vals[i] = Neutral
		case hi == lo:
			vals[i] = 1
		default:
			vals[i] = min((v*f-lo*f)*scale, 1)
		}
	}
}

// InverseMinMax maps the smallest known value to 1 and the largest to 0
// (lower raw values are better, as for queue lengths and latencies).
// All-equal known values score 1. Scores are finite and in [0, 1] for
// any known values, as for MinMax.
func InverseMinMax(vals []float64) {
	lo, hi, ok := bounds(vals)
	f, scale := spread(lo, hi)
	for i, v := range vals {
		switch {
		case unknown(v) || !ok:
			vals[i] = Neutral
		case hi == lo:
			vals[i] = 1
		default:
			vals[i] = min((hi*f-v*f)*scale, 1)
		}
	}
}

// spread returns a power of two f and scale = 1 / (hi·f − lo·f), finite and
// positive for finite lo < hi, so that (v·f − lo·f) × scale maps [lo, hi]
// onto [0, 1] with a multiplication per value instead of a division. f is
// 1 unless hi − lo overflows (f = 2^-8) or is below 1/math.MaxFloat64, so
// that its reciprocal overflows (f = 2^1000). Scaling by a power of two is
// exact but for subnormal values, whose error is then negligible next to
// the spread. For lo == hi the scale is +Inf and must not be used.
func spread(lo, hi float64) (f, scale float64) {
	d := hi - lo
	scale = 1 / d
	switch {
	case d > math.MaxFloat64:
		f = 0x1p-8
	case d > 0 && scale > math.MaxFloat64:
		// hi − lo is subnormal, so |lo| and |hi| are below 2^-970: scaled
		// by 2^1000 they are exact and far from overflowing.
		f = 0x1p1000
	default:
		return 1, scale
	}
	return f, 1 / (hi*f - lo*f)
}

// FixedRange maps lo to 0 and hi to 1 linearly, clamping outside values
// (higher raw values are better). It does not depend on the other
// candidates, so a score means the same thing in every pick. If hi <= lo
// every known value scores 1.
func FixedRange(vals []float64, lo, hi float64) {
	for i, v := range vals {
		switch {
		case unknown(v):
			vals[i] = Neutral
		case hi <= lo:
			vals[i] = 1
		default:
			vals[i] = Clamp01((v - lo) / (hi - lo))
		}
	}
}

// Invert turns scores in [0, 1] where higher is better into scores where
// lower is better, and back: v becomes 1 − v. NaN becomes Neutral.
func Invert(vals []float64) {
	for i, v := range vals {
		if unknown(v) {
			vals[i] = Neutral
			continue
		}
		vals[i] = 1 - Clamp01(v)
	}
}

// RelativeToBest scores lower-is-better values by their ratio to the best
// (smallest) known value: best/v, so a candidate twice as slow scores 0.5
// whatever the spread of the others. Unlike InverseMinMax it does not blow a
// tiny difference up to the whole [0, 1] range. Values below floor, which
// must be positive, count as floor: differences under it do not matter.
// Unknown values (NaN, ±Inf) score Neutral, and so does every value when
// none is known.
func RelativeToBest(vals []float64, floor float64) {
	lo, _, ok := bounds(vals)
	lo = max(lo, floor)
	for i, v := range vals {
		if unknown(v) || !ok {
			vals[i] = Neutral
			continue
		}
		vals[i] = lo / max(v, floor)
	}
}

// Clamp01 clamps v into [0, 1]; NaN becomes 0.
func Clamp01(v float64) float64 {
	switch {
	case v > 1:
		return 1
	case v >= 0:
		return v
	}
	return 0 // negative or NaN
}

// bounds returns the smallest and largest non-NaN values, and whether any
// value is known.
func bounds(vals []float64) (lo, hi float64, ok bool) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if unknown(v) {
			continue
		}
		ok = true
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi, ok
}

func unknown(v float64) bool { return v-v != 0 } // NaN - NaN and ±Inf - ±Inf are NaN
