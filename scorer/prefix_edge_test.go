package scorer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// TestPrefixScorerTinyBestMatch: PrefixScorer implements Normalized, which
// promises scores in [0, 1] and never NaN for any cached fractions in
// [0, 1], with any valid parameters. With MinMatch 0 (valid: every match
// is a hit) and a best match so small that PartialCredit / best overflows
// (a subnormal fraction), the partial credit of a candidate holding
// nothing was Inf × 0 = NaN and that of one holding a little Inf.
func TestPrefixScorerTinyBestMatch(t *testing.T) {
	p := scorer.DefaultPrefixParams()
	p.MinMatch, p.Tolerance = 0, 0
	s, err := scorer.NewPrefixScorer(p, scorer.Env{})
	require.NoError(t, err)
	for _, cached := range [][]float64{{5e-324, 0}, {1e-310, 5e-324}, {1e-300, 0}} {
		t.Run(fmt.Sprint(cached), func(t *testing.T) {
			in := edgeInput(&signals.Request{PromptBlocks: []uint64{1}}, ep("a", 0, 0, 0), ep("b", 0, 0, 0))
			copy(in.Cached, cached)
			out := make([]float64, 2)
			s.Score(context.Background(), in, out)
			for i, v := range out {
				assert.True(t, v >= 0 && v <= 1, "score %d = %v", i, v)
			}
			assert.GreaterOrEqual(t, out[0], out[1], "the candidate holding more of the prompt scores at least as well")
		})
	}
}
