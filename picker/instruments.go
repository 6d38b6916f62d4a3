package picker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inferroute/inferroute/signals"
)

// instrumentationName is the OpenTelemetry instrumentation scope.
const instrumentationName = "github.com/inferroute/inferroute/picker"

// instruments holds the picker's OpenTelemetry metrics. The zero value
// records nothing (no meter provider configured).
//
// The per-endpoint counters (picks, completions by result) are observed
// rather than added to: a pick or a Done adds to an atomic, and the
// exporter reads the sums when it collects. A synchronous Add costs the
// SDK an attribute resolution and a map lookup under a lock, twice per
// request (with the router's one, 1.6–2% of a gateway's CPU at
// saturation).
type instruments struct {
	enabled  bool
	duration metric.Float64Histogram
	errors   metric.Int64Counter
	// durationOpts are the pick duration's attributes (WithMetricAttributes):
	// none, or one precomputed set.
	durationOpts []metric.RecordOption

	// perEndpoint caches each endpoint's counters, so that neither a pick
	// nor a Done looks up a name or builds an attribute set. SetEndpoints
	// drops departed endpoints from it.
	perEndpoint sync.Map // *signals.Endpoint -> *endpointCounts
	counters    *counters
	errOpts     map[error]metric.MeasurementOption
	// reg is the counters' callback, which close unregisters.
	reg metric.Registration
}

// counters holds the counts of every endpoint name seen, departed ones
// included, as the SDK keeps every series of a synchronous counter: a count
// is never lost to a pool change between two collections. It is all that
// the meter provider's callback holds on to, so that a picker that is no
// longer used leaves its counts behind, not its endpoints.
type counters struct {
	picks, outcomes metric.Int64ObservableCounter
	attrs           []attribute.KeyValue // added to every endpoint's series

	mu     sync.Mutex
	byName map[string]*endpointCounts
}

// endpointCounts are one endpoint name's counts and attribute sets: picks,
// and completions by result. Each option is a one-element slice passed
// with "...", so that observing allocates no variadic slice.
type endpointCounts struct {
	picked, ok, failed, connectError             atomic.Int64
	pickedOpt, okOpt, failedOpt, connectErrorOpt []metric.ObserveOption
}

func (in *instruments) init(mp metric.MeterProvider, attrs []attribute.KeyValue) error {
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
	attrs = slices.DeleteFunc(slices.Clone(attrs), func(kv attribute.KeyValue) bool {
		return kv.Key == "endpoint" || kv.Key == "result" || kv.Key == "kind"
	})
	if len(attrs) > 0 {
		in.durationOpts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
	}
	cs := &counters{byName: map[string]*endpointCounts{}, attrs: attrs}
	if cs.picks, err = m.Int64ObservableCounter("inferroute.picks",
		metric.WithDescription("Requests dispatched, per endpoint.")); err != nil {
		return err
	}
	if in.errors, err = m.Int64Counter("inferroute.pick.errors",
		metric.WithDescription("Failed picks, by kind.")); err != nil {
		return err
	}
	if cs.outcomes, err = m.Int64ObservableCounter("inferroute.requests.completed",
		metric.WithDescription("Requests reported through Done, per endpoint and result.")); err != nil {
		return err
	}
	if in.reg, err = m.RegisterCallback(cs.observe, cs.picks, cs.outcomes); err != nil {
		return err
	}
	in.counters = cs
	kind := func(k string) metric.MeasurementOption {
		return metric.WithAttributeSet(withAttrs(attrs, attribute.String("kind", k)))
	}
	in.errOpts = map[error]metric.MeasurementOption{
		ErrNoEndpoints: kind("no_endpoints"),
		ErrSaturated:   kind("saturated"),
	}
	in.enabled = true
	return nil
}

func (in *instruments) counts(ep *signals.Endpoint) *endpointCounts {
	if c, ok := in.perEndpoint.Load(ep); ok {
		return c.(*endpointCounts)
	}
	cs := in.counters
	cs.mu.Lock()
	c := cs.byName[ep.Name]
	if c == nil {
		name := attribute.String("endpoint", ep.Name)
		result := func(r string) []metric.ObserveOption {
			return []metric.ObserveOption{metric.WithAttributeSet(withAttrs(cs.attrs, name, attribute.String("result", r)))}
		}
		c = &endpointCounts{
			pickedOpt:       []metric.ObserveOption{metric.WithAttributeSet(withAttrs(cs.attrs, name))},
			okOpt:           result("ok"),
			failedOpt:       result("error"),
			connectErrorOpt: result("connect_error"),
		}
		cs.byName[ep.Name] = c
	}
	cs.mu.Unlock()
	in.perEndpoint.Store(ep, c)
	return c
}

// observe reports the counts; the meter provider calls it when its reader
// collects. A count still at zero is left out, as a synchronous counter
// has no series before its first Add.
func (cs *counters) observe(_ context.Context, o metric.Observer) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.byName {
		for _, v := range [...]struct {
			inst metric.Int64Observable
			n    int64
			opts []metric.ObserveOption
		}{
			{cs.picks, c.picked.Load(), c.pickedOpt},
			{cs.outcomes, c.ok.Load(), c.okOpt},
			{cs.outcomes, c.failed.Load(), c.failedOpt},
			{cs.outcomes, c.connectError.Load(), c.connectErrorOpt},
		} {
			if v.n != 0 {
				o.ObserveInt64(v.inst, v.n, v.opts...)
			}
		}
	}
	return nil
}

// close unregisters the counters' callback: the meter provider no longer
// reports them, nor holds them.
func (in *instruments) close() error {
	if in.reg == nil {
		return nil
	}
	return in.reg.Unregister()
}

// retain drops the cached counters of endpoints not in eps; their counts
// stay in in.counters.
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
	in.duration.Record(ctx, d.Seconds(), in.durationOpts...)
	in.counts(ep).picked.Add(1)
}

func (in *instruments) failed(ctx context.Context, e *Error, d time.Duration) {
	if !in.enabled {
		return
	}
	in.duration.Record(ctx, d.Seconds(), in.durationOpts...)
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
	c := in.counts(ep)
	switch {
	case info.ConnectError:
		c.connectError.Add(1)
	case info.Err != nil:
		c.failed.Add(1)
	default:
		c.ok.Add(1)
	}
}

// withAttrs is the set of base (WithMetricAttributes, without the
// picker's own keys) and own, the picker's own attributes.
func withAttrs(base []attribute.KeyValue, own ...attribute.KeyValue) attribute.Set {
	kv := make([]attribute.KeyValue, 0, len(base)+len(own))
	kv = append(append(kv, base...), own...)
	return attribute.NewSet(kv...)
}
