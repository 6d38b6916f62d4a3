package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/scrape"
)

// Gateway is a built gateway: the proxy, its pools' pickers, the scraper
// and the metrics pipeline, behind one http.Handler.
type Gateway struct {
	log      *slog.Logger
	level    *slog.LevelVar // the logger's level, set by Reload; nil when the caller's logger has its own
	handler  http.Handler
	proxy    *router.Proxy
	scraper  *scrape.Scraper
	mp       *sdkmetric.MeterProvider
	tp       *sdktrace.TracerProvider // nil when tracing is off
	meter    metric.Meter
	hasher   *prefix.Hasher
	created  time.Time
	registry *prometheus.Registry

	// eps is every pool's endpoints, for /healthz, which reads it without
	// the lock.
	eps atomic.Pointer[[]*signals.Endpoint]
	// cert is the certificate served with cfg.TLS, which a reload renews.
	cert atomic.Pointer[tls.Certificate]
	// accessOn switches the access log (cfg.AccessLog), which a reload
	// sets; access writes its lines.
	accessOn atomic.Bool
	access   *slog.Logger
	// keys are the API keys in force (cfg.Auth), nil when off; a reload
	// sets them. refused counts the requests refused for theirs.
	keys      atomic.Pointer[keySet]
	refused   metric.Int64Counter
	refusedBy map[string]metric.AddOption
	// limited counts the requests refused for a key's rate limit, whose
	// buckets read the time from now (time.Now; tests set their own).
	limited metric.Int64Counter
	now     func() time.Time
	// tokens counts the model tokens each key used.
	tokens metric.Int64Counter
	// stopping is set when shutdown begins: /healthz answers 503 from
	// then on, while the gateway still serves (cfg.ShutdownDelay).
	stopping atomic.Bool

	// mu serialises Reload and Close, and guards what they change.
	mu    sync.Mutex
	cfg   Config           // the configuration in force
	pools map[string]*pool // by name

	reloads      metric.Int64Counter
	reloadOK     metric.MeasurementOption
	reloadFailed metric.MeasurementOption
	lastReloadOK atomic.Bool
}

// pool is one running pool: its picker, the prefix index and latency
// predictor the picker scores with, the admission control that a reload can
// swap, and its endpoints in configuration order.
type pool struct {
	cfg  PoolConfig
	pk   *picker.Picker
	ix   *prefix.Index
	pred *latency.Predictor
	adm  *admission
	eps  []*signals.Endpoint
}

// admission is a pool's admission control, held apart from the picker so
// that a reload can turn it on, change it or turn it off: nil admits every
// request. Admit costs the picker one atomic load when it is off.
type admission struct {
	a atomic.Pointer[scorer.SLOAdmitter]
}

// Admit implements scorer.Admitter.
func (s *admission) Admit(ctx context.Context, in *scorer.Input) (bool, string) {
	if a := s.a.Load(); a != nil {
		return a.Admit(ctx, in)
	}
	return true, ""
}

// NewGateway builds a gateway from cfg: per pool a prefix index, a TTFT
// predictor and a picker over the static endpoints; one scraper for every
// endpoint; the routing table and proxy; and an OpenTelemetry meter
// provider exported in the Prometheus format on /metrics. Nothing runs
// until Start.
func NewGateway(cfg Config, log *slog.Logger) (*Gateway, error) {
	return newGateway(cfg, log, os.Stdout)
}

