package sim

import (
	"math"
	"math/rand/v2"

	"github.com/inferroute/inferroute/benchmarks/workload"
)

// LogNormalLengths is a workload.LengthSampler drawing prompt and output
// lengths independently from log-normal distributions given by their median
// and 90th percentile, clipped to [1, Max…]. It lets the generated
// scenarios run without the trace files.
type LogNormalLengths struct {
	// PromptP50 and PromptP90 are the median and 90th percentile of the
	// prompt length in tokens.
	PromptP50, PromptP90 float64
	// OutputP50 and OutputP90 are the median and 90th percentile of the
	// output length in tokens.
	OutputP50, OutputP90 float64
	// MaxPrompt and MaxOutput cap the lengths; 0 means no cap.
	MaxPrompt, MaxOutput int
}

var _ workload.LengthSampler = LogNormalLengths{}

// ShareGPTLengths is fitted to the ShareGPT (8K-filtered, Llama-2
// tokenizer) length statistics of ../shared/traces/PROVENANCE.md: prompt
// p50 1,730 and p90 5,696 tokens, output p50 415 and p90 834 tokens; the
// prompt is capped at 7,434 (its p99) and the output at 998 (its p99),
// each on its own, so a draw can total up to 8,432 tokens where the
// filtered file's totals stay within 8K. The file's joint distribution is
// replaced by independent log-normals so that the default suite needs no
// data file.
var ShareGPTLengths = LogNormalLengths{
	PromptP50: 1730, PromptP90: 5696,
	OutputP50: 415, OutputP90: 834,
	MaxPrompt: 7434, MaxOutput: 998,
}

// z90 is the standard normal's 90th percentile.
const z90 = 1.2815515655446004

// Sample implements workload.LengthSampler.
func (l LogNormalLengths) Sample(r *rand.Rand) (prompt, output int) {
	return logNormal(r, l.PromptP50, l.PromptP90, l.MaxPrompt), logNormal(r, l.OutputP50, l.OutputP90, l.MaxOutput)
}

func logNormal(r *rand.Rand, p50, p90 float64, maxV int) int {
	if p50 <= 0 {
		return 1
	}
	sigma := 0.0
	if p90 > p50 {
		sigma = math.Log(p90/p50) / z90
	}
	v := int(math.Round(p50 * math.Exp(sigma*r.NormFloat64())))
	if maxV > 0 {
		v = min(v, maxV)
	}
	return max(v, 1)
}
