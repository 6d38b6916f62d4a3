package tune

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
)

func scenario(t *testing.T, name string) sim.Scenario {
	t.Helper()
	for _, s := range sim.DefaultScenarios() {
		if s.Name == name {
			s.Pods = s.Pods[:3]
			return s
		}
	}
	t.Fatalf("no scenario %s", name)
	return sim.Scenario{}
}

// testBase is a fixed base configuration, independent of the library's
// current defaults.
func testBase() picker.Config {
	return picker.Config{Scorers: []picker.Plugin{
		{Name: scorer.ScorerQueue, Weight: 2},
		{Name: scorer.ScorerPrefix, Weight: 3},
		{Name: scorer.ScorerLatency, Weight: 3},
	}}
}

func TestStateRoundTrip(t *testing.T) {
	base := testBase()
	s, err := initialState(base)
	require.NoError(t, err)
	require.Len(t, s.weights, len(base.Scorers))
	assert.Equal(t, scorer.DefaultPrefixParams(), s.prefix)
	assert.Equal(t, picker.DefaultHalfLife, s.halfLife)

	s.weights[0] = 7
	s.prefix.YieldAbsolute = 16
	s.halfLife = 500 * time.Millisecond
	cfg, err := s.config(base)
	require.NoError(t, err)
	assert.Equal(t, 2.0, base.Scorers[0].Weight, "base not modified")

	// The YAML round-trips through picker.ParseConfig to the same state,
	// and the picker accepts it.
	data, err := cfg.Marshal()
	require.NoError(t, err)
	back, err := picker.ParseConfig(data)
	require.NoError(t, err)
	_, err = picker.New(back)
	require.NoError(t, err)
	s2, err := initialState(back)
	require.NoError(t, err)
	assert.Equal(t, 7.0, s2.weights[0])
	assert.Equal(t, 16.0, s2.prefix.YieldAbsolute)
	assert.Equal(t, 500*time.Millisecond, s2.halfLife)
}

func TestSearchSpace(t *testing.T) {
	ps := searchSpace(testBase())
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
		assert.NotEmpty(t, p.values)
	}
	assert.Equal(t, []string{
		"weight of queue", "weight of prefix", "weight of latency",
		"prefix minMatch", "prefix yieldAbsolute", "prefix yieldRelative", "stalenessHalfLife (ms)",
	}, names)
	noPrefix := searchSpace(picker.Config{Scorers: []picker.Plugin{{Name: scorer.ScorerQueue, Weight: 1}}})
	require.Len(t, noPrefix, 2, "no prefix parameters without the prefix scorer")
}

func TestScore(t *testing.T) {
	sp := []split{{rrTrain: sim.Metrics{TTFTMean: 1, TTFTP99: 4}, rrTest: sim.Metrics{TTFTMean: 2, TTFTP99: 2}}}
	// Half the mean and half the p99 of round-robin: ½ln½ + ½ln½ = ln½.
	got := score(sp, []sim.Metrics{{TTFTMean: 0.5, TTFTP99: 2, Requests: 10}}, false)
	assert.InDelta(t, -0.693147, got, 1e-6)
	// Against the held-out yardstick, equal figures score 0; a tenth of the
	// requests failed adds 5 × 0.1.
	got = score(sp, []sim.Metrics{{TTFTMean: 2, TTFTP99: 2, Requests: 10, Failed: 1}}, true)
	assert.InDelta(t, 0.5, got, 1e-9)
	// A p99 10% worse than round-robin's costs ½ln1.1 + 4·ln1.1.
	got = score(sp, []sim.Metrics{{TTFTMean: 2, TTFTP99: 2.2, Requests: 10}}, true)
	assert.InDelta(t, 4.5*math.Log(1.1), got, 1e-9)
}

func TestTuneNoScenarios(t *testing.T) {
	_, err := Tune(context.Background(), Options{})
	require.ErrorIs(t, err, ErrNoScenarios)
}

func TestTuneSmall(t *testing.T) {
	res, err := Tune(context.Background(), Options{
		Scenarios: []sim.Scenario{scenario(t, "hetero")},
		Loads:     []float64{0.8},
		Requests:  150,
		Budget:    4,
		Seed:      3,
	})
	require.NoError(t, err)
	assert.Equal(t, 4, res.Evaluations)
	assert.LessOrEqual(t, res.TrainAfter, res.TrainBefore, "the search never accepts a worse configuration")
	require.Len(t, res.Runs, 1)
	r := res.Runs[0]
	assert.Equal(t, "hetero", r.Scenario)
	assert.Equal(t, 150, r.Before.Completed+r.Before.Failed, "the held-out half holds the second 150 requests")
	for _, s := range res.Trail {
		assert.Less(t, s.Score, res.TrainBefore)
	}
	var b bytes.Buffer
	require.NoError(t, res.WriteTable(&b))
	assert.Contains(t, b.String(), "held-out traffic")
	assert.Contains(t, b.String(), "hetero")
	_, err = picker.New(res.Config)
	require.NoError(t, err)
}

func TestPruneZeroWeights(t *testing.T) {
	c := testBase()
	c.Scorers[1].Weight = 0
	p := pruneZeroWeights(c)
	require.Len(t, p.Scorers, 2)
	for _, s := range p.Scorers {
		assert.NotEqual(t, scorer.ScorerPrefix, s.Name)
	}
	assert.Len(t, c.Scorers, 3, "input not modified")
}
