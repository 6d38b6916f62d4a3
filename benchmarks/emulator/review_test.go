package emulator

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metricsFixtures is shared/fixtures/metrics, beside the checkout.
const metricsFixtures = "../../../shared/fixtures/metrics"

// families parses a text exposition page with Prometheus's own parser.
func families(t *testing.T, page []byte) map[string]*dto.MetricFamily {
	t.Helper()
	dec := expfmt.NewDecoder(bytes.NewReader(page), expfmt.NewFormat(expfmt.TypeTextPlain))
	out := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out[mf.GetName()] = mf
	}
}

// TestMetricTypesMatchRecordings parses the emulator's page and the real
// vLLM and llm-d-inference-sim recordings with Prometheus's text parser:
// every family the page shares with a recording must have the recording's
// type. The recordings declare counters under their sample name
// ("# TYPE vllm:prefix_cache_hits_total counter"); a declaration under
// another name leaves the samples in an untyped family of their own.
func TestMetricTypesMatchRecordings(t *testing.T) {
	want := map[string]dto.MetricType{}
	for _, f := range []string{"vllm-v0.prom", "llm-d-inference-sim-after-load.prom"} {
		b, err := os.ReadFile(filepath.Join(metricsFixtures, f))
		require.NoError(t, err)
		for name, mf := range families(t, b) {
			want[name] = mf.GetType()
		}
	}
	p := startPod(t, Options{Adapters: []string{"sql-lora"}})
	got := families(t, getMetrics(t, p))
	shared := 0
	for name, mf := range got {
		typ, ok := want[name]
		if !ok {
			continue
		}
		shared++
		assert.Equal(t, typ, mf.GetType(), name)
	}
	for _, name := range []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total"} {
		require.Contains(t, got, name)
		assert.Equal(t, dto.MetricType_COUNTER, got[name].GetType(), name)
	}
	assert.GreaterOrEqual(t, shared, 10, "the page shares most families with the recordings")
}
