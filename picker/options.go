package picker

import (
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// Option configures a Picker at construction.
type Option func(*options)

type options struct {
	clock     signals.Clock
	seed      uint64
	logger    *slog.Logger
	tracer    trace.TracerProvider
	meter     metric.MeterProvider
	meterAttr []attribute.KeyValue
	matcher   signals.PrefixMatcher
	estimator signals.LatencyEstimator
	observers []signals.Observer
	admitter  scorer.Admitter
	registry  *scorer.Registry
}

// WithClock sets the time source (default: the system clock). The
// simulator passes a virtual clock.
func WithClock(c signals.Clock) Option { return func(o *options) { o.clock = c } }

// WithSeed seeds the random source used for tie-breaks and random
// strategies (default 1). Picks made one after another from one goroutine
// are deterministic for a seed.
func WithSeed(seed uint64) Option { return func(o *options) { o.seed = seed } }

// WithLogger sets the structured logger (default: discard). Decisions are
// logged at debug level.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTracerProvider enables a span per Pick, carrying the chosen endpoint
// and each scorer's weighted contribution. Without it no span is started.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

// WithMeterProvider enables the picker's metrics: pick duration, picks per
// endpoint, errors by kind. Without it nothing is recorded.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meter = mp }
}

// WithMetricAttributes adds attrs to every series the picker records
// (WithMeterProvider), so that the metrics of several pickers sharing one
// meter provider can be told apart: a gateway labels each pool's picker
// with its pool, and a dashboard then shows which pool's picks failed as
// saturated. Later options' attributes are appended. The keys the picker
// sets itself on some series (endpoint, result, kind) are left out of
// attrs, on every series, so that none of them can mislabel a count.
func WithMetricAttributes(attrs ...attribute.KeyValue) Option {
	return func(o *options) { o.meterAttr = append(o.meterAttr, attrs...) }
}

// WithPrefixMatcher sets the prefix index the picker consults once per pick
// to fill scorer.Input.Cached. If m also implements signals.Observer it is
// told about every dispatch and completion. Without this option the picker
// builds its own prefix.Index with default settings; pass
// signals.NoPrefixMatcher{} to run without one.
func WithPrefixMatcher(m signals.PrefixMatcher) Option {
	return func(o *options) { o.matcher = m }
}

// WithLatencyEstimator sets the TTFT predictor handed to scorers through
// scorer.Env. If e also implements signals.Observer it learns from every
// completion. Without this option the picker builds its own
// latency.Predictor on its clock; pass signals.NoLatencyEstimator{} to run
// without one.
func WithLatencyEstimator(e signals.LatencyEstimator) Option {
	return func(o *options) { o.estimator = e }
}

// WithObservers adds observers told about every dispatch and completion.
func WithObservers(obs ...signals.Observer) Option {
	return func(o *options) { o.observers = append(o.observers, obs...) }
}

// WithAdmitter sets the admission check run after filtering; a rejection
// fails the pick with ErrSaturated.
func WithAdmitter(a scorer.Admitter) Option { return func(o *options) { o.admitter = a } }

// WithRegistry sets the registry that configuration names are looked up in
// (default: scorer.NewRegistry(), the built-ins). Pass a registry with your
// own filters and scorers added to use them from YAML.
func WithRegistry(r *scorer.Registry) Option { return func(o *options) { o.registry = r } }
