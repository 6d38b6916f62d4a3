package latency

import "math"

// tiny is the magnitude below which the model's statistics, its
// coefficients and the predictor's running means are set to zero.
//
// Exponential forgetting multiplies a statistic that no longer receives
// data by λ at every update, so the statistics of a feature that stays
// zero (a queue that stays empty, prompts that are all cached) decay into
// the subnormal range, below 2^-1022, within about 23,000 updates at
// λ = 0.97, and round-to-nearest then keeps them there: 0.97 × 16·2^-1074
// rounds back to 16·2^-1074. Intel processors, among others, handle
// subnormal operands and results with a microcode assist of the order of
// a hundred cycles instead of a few (Intel 64 and IA-32 Architectures
// Optimization Reference Manual, on floating-point assists for denormals
// and the flush-to-zero and denormals-are-zero modes that avoid them,
// which Go leaves off). A model in that state updated six to eight times
// slower (BenchmarkModelUpdateStale), and so did every prediction read
// from it.
//
// 2^-500 is hundreds of orders of magnitude below any statistic or
// coefficient that affects a prediction, and the product of two values
// above it is still normal, so the flush changes no prediction.
const tiny = 0x1p-500

// flush returns v, or 0 when |v| < tiny.
func flush(v float64) float64 {
	if math.Abs(v) < tiny {
		return 0
	}
	return v
}

// maxDim is the largest feature vector a model holds. Fixed-size arrays keep
// the model free of allocation and of pointer chasing.
const maxDim = 6

// model is exponentially weighted, regularised least squares: after samples
// (x_k, y_k), k = 1..n, its coefficients θ minimise
//
//	Σ_k λ^(n−k) (y_k − θ·x_k)² + Σ_j r_j (θ_j − prior_j)²
//
// The forgetting factor λ gives the data a memory of about 1/(1−λ) samples
// (Ljung and Söderström, "Theory and Practice of Recursive Identification",
// MIT Press 1983, ch. 2; Haykin, "Adaptive Filter Theory", 4th ed. 2002,
// ch. 9). The ridge term is not forgotten: it pulls directions the recent
// data do not excite back to the prior instead of letting the covariance
// blow up, the "wind-up" of plain exponentially forgetting RLS (Gunnarsson,
// "Combining tracking and regularization in recursive least squares
// identification", IEEE CDC 1996).
//
// Instead of the textbook O(d²) covariance recursion, which stores the
// inverse of a matrix that the ridge term would have to re-enter at every
// step, the model keeps the sufficient statistics A = Σ λ^(n−k) x xᵀ and
// b = Σ λ^(n−k) x y and re-solves (A + R) θ = b + R·prior by Cholesky after
// each update: O(d³/6) ≈ 40 multiply-adds for d = 6, always on a symmetric
// positive-definite matrix, so it cannot lose definiteness the way the
// covariance recursion can in floating point.
//
// A model is not safe for concurrent use; its owner serialises access.
type model struct {
	dim    int
	lambda float64
	a      [maxDim * maxDim]float64 // lower triangle of Σ λ^(n−k) x xᵀ, row-major
	b      [maxDim]float64
	reg    [maxDim]float64 // diagonal of R
	prior  [maxDim]float64
	theta  [maxDim]float64
	n      float64 // Σ λ^(n−k): the effective number of samples
	floor  float64 // smallest scale of a target, for the relative weights
	wMean  float64 // mean of the log raw weights, weighted like the samples
	// clipAfter is the effective number of samples from which an
	// observation is clipped to within clipRatio of the prediction (see
	// update); +Inf never clips.
	clipAfter float64
}

// clipRatio bounds how far from its prediction an observation counts once
// the model has clipAfter effective samples: y is moved into
// [ŷ/clipRatio, ŷ·clipRatio] before the update. It is a Huber-type bound
// on the residual (Huber, "Robust Statistics", Wiley 1981, ch. 7,
// regression): least squares gives a
// single observation unbounded influence, and the relative weights below
// make a fast one count the most. Without it, one 8 000-token request
// answered in 50 ms (a prefix-cache hit its server did not report in the
// usage, or one placed there by another router) moved a model that had
// learned 4 000 tokens/s from 100 observations to publish 58 000 to
// 2 600 000 tokens/s over the next hundred; with it, at most 13 600
// (TestPredictorPublishedThroughputOutlier). 4 keeps the
// tracking of real changes: a step to a quarter of the speed still counts
// in full, and a larger one is followed in a few steps; 2 made a speed-up
// of 4× take longer than TestSpeedUpIsTracked allows, and clipping from
// the first observation (against the prior, which can be ten times off)
// slowed every cold start: in routebench's uniform fleet 26 of 300 quick
// runs then missed the gate's 5%, against 1 with the clip at
// FullConfidenceSamples.
const clipRatio = 4

// reset starts the model over at the given prior. floor is the smallest
// target scale used for the relative weights; clipAfter the effective
// number of samples from which observations are clipped (see update;
// math.Inf(1): never).
func (m *model) reset(dim int, lambda, floor, clipAfter float64, reg, prior *[maxDim]float64) {
	*m = model{dim: dim, lambda: lambda, floor: floor, clipAfter: clipAfter, reg: *reg, prior: *prior, theta: *prior}
}

