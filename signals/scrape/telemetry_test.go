package scrape

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/inferroute/inferroute/signals"
)

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func attr(set attribute.Set, key string) string {
	v, _ := set.Value(attribute.Key(key))
	return v.AsString()
}

func TestTelemetry(t *testing.T) {
	clock := newFakeClock()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	good := newPageServer(t, "vllm:num_requests_running 1\n")
	// Each scrape of good takes 7 ms of the fake clock.
	good.before = func() { clock.Advance(7 * time.Millisecond) }
	bad := newPageServer(t, "")
	bad.status.Store(http.StatusBadGateway)

	epGood := signals.NewEndpoint(signals.EndpointSpec{Name: "good", Address: good.addr()})
	epBad := signals.NewEndpoint(signals.EndpointSpec{Name: "bad", Address: bad.addr()})
	s := newTestScraper(t, Config{}, WithClock(clock), WithMeterProvider(mp))
	s.SetEndpoints([]*signals.Endpoint{epGood, epBad})

	require.NoError(t, s.Scrape(context.Background(), epGood))
	sentSecond := clock.Now()
	require.NoError(t, s.Scrape(context.Background(), epGood))
	require.Error(t, s.Scrape(context.Background(), epBad))
	require.Error(t, s.Scrape(context.Background(), epBad))
	clock.Advance(250 * time.Millisecond)

	data := collect(t, reader)

	hist, ok := data[MetricScrapeDuration].(metricdata.Histogram[float64])
	require.True(t, ok, "duration histogram missing")
	byOutcome := map[string]metricdata.HistogramDataPoint[float64]{}
	for _, dp := range hist.DataPoints {
		byOutcome[attr(dp.Attributes, AttrOutcome)] = dp
	}
	require.Contains(t, byOutcome, "ok")
	assert.Equal(t, uint64(2), byOutcome["ok"].Count)
	assert.InDelta(t, 0.014, byOutcome["ok"].Sum, 1e-9)
	assert.Equal(t, uint64(2), byOutcome["error"].Count)

	errs, ok := data[MetricScrapeErrors].(metricdata.Sum[int64])
	require.True(t, ok, "errors counter missing")
	require.Len(t, errs.DataPoints, 1)
	assert.Equal(t, int64(2), errs.DataPoints[0].Value)
	assert.Equal(t, "bad", attr(errs.DataPoints[0].Attributes, AttrEndpoint))
	assert.Equal(t, ReasonStatus, attr(errs.DataPoints[0].Attributes, AttrReason))

	age, ok := data[MetricSnapshotAge].(metricdata.Gauge[float64])
	require.True(t, ok, "snapshot age gauge missing")
	require.Len(t, age.DataPoints, 1, "only endpoints with a snapshot have an age")
	assert.Equal(t, "good", attr(age.DataPoints[0].Attributes, AttrEndpoint))
	// The second good scrape was sent at sentSecond, then 7 ms (its own
	// duration) and 250 ms passed.
	assert.InDelta(t, clock.Now().Sub(sentSecond).Seconds(), age.DataPoints[0].Value, 1e-9)
	assert.InDelta(t, 0.257, age.DataPoints[0].Value, 1e-9)

	// After Stop the age callback is unregistered.
	s.Stop()
	data = collect(t, reader)
	if g, ok := data[MetricSnapshotAge].(metricdata.Gauge[float64]); ok {
		assert.Empty(t, g.DataPoints)
	}
}
