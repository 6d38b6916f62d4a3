package router

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
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
	// sets maps attrKey → *attrSets, so that a request allocates no
	// attribute set. The meter provider's callback holds it (and no more
	// of the Proxy, which would stay alive as long as the provider).
	sets *sync.Map

	// counting is false without a meter provider: nothing would read the
	// counts.
	counting bool
	requests metric.Int64ObservableCounter // reads attrSets.requests
	duration metric.Float64Histogram
	ttft     metric.Float64Histogram
	retries  metric.Int64Counter
}

// Histogram boundaries in seconds. The SDK's default boundaries (0, 5, 10,
// 25, … 10000) suit milliseconds; LLM requests take from milliseconds
// (cached, short) to minutes (long generations), and TTFT objectives sit
// between 100 ms and a few seconds.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	ttftBuckets     = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30}
)

func (in *instruments) init(mp metric.MeterProvider) error {
	in.counting = mp != nil
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	var err error
	// The request counter is observed rather than added to: each request
	// adds to an atomic in its cached attrSets, and the exporter reads the
	// sums when it collects. A synchronous Add costs the SDK an attribute
	// resolution and a map lookup under a lock per request (with the
	// picker's two, 1.6–2% of the gateway's CPU at saturation); the
	// histograms, which have no asynchronous form, keep them.
	if in.requests, err = m.Int64ObservableCounter("inferroute.router.requests",
		metric.WithDescription("Requests handled by the router, by pool, model and HTTP status."),
		metric.WithUnit("{request}")); err != nil {
		return err
	}
	sets, requests := new(sync.Map), in.requests
	in.sets = sets
	observe := func(_ context.Context, o metric.Observer) error {
		sets.Range(func(_, v any) bool {
			s := v.(*attrSets)
			o.ObserveInt64(requests, s.requests.Load(), s.observe...)
			return true
		})
		return nil
	}
	if _, err = m.RegisterCallback(observe, in.requests); err != nil {
		return err
	}
	if in.duration, err = m.Float64Histogram("inferroute.router.request.duration",
		metric.WithDescription("Time from the request's arrival to the end of its response."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return err
	}
	if in.ttft, err = m.Float64Histogram("inferroute.router.ttft",
		metric.WithDescription("Time from dispatch to the first response body byte from the model server, "+
			"by pool, model and stream, for answers that are not 4xx or 5xx errors: stream=\"false\" is a "+
			"body that came whole (JSON), whose first byte follows its last token."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(ttftBuckets...)); err != nil {
		return err
	}
	if in.retries, err = m.Int64Counter("inferroute.router.retries",
		metric.WithDescription("Attempts on a fallback endpoint after a connect error, a malformed response, a 5xx status or a 429."),
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

type attrKey struct {
	pool, model string
	code        int
}

type attrSets struct {
	requests atomic.Int64 // requests counted under these attributes
	observe  []metric.ObserveOption
	record   []metric.RecordOption // request attributes, as Record options
	// ttft holds the TTFT attributes of a streamed response ([0]) and of
	// one whose body came whole ([1]).
	ttft [2][]metric.RecordOption
}

// sets returns the cached attribute options of a (pool, model, code). The
// table bounds pools and models, and codes are few, so the cache is small.
func (in *instruments) setsFor(pool, model string, code int) *attrSets {
	k := attrKey{pool, model, code}
	if v, ok := in.sets.Load(k); ok {
		return v.(*attrSets)
	}
	request := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("pool", pool), attribute.String("model", model), attribute.String("code", strconv.Itoa(code))))
	ttft := func(stream string) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("pool", pool), attribute.String("model", model), attribute.String("stream", stream)))}
	}
	// Options are kept as slices, so that passing them to Add and Record
	// allocates no variadic slice per request.
	v, _ := in.sets.LoadOrStore(k, &attrSets{
		observe: []metric.ObserveOption{request},
		record:  []metric.RecordOption{request},
		ttft:    [2][]metric.RecordOption{ttft("true"), ttft("false")},
	})
	return v.(*attrSets)
}

func (in *instruments) request(ctx context.Context, c *call, status int, d, ttft time.Duration) {
	if !in.counting {
		return
	}
	pool, model := in.attrs(c)
	sets := in.setsFor(pool, model, status)
	sets.requests.Add(1)
	in.duration.Record(ctx, d.Seconds(), sets.record...)
	if ttft > 0 {
		whole := 0
		if c.buffered {
			whole = 1
		}
		in.ttft.Record(ctx, ttft.Seconds(), sets.ttft[whole]...)
	}
}

func (in *instruments) retry(ctx context.Context, c *call) {
	pool, _ := in.attrs(c)
	in.retries.Add(ctx, 1, metric.WithAttributes(attribute.String("pool", pool)))
}
