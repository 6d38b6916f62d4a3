package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadTraceSniffsFormat(t *testing.T) {
	dir := t.TempDir()
	mooncake := `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 500, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]}
`
	azure := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:17:03.9799600,4808,10\n" +
		"2023-11-16 18:17:04.0319600,3180,8\n"
	tests := []struct {
		name, file, content string
		wantPrompt          []int
		wantSecondArrival   time.Duration
	}{
		{"mooncake by extension", "a.jsonl", mooncake, []int{1000, 600}, 500 * time.Millisecond},
		{"mooncake by content", "a.trace", mooncake, []int{1000, 600}, 500 * time.Millisecond},
		{"azure by extension", "b.csv", azure, []int{4808, 3180}, 52 * time.Millisecond},
		{"azure by content", "b.log", azure, []int{4808, 3180}, 52 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			w, err := LoadTrace(path)
			require.NoError(t, err)
			require.Len(t, w.Requests, 2)
			assert.Equal(t, tt.wantPrompt[0], w.Requests[0].PromptTokens)
			assert.Equal(t, tt.wantPrompt[1], w.Requests[1].PromptTokens)
			assert.Equal(t, tt.wantSecondArrival, w.Requests[1].Arrival-w.Requests[0].Arrival)
		})
	}
	_, err := LoadTrace(filepath.Join(dir, "missing.trace"))
	require.Error(t, err)
}

func TestMaxTokens(t *testing.T) {
	tests := []struct{ n, want int }{
		{1, 256}, {256, 256}, {257, 512}, {1000, 1024}, {3000, 4096},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, maxTokens(tt.n), "n=%d", tt.n)
	}
}

// TestDefaultScenariosBuild checks that every default scenario builds a
// workload of the asked size from the shared traces, and that the trace
// scenarios report a missing trace as ErrTraceMissing.
func TestDefaultScenariosBuild(t *testing.T) {
	for _, sc := range DefaultScenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			require.Len(t, sc.Pods, 8)
			w, err := sc.Build(BuildEnv{N: 200, Seed: 1, TracesDir: tracesDir})
			require.NoError(t, err)
			assert.Len(t, w.Requests, 200)
			_, err = sc.Build(BuildEnv{N: 10, Seed: 1, TracesDir: t.TempDir()})
			if sc.Name == "prefix" || sc.Name == "azure" {
				require.ErrorIs(t, err, ErrTraceMissing)
			} else {
				require.NoError(t, err, "generated scenarios need no trace")
			}
		})
	}
}
