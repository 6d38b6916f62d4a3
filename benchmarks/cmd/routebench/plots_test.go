package main

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/sim"
)

func TestWritePlots(t *testing.T) {
	m := func(name string, p99 float64) sim.Metrics {
		return sim.Metrics{Policy: name, TTFTP99: p99, TTFTs: []float64{0.1, 0.2, p99}, Arrivals: []float64{0.1, 0.7, 1.4}}
	}
	rep := &sim.Report{Scenarios: []sim.ScenarioResult{
		{Name: "uniform", Load: 0.5, Policies: []sim.Metrics{m("round-robin", 1), m("inferroute", 0.5)}},
		{Name: "bursty", Load: 0.7, Policies: []sim.Metrics{
			m("round-robin", 3), m("random", 4), m("llm-d", 2), m("dynamo-kv", 1.5), m("inferroute", 1), m("oracle", 0.5)}},
	}}
	dir := filepath.Join(t.TempDir(), "plots")
	files, err := writePlots(dir, rep)
	require.NoError(t, err)
	assert.Equal(t, []string{
		filepath.Join(dir, "cdf-uniform-50.png"),
		filepath.Join(dir, "cdf-bursty-70.png"),
		filepath.Join(dir, "overtime-bursty-70.png"),
	}, files)
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		img, err := png.Decode(fh)
		fh.Close()
		require.NoError(t, err, f)
		assert.Equal(t, 1000, img.Bounds().Dx())
	}
}

func TestOverTimePolicies(t *testing.T) {
	sc := &sim.ScenarioResult{Policies: []sim.Metrics{
		{Policy: "round-robin", TTFTP99: 3}, {Policy: "random", TTFTP99: 4}, {Policy: "llm-d", TTFTP99: 2},
		{Policy: "dynamo-kv", TTFTP99: 1.5}, {Policy: "inferroute", TTFTP99: 1}, {Policy: "oracle", TTFTP99: 0.5},
	}}
	assert.Equal(t, []string{"round-robin", "dynamo-kv", "inferroute", "oracle"}, overTimePolicies(sc))
	only := &sim.ScenarioResult{Policies: []sim.Metrics{{Policy: "random"}}}
	assert.Equal(t, []string{"random"}, overTimePolicies(only))
}

func TestSafeName(t *testing.T) {
	assert.Equal(t, "trace_my_file.jsonl", safeName("trace:my file.jsonl"))
}
