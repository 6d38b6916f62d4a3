// Package metrictest reads what an OpenTelemetry SDK meter provider
// collected, for tests: every data point under one string key, so that a
// test asserts a map of the figures a user would see on a dashboard.
package metrictest

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Collect collects reader once and returns its int64 sums and gauges by
// "name{k=v,...}" (attributes in key order; just "name" for a data point
// without attributes), sums of one key added up, and each float64
// histogram's count by the same key. It fails t if collecting fails.
func Collect(t testing.TB, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collecting metrics: %v", err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					got[key(m.Name, dp.Attributes.ToSlice())] += dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					got[key(m.Name, dp.Attributes.ToSlice())] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					got[key(m.Name, dp.Attributes.ToSlice())] += int64(dp.Count)
				}
			}
		}
	}
	return got
}

func key(name string, attrs []attribute.KeyValue) string {
	if len(attrs) == 0 {
		return name
	}
	labels := make([]string, len(attrs))
	for i, kv := range attrs {
		labels[i] = string(kv.Key) + "=" + kv.Value.String()
	}
	return name + "{" + strings.Join(labels, ",") + "}"
}