// newGateway is NewGateway with the access log's destination.
func newGateway(cfg Config, log *slog.Logger, access io.Writer) (_ *Gateway, err error) {
	g := &Gateway{cfg: cfg, log: log, pools: map[string]*pool{}, registry: prometheus.NewRegistry(), created: time.Now(), now: time.Now}
	g.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(g.registry))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	res, err := serviceResource()
	if err != nil {
		// The attributes that parsed are kept; metrics are not worth
		// refusing to route for.
		log.Warn("OpenTelemetry resource from the environment is partly malformed", "error", err)
	}
	if g.tp, err = newTracerProvider(context.Background(), res); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && g.tp != nil {
			_ = g.tp.Shutdown(context.Background()) // its exporter's goroutine
		}
	}()
	mpOpts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	if os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		// /metrics is served in Prometheus's text format, which has no
		// exemplars, so the SDK's default trace-based filter would be
		// consulted on every measurement (1–1.5% of the gateway's CPU at
		// saturation) for nothing. The standard variable turns exemplars
		// back on for a reader that shows them.
		mpOpts = append(mpOpts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	g.mp = sdkmetric.NewMeterProvider(mpOpts...)
	g.meter = g.mp.Meter("github.com/inferroute/inferroute/examples/gateway")
	if err := g.initReloadMetrics(); err != nil {
		return nil, err
	}
	if err := g.initAuthMetrics(); err != nil {
		return nil, err
	}
	keys, err := loadKeys(cfg.Auth, nil)
	if err != nil {
		return nil, err
	}
	g.keys.Store(keys)
	logStray(log, keys)

	if cfg.TLS != nil {
		cert, err := loadCert(cfg.TLS)
		if err != nil {
			return nil, err
		}
		g.cert.Store(cert)
	}
	upstream, err := upstreamTransport(cfg.Router)
	if err != nil {
		return nil, err
	}
	g.hasher = prefix.NewHasher(prefix.HashConfig{})
	var all []*signals.Endpoint
	for _, pc := range cfg.Pools {
		p, err := g.newPool(pc)
		if err != nil {
			g.closePools()
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		g.pools[pc.Name] = p
		all = append(all, p.eps...)
	}
	g.eps.Store(&all)
	g.accessOn.Store(cfg.AccessLog)
	g.access = slog.New(switched{on: &g.accessOn, h: slog.NewJSONHandler(access, nil)})
	table, err := g.table(cfg, g.pools)
	if err != nil {
		g.closePools()
		return nil, err
	}
	g.proxy, err = router.NewProxy(table, router.Config{
		Transport:         upstream,
		UpstreamScheme:    cfg.Router.UpstreamScheme,
		Hasher:            g.hasher,
		MaxBodyBytes:      cfg.Router.MaxBodyBytes,
		MaxRetries:        cfg.Router.MaxRetries,
		UpstreamTimeout:   time.Duration(cfg.Router.UpstreamTimeout),
		StreamIdleTimeout: time.Duration(cfg.Router.StreamIdleTimeout),
		StripHeaders:      cfg.Router.StripHeaders,
		EndpointHeader:    cfg.Router.EndpointHeader,
		Logger:            log,
		MeterProvider:     g.mp,
		AccessLog:         g.access,
		RequestID:         requestIDs(cfg.Router.RequestIDs),
		TracerProvider:    g.tracerProvider(),
		Allow:             g.allow,
		Completed:         g.completed,
	})
	if err != nil {
		g.closePools()
		return nil, err
	}
	if !cfg.Scrape.Disabled {
		opts := []scrape.Option{scrape.WithMeterProvider(g.mp), scrape.WithLogger(log)}
		if upstream != nil {
			// The metric pages are served by the same TLS servers.
			opts = append(opts, scrape.WithHTTPClient(&http.Client{Transport: upstream}))
		}
		g.scraper, err = scrape.New(scrape.Config{
			Interval:         time.Duration(cfg.Scrape.Interval),
			Timeout:          time.Duration(cfg.Scrape.Timeout),
			FailureThreshold: cfg.Scrape.FailureThreshold,
		}, opts...)
		if err != nil {
			g.closePools()
			return nil, err
		}
		g.scraper.SetEndpoints(all)
	}
	metrics := promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})
	// Two fixed paths and the proxy for the rest: a switch rather than an
	// http.ServeMux, whose pattern matching allocates on every request.
	g.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/healthz", "/readyz":
				g.healthz(w, r)
				return
			case "/livez":
				// Alive while it serves, whatever its endpoints: a
				// liveness probe on /healthz would restart the
				// gateway each time its model servers are all down,
				// which no restart mends.
				_, _ = w.Write([]byte("ok\n"))
				return
			case "/metrics":
				metrics.ServeHTTP(w, r)
				return
			}
		}
		r, ok := g.authorize(w, r)
		if !ok {
			return
		}
		g.proxy.ServeHTTP(w, r)
	})
	return g, nil
}

