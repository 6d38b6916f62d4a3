package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
)

func TestResizeAndFleet(t *testing.T) {
	pods, err := sim.Fleet(0, sim.H100, sim.L4)
	require.NoError(t, err)
	r := resize(pods, 5)
	require.Len(t, r, 5)
	assert.Equal(t, "3×h100-llama3-8b + 2×l4-llama3-8b", fleetOf(r))
	for _, p := range r {
		assert.Empty(t, p.Name, "names are left to the simulator")
	}
}

func TestResizeKeepsTheMix(t *testing.T) {
	pods, err := sim.Fleet(0, sim.H100, sim.H100, sim.A100, sim.A100, sim.A100, sim.L4, sim.L4, sim.L4)
	require.NoError(t, err)
	tests := []struct {
		n    int
		want string
	}{
		// Shares 2/8, 3/8, 3/8. After 1 pod the owed shares are 0.25,
		// 0.375, 0.375: an A100 (first of the tie). After 2: 0.5, -0.25,
		// 0.75: an L4. After 3: 0.75, 0.125, 0.125: an H100.
		{1, "1×a100-llama3-8b"},
		{2, "1×a100-llama3-8b + 1×l4-llama3-8b"},
		{3, "1×a100-llama3-8b + 1×l4-llama3-8b + 1×h100-llama3-8b"},
		{8, "3×a100-llama3-8b + 3×l4-llama3-8b + 2×h100-llama3-8b"},
		{16, "6×a100-llama3-8b + 6×l4-llama3-8b + 4×h100-llama3-8b"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) { assert.Equal(t, tt.want, fleetOf(resize(pods, tt.n))) })
	}
}

func TestFindCapacity(t *testing.T) {
	var uniform sim.Scenario
	for _, s := range sim.DefaultScenarios() {
		if s.Name == "uniform" {
			uniform = s
		}
	}
	uniform.Pods = uniform.Pods[:1]
	// One H100 serves ShareGPT-like traffic at about 7.7 requests/s (the
	// uniform fleet's measured capacity, 61.6, over 8 pods). At 20
	// requests/s, 2.6 times that, one pod drowns.
	rows, err := findCapacity(context.Background(), capacityOptions{
		Scenarios: []sim.Scenario{uniform},
		Policies:  []string{policy.RoundRobin, policy.LeastRequest},
		Registry:  policy.Default(),
		Rate:      20, SLO: 2 * time.Second, MaxPods: 8, Requests: 300, Seed: 1,
	})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		assert.GreaterOrEqual(t, r.Pods, 2, r.Policy)
		assert.LessOrEqual(t, r.Pods, 8, r.Policy)
		assert.LessOrEqual(t, r.P99, 2.0, r.Policy)
		assert.Equal(t, 20.0, r.Rate)
	}
	// An objective no fleet can meet reports ">max".
	rows, err = findCapacity(context.Background(), capacityOptions{
		Scenarios: []sim.Scenario{uniform}, Policies: []string{policy.RoundRobin}, Registry: policy.Default(),
		Rate: 20, SLO: time.Microsecond, MaxPods: 2, Requests: 100, Seed: 1,
	})
	require.NoError(t, err)
	assert.Equal(t, 0, rows[0].Pods)
	var b bytes.Buffer
	require.NoError(t, writeCapacityTable(&b, rows))
	assert.Contains(t, b.String(), "== capacity of uniform")
	assert.Contains(t, b.String(), ">2")
}

func TestRunCapacityAndTuneFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-capacity", "-tune"}, &stdout, &stderr)
	require.ErrorContains(t, err, "-capacity and -tune are separate runs")

	stdout.Reset()
	err = run(context.Background(), []string{
		"-capacity", "-scenario", "uniform", "-policies", "round-robin", "-rate", "10", "-max-pods", "4",
		"-requests", "100", "-progress=false",
	}, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stdout.String(), "fewest pods with p99 TTFT ≤ 2s at 10.00 req/s (searched 1..4)")
}

func TestRunTuneWritesLoadableYAML(t *testing.T) {
	out := t.TempDir() + "/tuned.yaml"
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-tune", "-scenario", "uniform", "-loads", "0.7", "-requests", "80", "-tune-budget", "2",
		"-tune-out", out, "-progress=false",
	}, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stdout.String(), "tuning: 2 configurations evaluated")
	assert.Contains(t, stdout.String(), "best configuration written to "+out)
	// The written file runs the suite through -config.
	stdout.Reset()
	require.NoError(t, run(context.Background(), []string{
		"-scenario", "uniform", "-policies", "inferroute", "-loads", "0.5", "-requests", "40", "-pods", "2",
		"-config", out, "-progress=false",
	}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "inferroute")
}
