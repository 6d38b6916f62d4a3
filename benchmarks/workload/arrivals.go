package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrivals is an arrival process: Next returns the gap between one arrival
// and the next, drawing randomness only from r. Implementations may keep
// state (the position in an on/off cycle); such implementations also
// implement Resetter, and Generate resets them before use so that the same
// GenConfig always yields the same workload. An Arrivals value is used by
// one goroutine at a time.
type Arrivals interface {
	// Next returns the time from the previous arrival (or from the start
	// of the run, for the first) to the next arrival. Never negative.
	Next(r *rand.Rand) time.Duration
}

// Resetter is implemented by stateful arrival processes: Reset returns the
// process to its initial state.
type Resetter interface {
	Reset()
}

// validator is implemented by arrival processes that can check their
// parameters; Generate calls it.
type validator interface {
	validate() error
}

// seconds converts a gap in seconds to a Duration, rounding to the
// nanosecond and saturating instead of overflowing.
func seconds(s float64) time.Duration {
	ns := s * float64(time.Second)
	if !(ns < math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(math.Round(ns))
}

// Poisson arrivals: exponential gaps with mean 1/Rate, inter-arrival CV 1.
type Poisson struct {
	// Rate is the mean arrival rate in requests per second; must be > 0.
	Rate float64
}

// Next implements Arrivals.
func (p Poisson) Next(r *rand.Rand) time.Duration {
	return seconds(r.ExpFloat64() / p.Rate)
}

func (p Poisson) validate() error {
	if !(p.Rate > 0) || math.IsInf(p.Rate, 0) {
		return fmt.Errorf("Poisson rate %v must be positive and finite", p.Rate)
	}
	return nil
}

// Constant arrivals: evenly spaced, one every 1/Rate seconds (CV 0). It
// draws nothing from r.
type Constant struct {
	// Rate is the arrival rate in requests per second; must be > 0.
	Rate float64
}

// Next implements Arrivals.
func (c Constant) Next(*rand.Rand) time.Duration { return seconds(1 / c.Rate) }

func (c Constant) validate() error {
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		return fmt.Errorf("Constant rate %v must be positive and finite", c.Rate)
	}
	return nil
}

// Gamma arrivals: gamma-distributed gaps with mean 1/Rate and coefficient
// of variation CV (shape 1/CV², scale CV²/Rate). CV 1 is Poisson; CV > 1
// is bursty (many short gaps, a few very long ones), the renewal model of
// bursty LLM traffic used by BurstGPT (Wang et al., 2024) and by
// AlpaServe's Gamma process (Li et al., OSDI 2023).
type Gamma struct {
	// Rate is the mean arrival rate in requests per second; must be > 0.
	Rate float64
	// CV is the coefficient of variation of the gaps; must be > 0.
	CV float64
}

// Next implements Arrivals.
func (g Gamma) Next(r *rand.Rand) time.Duration {
	k := 1 / (g.CV * g.CV)
	return seconds(gammaSample(r, k) / (k * g.Rate))
}

func (g Gamma) validate() error {
	if !(g.Rate > 0) || math.IsInf(g.Rate, 0) {
		return fmt.Errorf("Gamma rate %v must be positive and finite", g.Rate)
	}
	if !(g.CV > 0) || math.IsInf(g.CV, 0) {
		return fmt.Errorf("Gamma CV %v must be positive and finite", g.CV)
	}
	return nil
}

// gammaSample draws from Gamma(shape k, scale 1) by Marsaglia and Tsang,
// "A simple method for generating gamma variables", ACM TOMS 26(3), 2000:
// for k >= 1, d = k - 1/3, c = 1/sqrt(9d), repeat x ~ N(0,1), v = (1+cx)³
// until v > 0 and ln U < x²/2 + d - d v + d ln v, return d v. For k < 1 the
// same paper's boost: Gamma(k) = Gamma(k+1) · U^(1/k), computed in log
// space so that tiny shapes (CV 13 gives k ≈ 0.006) do not lose the mean.
func gammaSample(r *rand.Rand, k float64) float64 {
	if k < 1 {
		u := 1 - r.Float64() // (0, 1]
		return gammaSample(r, k+1) * math.Exp(math.Log(u)/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := 1 - r.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

// OnOff arrivals: a Poisson process whose rate alternates between
// BurstRate for On and BaseRate for Off, periodically, starting with an On
// period. Within each period arrivals are Poisson; the gap across period
// boundaries is drawn exactly by integrating the piecewise-constant rate
// (the time-change construction of a non-homogeneous Poisson process). The
// mean rate is (BurstRate·On + BaseRate·Off)/(On+Off).
//
// OnOff keeps its position in the cycle, so use it through a pointer and
// from one goroutine; Generate calls Reset before use.
type OnOff struct {
	// BaseRate is the rate during Off periods (requests per second, >= 0).
	BaseRate float64
	// BurstRate is the rate during On periods (requests per second, >= 0).
	BurstRate float64
	// On and Off are the period lengths; both must be > 0, and On+Off
	// must fit in a Duration.
	On, Off time.Duration

	pos float64 // seconds since the start of the current cycle, in [0, On+Off]
}

var (
	_ Arrivals = (*OnOff)(nil)
	_ Resetter = (*OnOff)(nil)
)

// Reset implements Resetter: the next arrival is drawn from the start of
// an On period.
func (o *OnOff) Reset() { o.pos = 0 }

// Next implements Arrivals. The position is kept within one cycle, so
// that rounding cannot stall it however long the run, and whole cycles
// without an arrival are skipped at once, so that a gap of many cycles
// costs no more than one.
func (o *OnOff) Next(r *rand.Rand) time.Duration {
	on, period := o.On.Seconds(), (o.On + o.Off).Seconds()
	cycle := o.BurstRate*on + o.BaseRate*(period-on) // work one full cycle absorbs
	e := r.ExpFloat64()                              // unit-rate exponential "work" to spend
	gap := 0.0
	for {
		if o.pos == 0 && cycle > 0 && e >= cycle {
			k := math.Floor(e / cycle)
			e = max(e-k*cycle, 0)
			gap += k * period
		}
		rate, end := o.BurstRate, on
		if o.pos >= on {
			rate, end = o.BaseRate, period
		}
		left := end - o.pos
		if rate > 0 && e < rate*left {
			d := e / rate
			gap += d
			o.pos = min(o.pos+d, end)
			return seconds(gap)
		}
		// The rest of this phase passes without an arrival.
		e -= rate * left
		gap += left
		if end == period {
			o.pos = 0
		} else {
			o.pos = on
		}
	}
}

func (o *OnOff) validate() error {
	switch {
	case o.On <= 0 || o.Off <= 0:
		return fmt.Errorf("OnOff periods on=%v off=%v must be positive", o.On, o.Off)
	case o.On > math.MaxInt64-o.Off:
		return fmt.Errorf("OnOff periods on=%v off=%v: the cycle On+Off overflows a Duration", o.On, o.Off)
	case !(o.BaseRate >= 0) || !(o.BurstRate >= 0) || math.IsInf(o.BaseRate, 0) || math.IsInf(o.BurstRate, 0):
		return fmt.Errorf("OnOff rates base=%v burst=%v must be finite and non-negative", o.BaseRate, o.BurstRate)
	case o.BaseRate == 0 && o.BurstRate == 0:
		return fmt.Errorf("OnOff needs a positive base or burst rate")
	}
	return nil
}
