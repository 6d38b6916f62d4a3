package picker

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inferroute/inferroute/signals"
)

// instrumentationName is the OpenTelemetry instrumentation scope.
const instrumentationName = "github.com/inferroute/inferroute/picker"

// instruments holds the picker's OpenTelemetry metrics. The zero value
// records nothing (no meter provider configured).
type instruments struct {
	enabled  bool
	duration metric.Float64Histogram
	picks    metric.Int64Counter
	errors   metric.Int64Counter
	outcomes metric.Int64Counter

	// perEndpoint caches each endpoint's attribute options so that neither
	// a pick nor a Done builds an attribute set (which allocates and, in a
	// gateway, cost 3-4% of its CPU). SetEndpoints drops departed endpoints.
	perEndpoint sync.Map // *signals.Endpoint -> *endpointOpts
	errOpts     map[error]metric.MeasurementOption
}

// endpointOpts are one endpoint's attribute sets: for picks, and for
// completions by result. Each is a one-element slice passed with "...":
// passing the option itself would make every Add allocate the variadic
// slice, which escapes through the instrument's interface.
type endpointOpts struct {
	picked, ok, failed, connectError []metric.AddOption
}

func (in *instruments) init(mp metric.MeterProvider) error {
	if mp == nil {
		return nil
	}
	m := mp.Meter(instrumentationName)
	var err error
	if in.duration, err = m.Float64Histogram("inferroute.pick.duration",
		metric.WithUnit("s"), metric.WithDescription("Time spent in Pick."),
		metric.WithExplicitBucketBoundaries(1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 1e-3)); err != nil {
		return err
	}
	if in.picks, err = m.Int64Counter("inferroute.picks",
		metric.WithDescription("Requests dispatched, per endpoint.")); err != nil {
		return err
	}
	if in.errors, err = m.Int64Counter("inferroute.pick.errors",
		metric.WithDescription("Failed picks, by kind.")); err != nil {
		return err
	}
	if in.outcomes, err = m.Int64Counter("inferroute.requests.completed",
		metric.WithDescription("Requests reported through Done, per endpoint and result.")); err != nil {
		return err
	}
	in.errOpts = map[error]metric.MeasurementOption{
		ErrNoEndpoints: metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", "no_endpoints"))),
		ErrSaturated:   metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", "saturated"))),
	}
	in.enabled = true
	return nil
}

func (in *instruments) endpointOpts(ep *signals.Endpoint) *endpointOpts {
	if o, ok := in.perEndpoint.Load(ep); ok {
		return o.(*endpointOpts)
	}
	name := attribute.String("endpoint", ep.Name)
	result := func(r string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(name, attribute.String("result", r)))}
	}
	o := &endpointOpts{
		picked:       []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(name))},
		ok:           result("ok"),
		failed:       result("error"),
		connectError: result("connect_error"),
	}
	actual, _ := in.perEndpoint.LoadOrStore(ep, o)
	return actual.(*endpointOpts)
}

// retain drops the cached options of endpoints not in eps.
func (in *instruments) retain(eps []*signals.Endpoint) {
	if !in.enabled {
		return
	}
	keep := make(map[*signals.Endpoint]bool, len(eps))
	for _, ep := range eps {
		keep[ep] = true
	}
	in.perEndpoint.Range(func(k, _ any) bool {
		if !keep[k.(*signals.Endpoint)] {
			in.perEndpoint.Delete(k)
		}
		return true
	})
}

func (in *instruments) picked(ctx context.Context, ep *signals.Endpoint, d time.Duration) {
	if !in.enabled {
		return
	}
	in.duration.Record(ctx, d.Seconds())
	in.picks.Add(ctx, 1, in.endpointOpts(ep).picked...)
}

func (in *instruments) failed(ctx context.Context, e *Error, d time.Duration) {
	if !in.enabled {
		return
	}
	in.duration.Record(ctx, d.Seconds())
	for sentinel, opt := range in.errOpts {
		if errors.Is(e, sentinel) {
			in.errors.Add(ctx, 1, opt)
			return
		}
	}
}

func (in *instruments) done(ep *signals.Endpoint, info DoneInfo) {
	if !in.enabled {
		return
	}
	o := in.endpointOpts(ep)
	opt := o.ok
	switch {
	case info.ConnectError:
		opt = o.connectError
	case info.Err != nil:
		opt = o.failed
	}
	in.outcomes.Add(context.Background(), 1, opt...)
}
