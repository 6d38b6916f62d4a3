package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
)

// tracesDir is ../shared/traces seen from this package's directory.
const tracesDir = "../../../shared/traces"

func TestSelectScenarios(t *testing.T) {
	tests := []struct {
		name      string
		o         Options
		wantNames []string
		wantPods  []int
		wantProf  string
		wantErr   string
	}{
		{name: "all", o: Options{}, wantNames: []string{"uniform", "hetero", "bursty", "prefix", "azure"}, wantPods: []int{8, 8, 8, 8, 8}},
		{name: "some", o: Options{Scenarios: []string{"hetero", "uniform"}}, wantNames: []string{"hetero", "uniform"}, wantPods: []int{8, 8}},
		{name: "resize", o: Options{Scenarios: []string{"hetero"}, Pods: 3}, wantNames: []string{"hetero"}, wantPods: []int{3}},
		{name: "profiles", o: Options{Scenarios: []string{"uniform"}, Profiles: []string{L4}, Pods: 2}, wantNames: []string{"uniform"}, wantPods: []int{2}, wantProf: L4},
		{name: "trace file", o: Options{TraceFile: "x/my.csv"}, wantNames: []string{"trace:my.csv"}, wantPods: []int{8}},
		{name: "unknown scenario", o: Options{Scenarios: []string{"nope"}}, wantErr: `unknown scenario "nope"`},
		{name: "unknown profile", o: Options{Profiles: []string{"nope"}}, wantErr: `unknown profile "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scs, err := selectScenarios(tt.o)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, scs, len(tt.wantNames))
			for i, sc := range scs {
				assert.Equal(t, tt.wantNames[i], sc.Name)
				assert.Len(t, sc.Pods, tt.wantPods[i])
				if tt.wantProf != "" {
					for _, p := range sc.Pods {
						assert.Equal(t, tt.wantProf, p.Engine.Profile.Name)
					}
				}
			}
		})
	}
}

func TestRunSuiteSmall(t *testing.T) {
	var calls []int
	rep, err := RunSuite(context.Background(), Options{
		Scenarios: []string{"uniform", "prefix"},
		Policies:  []string{policy.RoundRobin, policy.LeastRequest},
		Loads:     []float64{0.5},
		Requests:  120,
		TracesDir: "testdata/no-such-dir",
		Parallel:  2,
		Progress:  func(done, total int, _ string) { calls = append(calls, done) },
	})
	require.NoError(t, err)
	require.Len(t, rep.Scenarios, 1, "prefix has no trace here")
	require.Len(t, rep.Skipped, 1)
	assert.Contains(t, rep.Skipped[0], "prefix:")
	assert.Contains(t, rep.Skipped[0], "trace file not found")
	assert.Equal(t, []int{1, 2}, calls)

	s := rep.Scenarios[0]
	assert.Equal(t, "uniform", s.Name)
	assert.Equal(t, 0.5, s.Load)
	assert.InDelta(t, s.Capacity/2, s.Rate, 1e-9)
	assert.Equal(t, 120, s.Requests)
	assert.Equal(t, DefaultSLO, s.SLO)
	assert.Positive(t, s.Workload.PromptMean)
	assert.Positive(t, s.Workload.OutputMean)
	assert.InDelta(t, 1, s.Workload.InterArrivalCV, 0.25, "Poisson arrivals")
	assert.Zero(t, s.Workload.SharedPrefix, "uniform shares no prefixes")
	require.Len(t, s.Policies, 2)
	assert.Equal(t, policy.RoundRobin, s.Policies[0].Policy)
	assert.Equal(t, policy.LeastRequest, s.Policies[1].Policy)
	assert.Equal(t, 120, s.Policies[0].Completed)
	assert.Nil(t, s.Reduction, "no inferroute in this run")

	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	out := buf.String()
	assert.Contains(t, out, "== uniform at 50% load")
	assert.Contains(t, out, "8×h100-llama3-8b")
	assert.Contains(t, out, "inter-arrival CV")
	assert.Contains(t, out, "least-request")
	assert.Contains(t, out, "skipped prefix:")

	// The JSON carries the fields the issue names.
	js, err := json.Marshal(rep)
	require.NoError(t, err)
	var doc struct {
		Scenarios []struct {
			Name     string  `json:"name"`
			Load     float64 `json:"load"`
			Policies []map[string]any
		} `json:"scenarios"`
	}
	require.NoError(t, json.Unmarshal(js, &doc))
	require.Len(t, doc.Scenarios, 1)
	assert.Equal(t, "uniform", doc.Scenarios[0].Name)
	assert.Equal(t, 0.5, doc.Scenarios[0].Load)
	for _, key := range []string{"name", "ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "goodput"} {
		assert.Contains(t, doc.Scenarios[0].Policies[0], key)
	}
}

func TestRunSuiteErrors(t *testing.T) {
	_, err := RunSuite(context.Background(), Options{Policies: []string{"nope"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown policy "nope"`)
}

func TestReduction(t *testing.T) {
	r := &ScenarioResult{Policies: []Metrics{
		{Policy: policy.RoundRobin, TTFTMean: 2, TTFTP99: 10},
		{Policy: policy.Inferroute, TTFTMean: 0.5, TTFTP99: 12},
	}}
	red := reduction(r)
	require.NotNil(t, red)
	assert.InDelta(t, 75, red.TTFTMean, 1e-9)
	assert.InDelta(t, -20, red.TTFTP99, 1e-9)
}
