package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"

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
	cfg      Config
	log      *slog.Logger
	handler  http.Handler
	proxy    *router.Proxy
	scraper  *scrape.Scraper
	mp       *sdkmetric.MeterProvider
	pickers  map[string]*picker.Picker
	eps      []*signals.Endpoint
	indexes  []*prefix.Index
	registry *prometheus.Registry
}

// NewGateway builds a gateway from cfg: per pool a prefix index, a TTFT
// predictor and a picker over the static endpoints; one scraper for every
// endpoint; the routing table and proxy; and an OpenTelemetry meter
// provider exported in the Prometheus format on /metrics. Nothing runs
// until Start.
func NewGateway(cfg Config, log *slog.Logger) (*Gateway, error) {
	g := &Gateway{cfg: cfg, log: log, pickers: map[string]*picker.Picker{}, registry: prometheus.NewRegistry()}
	g.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(g.registry))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	if os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		// The gateway records no spans, so the SDK's default trace-based
		// filter never keeps an exemplar; it would still be consulted on
		// every measurement (1–1.5% of the gateway's CPU at saturation).
		// The standard variable turns exemplars back on.
		mpOpts = append(mpOpts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	g.mp = sdkmetric.NewMeterProvider(mpOpts...)
	meter := g.mp.Meter("github.com/inferroute/inferroute/examples/gateway")

	upstream, err := upstreamTransport(cfg.Router)
	if err != nil {
		return nil, err
	}
	hasher := prefix.NewHasher(prefix.HashConfig{})
	tc := router.TableConfig{Default: cfg.DefaultPool, Fallback: cfg.FallbackPool, Created: time.Now()}
	for _, pc := range cfg.Pools {
		ix, err := prefix.NewIndex(prefix.IndexConfig{
			TokensPerBlock: hasher.Config().TokenBlock, Meter: meter,
			// Each pool's index its own series: a gauge keeps one value
			// per attribute set.
			Attributes: []attribute.KeyValue{attribute.String("pool", pc.Name)},
		})
		if err != nil {
			return nil, err
		}
		g.indexes = append(g.indexes, ix)
		pcfg := picker.DefaultConfig()
		if pc.Picker != nil {
			pcfg = *pc.Picker
		}
		halfLife := time.Duration(pcfg.StalenessHalfLife)
		if halfLife == 0 {
			halfLife = picker.DefaultHalfLife
		}
		pred := latency.New(latency.Config{HalfLife: halfLife})
		opts := []picker.Option{
			picker.WithLogger(log.With("pool", pc.Name)),
			picker.WithMeterProvider(g.mp),
			picker.WithPrefixMatcher(ix),
			picker.WithLatencyEstimator(pred),
		}
		if pc.Admission != nil {
			adm, err := scorer.NewSLOAdmitter(pc.Admission.params(), scorer.Env{HalfLife: halfLife, Matcher: ix, Estimator: pred})
			if err != nil {
				return nil, fmt.Errorf("pool %q: admission: %w", pc.Name, err)
			}
			opts = append(opts, picker.WithAdmitter(adm))
		}
		pk, err := picker.New(pcfg, opts...)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		var eps []*signals.Endpoint
		for _, ec := range pc.Endpoints {
			metricsURL := ec.MetricsURL
			if metricsURL == "" && cfg.Router.UpstreamScheme == "https" {
				metricsURL = "https://" + ec.Address + "/metrics"
			}
			eps = append(eps, signals.NewEndpoint(signals.EndpointSpec{
				Name: ec.Name, Address: ec.Address, MetricsURL: metricsURL, Engine: ec.Engine,
				Model: ec.Model, Adapters: ec.Adapters, Labels: ec.Labels,
			}))
		}
		pk.SetEndpoints(eps)
		g.eps = append(g.eps, eps...)
		g.pickers[pc.Name] = pk
		tc.Pools = append(tc.Pools, router.PoolConfig{
			Name: pc.Name, Picker: pk, Models: pc.Models, Adapters: pc.Adapters, Aliases: pc.Aliases,
		})
	}
	table, err := router.NewTable(tc)
	if err != nil {
		return nil, err
	}
	g.proxy, err = router.NewProxy(table, router.Config{
		Transport:         upstream,
		UpstreamScheme:    cfg.Router.UpstreamScheme,
		Hasher:            hasher,
		MaxBodyBytes:      cfg.Router.MaxBodyBytes,
		MaxRetries:        cfg.Router.MaxRetries,
		UpstreamTimeout:   time.Duration(cfg.Router.UpstreamTimeout),
		StreamIdleTimeout: time.Duration(cfg.Router.StreamIdleTimeout),
		StripHeaders:      cfg.Router.StripHeaders,
		EndpointHeader:    cfg.Router.EndpointHeader,
		Logger:            log,
		MeterProvider:     g.mp,
	})
	if err != nil {
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
			return nil, err
		}
		g.scraper.SetEndpoints(g.eps)
	}
	metrics := promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})
	// Two fixed paths and the proxy for the rest: a switch rather than an
	// http.ServeMux, whose pattern matching allocates on every request.
	g.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/healthz":
				g.healthz(w, r)
				return
			case "/metrics":
				metrics.ServeHTTP(w, r)
				return
			}
		}
		g.proxy.ServeHTTP(w, r)
	})
	return g, nil
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
	for _, ep := range g.eps {
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
	var errs []error
	for _, ix := range g.indexes {
		errs = append(errs, ix.Close())
	}
	errs = append(errs, g.mp.Shutdown(ctx))
	return errors.Join(errs...)
}

// run serves the gateway described by cfg on ln until ctx ends, then shuts
// down gracefully: it stops accepting connections, lets requests and
// streams in flight finish for up to cfg.DrainTimeout, and stops the
// scraper. It returns nil after a clean drain. A demo mode (or a test) can
// call it with its own listener and configuration.
func run(ctx context.Context, cfg Config, ln net.Listener, log *slog.Logger) error {
	g, err := NewGateway(cfg, log)
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           g.Handler(),
		ReadHeaderTimeout: time.Duration(cfg.ReadHeaderTimeout),
		IdleTimeout:       time.Duration(cfg.IdleTimeout),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("gateway listening", "address", ln.Addr().String(), "pools", len(cfg.Pools), "endpoints", len(g.eps))
	select {
	case err := <-errc:
		_ = g.Close(context.Background())
		return err
	case <-ctx.Done():
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
