package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/sim"
)

// report builds a one-scenario report with the given p99 and mean TTFTs
// (seconds) per policy.
func report(name string, load float64, figs map[string][2]float64) *sim.Report {
	sc := sim.ScenarioResult{Name: name, Load: load}
	for _, p := range []string{"round-robin", "inferroute", "llm-d", "dynamo-kv", "oracle"} {
		f, ok := figs[p]
		if !ok {
			continue
		}
		sc.Policies = append(sc.Policies, sim.Metrics{Policy: p, TTFTMean: f[0], TTFTP99: f[1], Requests: 10, Completed: 10})
	}
	return &sim.Report{Scenarios: []sim.ScenarioResult{sc}}
}

func TestParseCheckSpec(t *testing.T) {
	tests := []struct {
		name, text, wantErr string
	}{
		{"ok", "rules: [{figure: ttft_p99, versus: round-robin, max_ratio: 1}]", ""},
		{"json", `{"rules": [{"figure": "ttft_mean", "versus": "oracle", "max_ratio": 1.25}]}`, ""},
		{"no rules", "rules: []", "no rules"},
		{"bad figure", "rules: [{figure: nope, versus: oracle, max_ratio: 1}]", `unknown figure "nope"`},
		{"no versus", "rules: [{figure: ttft_p99, max_ratio: 1}]", "versus is required"},
		{"zero ratio", "rules: [{figure: ttft_p99, versus: oracle}]", "max_ratio 0 must be a positive number"},
		{"unknown field", "rules: [{figure: ttft_p99, versus: oracle, max_ratio: 1, typo: 1}]", "typo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := parseCheckSpec([]byte(tt.text))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "inferroute", s.Rules[0].Policy, "policy defaults to inferroute")
		})
	}
}

func TestBuiltinChecksParse(t *testing.T) {
	for name := range builtinChecks {
		t.Run(name, func(t *testing.T) {
			s, err := loadCheckSpec(name)
			require.NoError(t, err)
			assert.NotEmpty(t, s.Rules)
		})
	}
	_, err := loadCheckSpec("no-such-file.yaml")
	require.ErrorContains(t, err, "neither a built-in set (ci, targets) nor a readable file")
}

func TestCheckEvaluate(t *testing.T) {
	tests := []struct {
		name     string
		rules    string
		figs     map[string][2]float64
		wantFail []string
		wantErr  string
	}{
		{
			name:  "passes within ratio",
			rules: "rules: [{figure: ttft_p99, versus: round-robin, max_ratio: 1.05}]",
			figs:  map[string][2]float64{"round-robin": {1, 2}, "inferroute": {1, 2.1}},
		},
		{
			name:     "fails above ratio, naming scenario, policy and figure",
			rules:    "rules: [{figure: ttft_p99, versus: round-robin, max_ratio: 1.05}]",
			figs:     map[string][2]float64{"round-robin": {1, 2}, "inferroute": {1, 2.2}},
			wantFail: []string{"uniform at 70% load: inferroute ttft_p99 2200 ms is 1.1× round-robin's 2000 ms (limit 1.05×)"},
		},
		{
			name:     "best peer is the lowest peer",
			rules:    "rules: [{figure: ttft_mean, versus: best-peer, max_ratio: 1}]",
			figs:     map[string][2]float64{"inferroute": {0.3, 1}, "llm-d": {0.5, 1}, "dynamo-kv": {0.25, 1}},
			wantFail: []string{"uniform at 70% load: inferroute ttft_mean 300 ms is 1.2× best peer dynamo-kv's 250 ms (limit 1×)"},
		},
		{
			name:  "scenario filter skips others",
			rules: "rules: [{figure: ttft_p99, versus: oracle, max_ratio: 1, scenarios: [uniform], loads: [0.7]}]",
			figs:  map[string][2]float64{"inferroute": {1, 1}, "oracle": {1, 1}},
		},
		{
			name:    "no matching scenario is an error",
			rules:   "rules: [{figure: ttft_p99, versus: oracle, max_ratio: 1, scenarios: [hetero]}]",
			figs:    map[string][2]float64{"inferroute": {1, 1}, "oracle": {1, 1}},
			wantErr: "matches no scenario",
		},
		{
			name:    "missing reference policy is an error",
			rules:   "rules: [{figure: ttft_p99, versus: oracle, max_ratio: 1}]",
			figs:    map[string][2]float64{"inferroute": {1, 1}},
			wantErr: "policy oracle did not run",
		},
		{
			name:    "no peer is an error",
			rules:   "rules: [{figure: ttft_p99, versus: best-peer, max_ratio: 1}]",
			figs:    map[string][2]float64{"inferroute": {1, 1}},
			wantErr: "best-peer needs at least one peer",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := parseCheckSpec([]byte(tt.rules))
			require.NoError(t, err)
			fails, err := spec.Evaluate(report("uniform", 0.7, tt.figs))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantFail, fails)
		})
	}
}

func TestFmtRatio(t *testing.T) {
	assert.Equal(t, "1.2545", fmtRatio(1.25449999))
	assert.Equal(t, "1.1", fmtRatio(1.1))
	assert.Equal(t, "0.03", fmtRatio(0.03))
}

func TestPoliciesNeeded(t *testing.T) {
	spec, err := loadCheckSpec("targets")
	require.NoError(t, err)
	assert.Equal(t, []string{"inferroute", "round-robin", "llm-d", "sglang-cache-aware", "dynamo-kv",
		"aibrix-prefix", "sglang-least-load", "oracle"}, spec.policiesNeeded())
}

// TestRunCheckExitsNonZero runs a tiny suite with a check that round-robin
// cannot meet (p99 at most half its own), through the command.
func TestRunCheckExitsNonZero(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "check.yaml")
	require.NoError(t, os.WriteFile(path, []byte("rules: [{policy: least-request, figure: ttft_p99, versus: least-request, max_ratio: 0.5}]"), 0o644))
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-scenario", "uniform", "-policies", "least-request", "-loads", "0.5", "-requests", "60", "-pods", "2",
		"-progress=false", "-check", path,
	}, &stdout, &stderr)
	require.ErrorIs(t, err, errCheckFailed)
	assert.Contains(t, err.Error(), "uniform at 50% load: least-request ttft_p99")
	assert.Contains(t, err.Error(), "is 1× least-request's")

	stdout.Reset()
	stderr.Reset()
	require.NoError(t, os.WriteFile(path, []byte("rules: [{policy: least-request, figure: ttft_p99, versus: least-request, max_ratio: 1}]"), 0o644))
	require.NoError(t, run(context.Background(), []string{
		"-scenario", "uniform", "-policies", "least-request", "-loads", "0.5", "-requests", "60", "-pods", "2",
		"-progress=false", "-check", path,
	}, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "check passed: 1 rules")
}
