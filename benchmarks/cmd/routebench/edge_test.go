package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunRejectsNonFiniteRates: -loads and -rate take finite numbers; an
// infinite or NaN value is a flag error naming the flag, not a panic in
// the workload's rate scaling.
func TestRunRejectsNonFiniteRates(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"infinite load", []string{"-loads", "inf"}, `-loads: bad load "inf"`},
		{"infinite load with -tune", []string{"-tune", "-loads", "+Inf"}, `-loads: bad load "+Inf"`},
		{"NaN rate", []string{"-capacity", "-rate", "NaN"}, "-rate"},
		{"infinite rate", []string{"-capacity", "-rate", "inf"}, "-rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.args, "-scenario", "uniform", "-policies", "round-robin",
				"-requests", "20", "-pods", "1", "-max-pods", "1", "-progress=false")
			var stdout, stderr bytes.Buffer
			var err error
			require.NotPanics(t, func() { err = run(context.Background(), args, &stdout, &stderr) })
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestCheckViolationNeverPrintsTheLimit: a ratio just above its limit is a
// violation, and its message must not print the ratio equal to the limit
// (fmtRatio's promise): 2.00002 s against 2 s is 1.00001×, not 1×.
func TestCheckViolationNeverPrintsTheLimit(t *testing.T) {
	spec, err := parseCheckSpec([]byte("rules: [{figure: ttft_p99, versus: round-robin, max_ratio: 1}]"))
	require.NoError(t, err)
	fails, err := spec.Evaluate(report("uniform", 0.7, map[string][2]float64{
		"round-robin": {1, 2}, "inferroute": {1, 2.00002},
	}))
	require.NoError(t, err)
	require.Len(t, fails, 1)
	assert.Contains(t, fails[0], "is 1.00001× round-robin's")
	assert.Contains(t, fails[0], "(limit 1×)")
}