// update folds in one observation and re-solves for θ. x and y must be
// finite; callers sanitise them. Once the model has clipAfter effective
// samples, y is first clipped to within clipRatio of the prediction ŷ.
//
// Latency noise is multiplicative (a 10% jitter on a 4 s TTFT is 0.4 s, on
// a 40 ms one 4 ms), so the fit minimises relative rather than absolute
// squared error: each observation is weighted by 1/s², the usual weighting
// for a constant coefficient of variation (Carroll and Ruppert,
// "Transformation and Weighting in Regression", Chapman & Hall 1988,
// ch. 2–3). Without it the big requests set the intercept and small ones
// are mispredicted by multiples (on the package's synthetic fleet: 35%
// median error on short prompts unweighted, 10% weighted). The scale s is
// the smaller of the current prediction ŷ and the observation y, bounded
// below by y/4 and floor: the smaller one so that an observation far from
// the model (a slowdown, a speed-up) is not down-weighted, which would
// slow tracking; the bounds so that no single observation dominates. The
// weights are divided by their running geometric mean, in which the past
// weights are forgotten as the samples are (with λ = 1, the geometric mean
// of all of them), so that the ridge strengths keep their meaning of
// "prior samples".
func (m *model) update(x *[maxDim]float64, y float64) {
	d, l := m.dim, m.lambda
	var xs [maxDim]float64 // x without subnormal dust (see tiny)
	for i := 0; i < d; i++ {
		xs[i] = flush(x[i])
	}
	yhat := dot(&m.theta, &xs, d)
	if m.n >= m.clipAfter && yhat > 0 {
		y = min(max(y, yhat/clipRatio), yhat*clipRatio)
	}
	s := max(min(yhat, y), y/4, m.floor)
	lw := -2 * math.Log(s)
	// The mean of the log weights with the statistics' own forgetting:
	// Σ λ^(n−k) lw_k / Σ λ^(n−k), over m.n = Σ λ^(n−k) before this sample.
	// It is the plain mean while the samples are fewer than the memory
	// 1/(1−λ) and then tends to the rate-(1−λ) average; a fixed rate from
	// the first sample on would stay at that sample's weight for about
	// 1/(1−λ) samples, for ever with λ = 1, and let it dominate them all.
	m.wMean += (lw - m.wMean) / (l*m.n + 1)
	w := math.Exp(lw - m.wMean)
	for i := 0; i < d; i++ {
		m.b[i] = flush(l*m.b[i] + w*xs[i]*y)
		row := m.a[i*maxDim:]
		for j := 0; j <= i; j++ {
			row[j] = flush(l*row[j] + w*xs[i]*xs[j])
		}
	}
	m.n = l*m.n + 1
	m.solve()
}

// solve sets θ to the solution of (A + R) θ = b + R·prior. If the system is
// not numerically positive definite (it always is while every r_j > 0) or the
// solution is not finite, θ keeps its previous value.
func (m *model) solve() {
	d := m.dim
	var c [maxDim * maxDim]float64 // Cholesky factor L, lower triangle
	var inv [maxDim]float64        // 1 / L[i][i]
	for i := 0; i < d; i++ {
		ci := c[i*maxDim : i*maxDim+maxDim]
		ai := m.a[i*maxDim : i*maxDim+maxDim]
		for j := 0; j <= i; j++ {
			cj := c[j*maxDim : j*maxDim+maxDim]
			s := ai[j]
			for k := 0; k < j; k++ {
				s -= ci[k] * cj[k]
			}
			if i == j {
				s += m.reg[i]
				if !(s > 0) || math.IsInf(s, 0) {
					return
				}
				r := math.Sqrt(s)
				ci[i] = r
				inv[i] = 1 / r
			} else {
				ci[j] = s * inv[j]
			}
		}
	}
	// Forward: L z = b + R·prior.
	var z [maxDim]float64
	for i := 0; i < d; i++ {
		s := m.b[i] + m.reg[i]*m.prior[i]
		for k := 0; k < i; k++ {
			s -= c[i*maxDim+k] * z[k]
		}
		z[i] = s * inv[i]
	}
	// Backward: Lᵀ θ = z.
	var t [maxDim]float64
	for i := d - 1; i >= 0; i-- {
		s := z[i]
		for k := i + 1; k < d; k++ {
			s -= c[k*maxDim+i] * t[k]
		}
		t[i] = s * inv[i]
	}
	for i := 0; i < d; i++ {
		if math.IsNaN(t[i]) || math.IsInf(t[i], 0) {
			return
		}
		t[i] = flush(t[i])
	}
	m.theta = t
}

// dot returns θ·x over the first dim coordinates.
func dot(theta, x *[maxDim]float64, dim int) float64 {
	var s float64
	for i := 0; i < dim; i++ {
		s += theta[i] * x[i]
	}
	return s
}
