package latency

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// batchWLS solves the weighted ridge problem of model from scratch:
// minimise Σ_k c_k (y_k − θ·x_k)² + Σ_j r_j (θ_j − prior_j)², with c_k the
// total weight of sample k, by forming the normal equations in full and
// eliminating with partial pivoting. It shares no code with model.
func batchWLS(d int, xs [][maxDim]float64, ys, c []float64, reg, prior *[maxDim]float64) [maxDim]float64 {
	var a [maxDim][maxDim + 1]float64
	for i := 0; i < d; i++ {
		a[i][i] = reg[i]
		a[i][d] = reg[i] * prior[i]
	}
	for k := range xs {
		for i := 0; i < d; i++ {
			for j := 0; j < d; j++ {
				a[i][j] += c[k] * xs[k][i] * xs[k][j]
			}
			a[i][d] += c[k] * xs[k][i] * ys[k]
		}
	}
	for col := 0; col < d; col++ {
		p := col
		for r := col + 1; r < d; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		a[col], a[p] = a[p], a[col]
		for r := 0; r < d; r++ {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for j := col; j <= d; j++ {
				a[r][j] -= f * a[col][j]
			}
		}
	}
	var theta [maxDim]float64
	for i := 0; i < d; i++ {
		theta[i] = a[i][d] / a[i][i]
	}
	return theta
}

// TestModelMatchesBatchSolve checks the recursive model against a batch
// solve of the weighted least-squares problem its doc comment states, on
// random data with multiplicative noise, for several forgetting factors.
// The relative weights are recomputed independently from their definition:
// at sample k the scale s_k = max(min(ŷ_k, y_k), y_k/4, floor) with ŷ_k the
// prediction of the batch solution over samples 1..k−1 and y_k the
// observation, clipped to [ŷ_k/clipRatio, ŷ_k·clipRatio] once the
// effective number of samples before it reaches clipAfter (10 here, so the
// outlier at sample 40 is clipped; before 10, none is); the raw log weight
// −2 ln s_k; divided by the exponentially forgotten geometric mean of the
// raw weights up to k. Sample k's weight in the objective after n samples
// is then λ^(n−k) w_k.
func TestModelMatchesBatchSolve(t *testing.T) {
	for _, lambda := range []float64{1, 0.97, 0.8, 0.5} {
		rng := rand.New(rand.NewPCG(11, uint64(lambda*1000)))
		truth := [maxDim]float64{0.05, 0.25, 0.125, 0.002, 0.4, 0.3}
		var reg, prior [maxDim]float64
		for i := range reg {
			reg[i] = 0.1 * ttftScale[i] * ttftScale[i]
			prior[i] = 0.5 * truth[i]
		}
		const floor, clipAfter = 1e-3, 10
		var m model
		m.reset(ttftDim, lambda, floor, clipAfter, &reg, &prior)

		var xs [][maxDim]float64
		var ys, lws, ws []float64
		for n := 1; n <= 120; n++ {
			x := [maxDim]float64{1, rng.Float64() * 4, rng.Float64() * 10, float64(rng.IntN(30)), rng.Float64(), float64(rng.IntN(2))}
			y := dot(&truth, &x, ttftDim) * math.Exp(0.2*rng.NormFloat64())
			if n == 40 { // an outlier
				y *= 20
			}

			// The oracle's weight for this sample.
			c := make([]float64, len(ws))
			for k := range ws {
				c[k] = math.Pow(lambda, float64(len(ws)-1-k)) * ws[k]
			}
			prev := batchWLS(ttftDim, xs, ys, c, &reg, &prior)
			yhat := dot(&prev, &x, ttftDim)
			var nPrev float64
			for k := range ws {
				nPrev += math.Pow(lambda, float64(len(ws)-1-k))
			}
			yc := y // what the objective sees
			if nPrev >= clipAfter && yhat > 0 {
				yc = math.Min(math.Max(y, yhat/clipRatio), yhat*clipRatio)
			}
			s := math.Max(math.Max(math.Min(yhat, yc), yc/4), floor)
			lws = append(lws, -2*math.Log(s))
			var num, den float64
			for k := range lws {
				f := math.Pow(lambda, float64(len(lws)-1-k))
				num += f * lws[k]
				den += f
			}
			ws = append(ws, math.Exp(lws[len(lws)-1]-num/den))
			xs, ys = append(xs, x), append(ys, yc)

			c = make([]float64, len(ws))
			var nEff float64
			for k := range ws {
				f := math.Pow(lambda, float64(len(ws)-1-k))
				c[k] = f * ws[k]
				nEff += f
			}
			want := batchWLS(ttftDim, xs, ys, c, &reg, &prior)

			m.update(&x, y)
			for i := 0; i < ttftDim; i++ {
				require.InDelta(t, want[i], m.theta[i], 1e-9*(1+math.Abs(want[i])),
					"λ=%v after %d samples: coefficient %d", lambda, n, i)
			}
			require.InDelta(t, nEff, m.n, 1e-9*nEff, "λ=%v after %d samples: effective samples", lambda, n)
		}
	}
}

// TestPoolTPOTPriorIsMeanOfContributions: the pool's TPOT prior is, over
// its first 50 contributions, their running mean (updatePool's contract).
// An endpoint that first serves buffered responses (which teach TTFT, not
// TPOT) and then streamed ones makes TTFT contributions long before its
// first TPOT one; the TPOT contributions must still be averaged among
// themselves, not weighted by the TTFT contributions' count, or a new
// endpoint's TPOT prior stays near the built-in 20 ms for hundreds of
// requests.
func TestPoolTPOTPriorIsMeanOfContributions(t *testing.T) {
	clk := newFakeClock()
	p := New(Config{Clock: clk})
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	for i := 0; i < 100; i++ {
		serveOnce(p, a, clk, 1000, signals.Outcome{TTFT: 300 * time.Millisecond, Latency: 2 * time.Second,
			CompletionTokens: 40, Buffered: true})
	}
	// Streamed responses at 60 ms per token; average a's published TPOT
	// coefficients over the completions that contribute to the pool (the
	// endpoint has half of FullConfidenceSamples, 10, TPOT samples).
	var sum [maxDim]float64
	contributions := 0
	for i := 0; i < 20; i++ {
		serveOnce(p, a, clk, 1000, signals.Outcome{TTFT: 300 * time.Millisecond,
			Latency: 300*time.Millisecond + 39*60*time.Millisecond, CompletionTokens: 40})
		e := p.Explain(a)
		if e.TPOTSamples >= 5 {
			sum[gConst] += e.TPOTBase
			sum[gBatch] += e.TPOTPerSequence
			sum[gKV] += e.TPOTAtFullKVCache
			contributions++
		}
	}
	require.Positive(t, contributions)
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "b"})
	e := p.Explain(b)
	got := [...]float64{e.TPOTBase, e.TPOTPerSequence, e.TPOTAtFullKVCache}
	for i, g := range got {
		want := sum[i] / float64(contributions)
		assert.InDelta(t, want, g, 1e-9+1e-6*math.Abs(want), "pool TPOT coefficient %d", i)
	}
	tpot, _ := p.PredictTPOT(&signals.Request{}, b)
	assert.InEpsilon(t, 0.060, tpot, 0.1, "a new endpoint's TPOT prior after the pool learned 60 ms")
}