// newPool builds a pool from pc: its prefix index (with its own series of
// the index gauges), latency predictor, admission control and picker, over
// new endpoints.
func (g *Gateway) newPool(pc PoolConfig) (*pool, error) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{
		TokensPerBlock: g.hasher.Config().TokenBlock, Meter: g.meter,
		// Each pool's index its own series: a gauge keeps one value
		// per attribute set.
		Attributes: []attribute.KeyValue{attribute.String("pool", pc.Name)},
	})
	if err != nil {
		return nil, err
	}
	pcfg := pickerConfig(pc)
	p := &pool{cfg: pc, ix: ix, adm: &admission{}}
	p.pred = latency.New(latency.Config{HalfLife: halfLife(pcfg)})
	adm, err := p.admitter(pc.Admission, pcfg)
	if err != nil {
		_ = ix.Close()
		return nil, err
	}
	p.adm.a.Store(adm)
	opts := []picker.Option{
		picker.WithLogger(g.log.With("pool", pc.Name)),
		picker.WithMeterProvider(g.mp),
		picker.WithMetricAttributes(attribute.String("pool", pc.Name)),
		picker.WithPrefixMatcher(ix),
		picker.WithLatencyEstimator(p.pred),
		picker.WithAdmitter(p.adm),
	}
	if tp := g.tracerProvider(); tp != nil {
		opts = append(opts, picker.WithTracerProvider(tp))
	}
	p.pk, err = picker.New(pcfg, opts...)
	if err != nil {
		_ = ix.Close()
		return nil, err
	}
	p.eps = g.endpoints(pc, nil)
	p.pk.SetEndpoints(p.eps)
	return p, nil
}

// pickerConfig is pc's picker configuration: picker.DefaultConfig() when
// the pool gives none.
func pickerConfig(pc PoolConfig) picker.Config {
	if pc.Picker != nil {
		return *pc.Picker
	}
	return picker.DefaultConfig()
}

// halfLife is the staleness half-life cfg gives its scorers, which the
// pool's predictor and admission control use too.
func halfLife(cfg picker.Config) time.Duration {
	if hl := time.Duration(cfg.StalenessHalfLife); hl > 0 {
		return hl
	}
	return picker.DefaultHalfLife
}

// admitter builds the admission control ac asks for, reading p's index and
// predictor; nil (admit everything) when ac is nil.
func (p *pool) admitter(ac *AdmissionConfig, pcfg picker.Config) (*scorer.SLOAdmitter, error) {
	if ac == nil {
		return nil, nil
	}
	a, err := scorer.NewSLOAdmitter(ac.params(), scorer.Env{HalfLife: halfLife(pcfg), Matcher: p.ix, Estimator: p.pred})
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	return a, nil
}

// endpoints returns pc's endpoints, in configuration order: those of old
// whose name and settings are unchanged, with their live state (scraped
// metrics, requests in flight, health), and new ones for the rest.
func (g *Gateway) endpoints(pc PoolConfig, old []*signals.Endpoint) []*signals.Endpoint {
	byName := make(map[string]*signals.Endpoint, len(old))
	for _, ep := range old {
		byName[ep.Name] = ep
	}
	eps := make([]*signals.Endpoint, 0, len(pc.Endpoints))
	for _, ec := range pc.Endpoints {
		spec := g.spec(ec)
		if ep := byName[spec.Name]; ep != nil && sameSpec(ep.EndpointSpec, spec) {
			eps = append(eps, ep)
			continue
		}
		eps = append(eps, signals.NewEndpoint(spec))
	}
	return eps
}

// spec is the endpoint ec describes. Its name defaults to its address.
func (g *Gateway) spec(ec EndpointConfig) signals.EndpointSpec {
	metricsURL := ec.MetricsURL
	if metricsURL == "" && g.cfg.Router.UpstreamScheme == "https" {
		metricsURL = "https://" + ec.Address + "/metrics"
	}
	return signals.EndpointSpec{
		Name: cmp.Or(ec.Name, ec.Address), Address: ec.Address, MetricsURL: metricsURL, Engine: ec.Engine,
		Model: ec.Model, Adapters: ec.Adapters, Labels: ec.Labels,
	}
}

// sameSpec reports whether a and b describe the same endpoint. Adapters
// nil (unknown, any may be loaded) and empty (none) differ.
func sameSpec(a, b signals.EndpointSpec) bool {
	return a.Name == b.Name && a.Address == b.Address && a.MetricsURL == b.MetricsURL &&
		a.Engine == b.Engine && a.Model == b.Model &&
		(a.Adapters == nil) == (b.Adapters == nil) && slices.Equal(a.Adapters, b.Adapters) &&
		maps.Equal(a.Labels, b.Labels)
}

