package router

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

const instrumentationName = "github.com/inferroute/inferroute/router"

// instruments are the router's OpenTelemetry metrics. Attributes: pool,
// model (the client's model name from the table, so the cardinality is
// bounded by the table; "" for unknown models) and HTTP status code.
type instruments struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	ttft     metric.Float64Histogram
	retries  metric.Int64Counter
}

func (in *instruments) init(mp metric.MeterProvider) error {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	var err error
	if in.requests, err = m.Int64Counter("inferroute.router.requests",
		metric.WithDescription("Requests handled by the router, by pool, model and HTTP status."),
		metric.WithUnit("{request}")); err != nil {
		return err
	}
	if in.duration, err = m.Float64Histogram("inferroute.router.request.duration",
		metric.WithDescription("Time from the request's arrival to the end of its response."),
		metric.WithUnit("s")); err != nil {
		return err
	}
	if in.ttft, err = m.Float64Histogram("inferroute.router.ttft",
		metric.WithDescription("Time from dispatch to the first response body byte from the model server."),
		metric.WithUnit("s")); err != nil {
		return err
	}
	if in.retries, err = m.Int64Counter("inferroute.router.retries",
		metric.WithDescription("Attempts on a fallback endpoint after a connect error or a 5xx status."),
		metric.WithUnit("{attempt}")); err != nil {
		return err
	}
	return nil
}

func (in *instruments) attrs(c *call) (pool, model string) {
	if c.route.Pool != nil {
		pool = c.route.Pool.Name
	}
	return pool, c.route.ClientModel
}

func (in *instruments) request(ctx context.Context, c *call, status int, d, ttft time.Duration) {
	if !in.requests.Enabled(ctx) && !in.duration.Enabled(ctx) {
		return
	}
	pool, model := in.attrs(c)
	set := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("pool", pool),
		attribute.String("model", model),
		attribute.String("code", strconv.Itoa(status)),
	))
	in.requests.Add(ctx, 1, set)
	in.duration.Record(ctx, d.Seconds(), set)
	if ttft > 0 {
		in.ttft.Record(ctx, ttft.Seconds(), metric.WithAttributeSet(attribute.NewSet(
			attribute.String("pool", pool), attribute.String("model", model))))
	}
}

func (in *instruments) retry(ctx context.Context, c *call) {
	pool, _ := in.attrs(c)
	in.retries.Add(ctx, 1, metric.WithAttributes(attribute.String("pool", pool)))
}
