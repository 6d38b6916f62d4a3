package scrape

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Instrument names, following the OpenTelemetry semantic-convention style
// (dot-separated namespace, unit "s" for durations).
const (
	MetricScrapeDuration = "inferroute.scrape.duration"
	MetricScrapeErrors   = "inferroute.scrape.errors"
	MetricSnapshotAge    = "inferroute.scrape.snapshot.age"

	// AttrEndpoint, AttrReason and AttrOutcome are the attribute keys.
	AttrEndpoint = "endpoint"
	AttrReason   = "reason"
	AttrOutcome  = "outcome"
)

// scrapeBuckets are histogram bounds in seconds, from a fast local scrape
// (sub-millisecond) to the default 1 s timeout.
var scrapeBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

type telemetry struct {
	duration metric.Float64Histogram
	errors   metric.Int64Counter
	age      metric.Float64ObservableGauge
	reg      metric.Registration
	ok, fail metric.RecordOption
}

// targetTelemetry holds one endpoint's precomputed attribute sets, so that
// recording costs no allocation on the success path.
type targetTelemetry struct {
	name     string
	endpoint metric.MeasurementOption
}

func newTelemetry(mp metric.MeterProvider, observe func(context.Context, metric.Observer, metric.Float64Observable) error) (*telemetry, error) {
	m := mp.Meter("github.com/inferroute/inferroute/signals/scrape")
	t := &telemetry{
		ok:   metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrOutcome, "ok"))),
		fail: metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrOutcome, "error"))),
	}
	var err error
	if t.duration, err = m.Float64Histogram(MetricScrapeDuration,
		metric.WithDescription("Duration of one metrics scrape, from request to parsed page."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(scrapeBuckets...)); err != nil {
		return nil, err
	}
	if t.errors, err = m.Int64Counter(MetricScrapeErrors,
		metric.WithDescription("Failed metrics scrapes, by endpoint and reason."),
		metric.WithUnit("{error}")); err != nil {
		return nil, err
	}
	if t.age, err = m.Float64ObservableGauge(MetricSnapshotAge,
		metric.WithDescription("Age of each endpoint's latest metrics snapshot."),
		metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if t.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		return observe(ctx, o, t.age)
	}, t.age); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *telemetry) forEndpoint(name string) targetTelemetry {
	return targetTelemetry{
		name:     name,
		endpoint: metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrEndpoint, name))),
	}
}

func (t *telemetry) record(ctx context.Context, tt targetTelemetry, took time.Duration, err error) {
	// Record even when ctx is done: the measurement is about a finished
	// scrape.
	ctx = context.WithoutCancel(ctx)
	if err == nil {
		t.duration.Record(ctx, took.Seconds(), t.ok)
		return
	}
	t.duration.Record(ctx, took.Seconds(), t.fail)
	reason := ReasonConnect
	var se *Error
	if errors.As(err, &se) {
		reason = se.Reason
	}
	t.errors.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String(AttrEndpoint, tt.name), attribute.String(AttrReason, reason))))
}

func (t *telemetry) close() { _ = t.reg.Unregister() }

// observeAges reports, for every endpoint with a snapshot, the time since
// the snapshot's scrape was sent.
func (s *Scraper) observeAges(_ context.Context, o metric.Observer, age metric.Float64Observable) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	for ep, t := range s.targets {
		if m := ep.Metrics(); m != nil {
			o.ObserveFloat64(age, max(now.Sub(m.ScrapedAt).Seconds(), 0), t.tel.endpoint)
		}
	}
	return nil
}