// table builds the routing table of cfg's pools, each of which must be in
// pools.
func (g *Gateway) table(cfg Config, pools map[string]*pool) (*router.Table, error) {
	tc := router.TableConfig{Default: cfg.DefaultPool, Fallback: cfg.FallbackPool, Created: g.created}
	for _, pc := range cfg.Pools {
		h, err := upstreamHeader(pc, cfg.Auth)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		tc.Pools = append(tc.Pools, router.PoolConfig{
			Name: pc.Name, Picker: pools[pc.Name].pk, Models: pc.Models, Adapters: pc.Adapters, Aliases: pc.Aliases,
			Header: h,
		})
	}
	return router.NewTable(tc)
}

// closePools closes every pool (pool.close), after a failed build.
func (g *Gateway) closePools() {
	for _, p := range g.pools {
		p.close()
	}
}

// close releases what a pool registered with the meter provider, its
// prefix index's gauges and its picker's counters, so that a pool that
// is gone leaves nothing to be called at each collection. Requests in
// flight still finish and report.
func (p *pool) close() error {
	return errors.Join(p.ix.Close(), p.pk.Close())
}

// loadCert reads the certificate and key that c names.
func loadCert(c *TLSConfig) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %s and %s: %w", c.CertFile, c.KeyFile, err)
	}
	return &cert, nil
}

// TLSConfig returns the server TLS configuration of a gateway whose
// configuration has tls set, nil otherwise: TLS 1.2 or newer, with the
// certificate in force at each handshake, so that a reload's renewed
// certificate serves new connections at once.
func (g *Gateway) TLSConfig() *tls.Config {
	if g.cert.Load() == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return g.cert.Load(), nil
		},
	}
}

// Handler returns the gateway's HTTP handler: /healthz, /metrics and the
// proxy for everything else.
func (g *Gateway) Handler() http.Handler { return g.handler }

// healthz answers 200 when at least one endpoint is healthy and, unless
// scraping is off, has answered a scrape since the gateway started; else
// 503. Endpoints start out healthy, so without the second condition a
// gateway whose endpoints are all dead would report ready until their first
// scrapes failed. With scraping off the gateway learns of an endpoint only
// from the requests it sends, and 200 means no endpoint has failed to
// connect since it last answered.
func (g *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	if g.stopping.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	for _, ep := range *g.eps.Load() {
		if ep.Healthy() && (g.scraper == nil || ep.Metrics() != nil) {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
	}
	http.Error(w, "no healthy endpoint", http.StatusServiceUnavailable)
}

// Start starts the scraper. It returns at once.
func (g *Gateway) Start(ctx context.Context) error {
	if g.scraper == nil {
		return nil
	}
	return g.scraper.Start(ctx)
}

// Close stops the scraper and flushes the metrics pipeline.
func (g *Gateway) Close(ctx context.Context) error {
	if g.scraper != nil {
		g.scraper.Stop()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for _, p := range g.pools {
		errs = append(errs, p.close())
	}
	errs = append(errs, g.mp.Shutdown(ctx))
	if g.tp != nil {
		errs = append(errs, g.tp.Shutdown(ctx)) // exports the spans still batched
	}
	return errors.Join(errs...)
}

// runOptions are run's optional parts; the zero value runs without
// reloads.
type runOptions struct {
	// level is the logger's level, which a reload's logLevel sets; nil
	// leaves the logger as it is.
	level *slog.LevelVar
	// reloads delivers the configurations to apply (Gateway.Reload), or
	// why one could not be read; nil delivers none.
	reloads <-chan configLoad
	// access receives the access log; nil means standard output.
	access io.Writer
}

// run serves the gateway described by cfg on ln until ctx ends, then shuts
// down gracefully: it reports not ready and serves on for
// cfg.ShutdownDelay, stops accepting connections, lets requests and
// streams in flight finish for up to cfg.DrainTimeout, and stops the
// scraper. Meanwhile it applies each configuration opts.reloads delivers.
// It returns nil after a clean drain. A demo mode (or a test) can call it
// with its own listener and configuration.
func run(ctx context.Context, cfg Config, ln net.Listener, log *slog.Logger, opts runOptions) error {
	ln = router.RawListener(ln)
	access := opts.access
	if access == nil {
		access = os.Stdout
	}
	g, err := newGateway(cfg, log, access)
	if err != nil {
		return err
	}
	g.level = opts.level
	if err := g.Start(ctx); err != nil {
		return err
	}
	tlsConf := g.TLSConfig()
	srv := &http.Server{
		Handler:           g.Handler(),
		ReadHeaderTimeout: time.Duration(cfg.ReadHeaderTimeout),
		IdleTimeout:       time.Duration(cfg.IdleTimeout),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         tlsConf, // Serve writes the field (HTTP/2's protocols): read tlsConf after
	}
	errc := make(chan error, 1)
	go func() {
		if tlsConf != nil {
			// The certificate comes from TLSConfig.GetCertificate; ServeTLS
			// also offers HTTP/2.
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	log.Info("gateway listening", "address", ln.Addr().String(), "tls", tlsConf != nil,
		"api keys", g.keys.Load() != nil, "pools", len(cfg.Pools), "endpoints", len(*g.eps.Load()))
serving:
	for {
		select {
		case err := <-errc:
			_ = g.Close(context.Background())
			return err
		case l := <-opts.reloads:
			if l.err != nil {
				g.loadFailed(fmt.Errorf("reading the configuration: %w", l.err))
				continue
			}
			_ = g.Reload(l.cfg) // logged and counted
		case <-ctx.Done():
			break serving
		}
	}
	g.stopping.Store(true)
	if d := time.Duration(cfg.ShutdownDelay); d > 0 {
		// Not ready, still serving, each connection closed after its
		// answer, until the load balancer has taken the gateway out of
		// rotation; a second signal ends the process at once.
		log.Info("shutting down: not ready, serving on", "for", d.String())
		srv.SetKeepAlivesEnabled(false)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			_ = g.Close(context.Background())
			return err
		}
	}
	log.Info("draining", "timeout", time.Duration(cfg.DrainTimeout).String())
	dctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.DrainTimeout))
	defer cancel()
	serr := srv.Shutdown(dctx)
	if serr != nil {
		_ = srv.Close() // drain timed out: cut the remaining streams
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		serr = errors.Join(serr, err)
	}
	serr = errors.Join(serr, g.Close(dctx))
	log.Info("stopped")
	return serr
}

// upstreamTransport returns the transport to HTTPS endpoints, trusting
// rc.UpstreamCAFile's authorities (the system's when ""), or nil for plain
// HTTP, which the router's built-in client serves. It returns the
// interface, so that the nil is a nil RoundTripper.
func upstreamTransport(rc RouterConfig) (http.RoundTripper, error) {
	if rc.UpstreamScheme != "https" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if rc.UpstreamCAFile != "" {
		pem, err := os.ReadFile(rc.UpstreamCAFile)
		if err != nil {
			return nil, fmt.Errorf("router.upstreamCAFile: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("router.upstreamCAFile %s: no PEM certificate in it", rc.UpstreamCAFile)
		}
	}
	tr := router.NewTransport()
	tr.TLSClientConfig = tc
	return tr, nil
}

// serviceName is the gateway's OpenTelemetry service.name, the
// service_name of its target_info series, unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES names another.
const serviceName = "inferroute-gateway"

// serviceResource describes the gateway to its metrics' consumers: the
// SDK's own attributes, service.name "inferroute-gateway" (the SDK's
// default, "unknown_service:" and the executable's name, says nothing
// useful on a dashboard), then whatever OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES set, which wins, as the OpenTelemetry
// specification has environment variables override a program's defaults.
// The resource is usable even with an error, which names the malformed
// part of OTEL_RESOURCE_ATTRIBUTES that was left out.
func serviceResource() (*resource.Resource, error) {
	return resource.New(context.Background(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithFromEnv(),
	)
}

// switched is a slog.Handler that passes records to h while on is set: the
// access log, which a reload turns on or off. Off, Enabled is one atomic
// load and the proxy builds no line.
type switched struct {
	on *atomic.Bool
	h  slog.Handler
}

// Enabled implements slog.Handler.
func (s switched) Enabled(ctx context.Context, l slog.Level) bool {
	return s.on.Load() && s.h.Enabled(ctx, l)
}

// Handle implements slog.Handler. A request that presented an API key
// has the key's name in its line as api_key.
func (s switched) Handle(ctx context.Context, r slog.Record) error {
	if k, ok := ctx.Value(apiKeyCtx{}).(*apiKey); ok {
		r = r.Clone()
		r.AddAttrs(slog.String("api_key", k.name))
	}
	return s.h.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (s switched) WithAttrs(attrs []slog.Attr) slog.Handler {
	return switched{on: s.on, h: s.h.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (s switched) WithGroup(name string) slog.Handler {
	return switched{on: s.on, h: s.h.WithGroup(name)}
}

// requestIDs is router.Config.RequestID for RouterConfig.RequestIDs:
// router.NewRequestID when on, nil when off.
func requestIDs(on bool) func() string {
	if on {
		return router.NewRequestID
	}
	return nil
}
