package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferroute/inferroute/benchmarks/emulator"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/scrape"
)

// Policy names.
const (
	// RoundRobin sends the i-th request to the i-th healthy endpoint,
	// modulo their number: the baseline.
	RoundRobin = "round-robin"
	// Inferroute is the library's default picker (picker.DefaultConfig)
	// with its prefix index and latency predictor.
	Inferroute = "inferroute"
)

// ShedSaturation selects SaturationAdmitter in GatewayConfig.Shed.
const ShedSaturation = "saturation"

// GatewayConfig configures a Gateway. The zero value of every field means
// its default.
type GatewayConfig struct {
	// Policy is RoundRobin or Inferroute; "" means Inferroute.
	Policy string
	// ScrapeInterval is the scraper's interval; 0 means 50 ms (the
	// scraper's default and the simulator's).
	ScrapeInterval time.Duration
	// Shed selects load shedding of sheddable requests (priority < 0):
	// ShedSaturation uses SaturationAdmitter; "" uses ShedTTFT.
	Shed string
	// ShedTTFT, when positive and Shed is "", sheds sheddable requests (priority < 0)
	// whose predicted TTFT exceeds it on every endpoint, with the library's
	// SLO admitter (scorer.SLOAdmitter): the proxy answers 429.
	ShedTTFT time.Duration
	// MaxRetries is the proxy's retry bound on fallbacks; 0 means the
	// router's default.
	MaxRetries int
	// Seed seeds the picker and the scraper's jitter; 0 means 1.
	Seed uint64
	// Logger receives the gateway's logs; nil means discard.
	Logger *slog.Logger
}

// Gateway is an inference gateway on a loopback port, built as a user of
// the library would build one: a router.Proxy over one pool whose picker
// reads endpoints kept current by a scrape.Scraper. It records every
// upstream attempt (Attempts) for the chaos measurements.
type Gateway struct {
	srv     *http.Server
	addr    string
	picker  *picker.Picker
	scraper *scrape.Scraper
	eps     []*signals.Endpoint
	rec     *recorder
	obs     *completions
	done    chan struct{}
	once    sync.Once
}

// roundRobinScorer gives 1 to one candidate per pick, the next one each
// time: with no other scorer, the picker then routes round-robin over the
// candidates that pass its filters.
type roundRobinScorer struct{ next atomic.Uint64 }

var _ scorer.Scorer = (*roundRobinScorer)(nil)

func (s *roundRobinScorer) Score(_ context.Context, in *scorer.Input, out []float64) {
	k := int((s.next.Add(1) - 1) % uint64(len(out)))
	for i := range out {
		out[i] = 0
	}
	out[k] = 1
}

// StartGateway starts a gateway routing to the fleet's pods. It stops when
// ctx is done or on Close.
func StartGateway(ctx context.Context, fleet *emulator.Fleet, cfg GatewayConfig) (*Gateway, error) {
	if cfg.Policy == "" {
		cfg.Policy = Inferroute
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = scrape.DefaultInterval
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(fleet.Pods) == 0 {
		return nil, errors.New("e2e: empty fleet")
	}
	model := fleet.Pods[0].Model()
	var pcfg picker.Config
	starts := &pickStarts{at: map[*signals.Request]time.Time{}}
	obs := &completions{starts: starts}
	opts := []picker.Option{picker.WithSeed(cfg.Seed), picker.WithLogger(log), picker.WithObservers(obs)}
	switch cfg.Policy {
	case Inferroute:
		pcfg = picker.DefaultConfig()
		reg := scorer.NewRegistry()
		if err := starts.register(reg); err != nil {
			return nil, err
		}
		pcfg.Filters = append([]picker.Plugin{{Name: pickStartFilter}}, pcfg.Filters...)
		opts = append(opts, picker.WithRegistry(reg))
		ix, err := prefix.NewIndex(prefix.IndexConfig{})
		if err != nil {
			return nil, err
		}
		pred := latency.New(latency.Config{HalfLife: picker.DefaultHalfLife})
		opts = append(opts, picker.WithPrefixMatcher(ix), picker.WithLatencyEstimator(pred))
		switch {
		case cfg.Shed == ShedSaturation:
			opts = append(opts, picker.WithAdmitter(&SaturationAdmitter{HalfLife: picker.DefaultHalfLife}))
		case cfg.ShedTTFT > 0:
			p := scorer.DefaultSLOParams()
			p.ShedTTFTMs = float64(cfg.ShedTTFT) / float64(time.Millisecond)
			adm, err := scorer.NewSLOAdmitter(p, scorer.Env{HalfLife: picker.DefaultHalfLife, Matcher: ix, Estimator: pred})
			if err != nil {
				return nil, err
			}
			opts = append(opts, picker.WithAdmitter(adm))
		}
	case RoundRobin:
		reg := scorer.NewRegistry()
		rr := &roundRobinScorer{}
		if err := reg.RegisterScorer(RoundRobin, func(scorer.Params, scorer.Env) (scorer.Scorer, error) { return rr, nil }); err != nil {
			return nil, err
		}
		if err := starts.register(reg); err != nil {
			return nil, err
		}
		pcfg = picker.Config{
			Filters: []picker.Plugin{{Name: pickStartFilter}, {Name: scorer.FilterHealthy}},
			Scorers: []picker.Plugin{{Name: RoundRobin, Weight: 1}},
		}
		opts = append(opts, picker.WithRegistry(reg))
	default:
		return nil, fmt.Errorf("e2e: unknown policy %q", cfg.Policy)
	}
	pk, err := picker.New(pcfg, opts...)
	if err != nil {
		return nil, err
	}
	eps := fleet.Endpoints()
	pk.SetEndpoints(eps)
	sc, err := scrape.New(scrape.Config{Interval: cfg.ScrapeInterval}, scrape.WithSeed(cfg.Seed), scrape.WithLogger(log))
	if err != nil {
		return nil, err
	}
	sc.SetEndpoints(eps)
	adapters := map[string]string{}
	for _, p := range fleet.Pods {
		for _, a := range p.Spec().Adapters {
			adapters[a] = model
		}
	}
	table, err := router.NewTable(router.TableConfig{Pools: []router.PoolConfig{{
		Name: "default", Picker: pk, Models: []string{model}, Adapters: adapters,
	}}})
	if err != nil {
		return nil, err
	}
	rec := newRecorder(router.NewTransport())
	proxy, err := router.NewProxy(table, router.Config{Transport: rec, MaxRetries: cfg.MaxRetries, Logger: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		srv:     &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second},
		addr:    ln.Addr().String(),
		picker:  pk,
		scraper: sc,
		eps:     eps,
		rec:     rec,
		obs:     obs,
		done:    make(chan struct{}),
	}
	if err := sc.Start(ctx); err != nil {
		_ = ln.Close()
		return nil, err
	}
	go func() { _ = g.srv.Serve(ln) }()
	go func() {
		select {
		case <-ctx.Done():
			g.Close()
		case <-g.done:
		}
	}()
	return g, nil
}

// URL returns the gateway's base URL.
func (g *Gateway) URL() string { return "http://" + g.addr }

// Endpoints returns the gateway's endpoints, in fleet order. The slice
// must not be modified.
func (g *Gateway) Endpoints() []*signals.Endpoint { return g.eps }

// Attempts returns every upstream attempt the gateway made so far, in
// order. The slice is fresh.
func (g *Gateway) Attempts() []Attempt { return g.rec.snapshot() }

// Completions returns the picks and the outcomes the picker's Done
// reported so far, in order. The slice is fresh.
func (g *Gateway) Completions() []Completion {
	g.obs.mu.Lock()
	defer g.obs.mu.Unlock()
	return append([]Completion(nil), g.obs.log...)
}

// Completion is one pick (Dispatch), one retry on a fallback (Retry) or
// one outcome reported through the picker's Done.
type Completion struct {
	// At is when the pick began, before any filter read the endpoints'
	// health (a Dispatch); otherwise when the retry was accounted or the
	// outcome reported.
	At      time.Time
	Address string
	// Dispatch marks a pick: the picker chose the endpoint among the
	// candidates its filters kept.
	Dispatch bool
	// Retry marks a retry on a fallback ranked with an earlier pick
	// (picker.Assign): the proxy checked that fallback's health when it
	// sent the retry, but no filter ran.
	Retry bool
	// OK and ConnectError describe an outcome: no error (the endpoint is
	// reported healthy), or a failure to reach it (the endpoint was marked
	// down just before At).
	OK           bool
	ConnectError bool
}

// pickStartFilter names the pickStarts filter in the gateway's registry.
const pickStartFilter = "e2e-pick-start"

// pickStarts is the first filter of the gateway's chain: it keeps every
// candidate and notes when each pick began, before the health filter read
// any endpoint's health. Paired with the pick's Dispatched, the note orders
// a pick of a dead pod against the moment the pod was marked down: a pick
// that began after it cannot have seen the pod healthy. Timestamps taken
// when the choice is reported could not, on a loaded machine, where a
// goroutine may wait many milliseconds between filtering and reporting.
type pickStarts struct {
	mu sync.Mutex
	at map[*signals.Request]time.Time
}

var _ scorer.Filter = (*pickStarts)(nil)

func (s *pickStarts) register(reg *scorer.Registry) error {
	return reg.RegisterFilter(pickStartFilter, func(scorer.Params, scorer.Env) (scorer.Filter, error) { return s, nil })
}

func (s *pickStarts) Filter(_ context.Context, in *scorer.Input) []*signals.Endpoint {
	now := time.Now()
	s.mu.Lock()
	s.at[in.Request] = now
	s.mu.Unlock()
	return in.Endpoints
}

// take returns and forgets the start of req's pick; ok is false when no
// filter ran since the last take: the dispatch is a retry.
func (s *pickStarts) take(req *signals.Request) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok = s.at[req]
	delete(s.at, req)
	return at, ok
}

// completions is a signals.Observer recording every dispatch and Done.
type completions struct {
	starts *pickStarts
	mu     sync.Mutex
	log    []Completion
}

var _ signals.Observer = (*completions)(nil)

func (c *completions) Dispatched(req *signals.Request, ep *signals.Endpoint) {
	at, picked := c.starts.take(req)
	if !picked {
		at = time.Now()
	}
	cp := Completion{At: at, Address: ep.Address, Dispatch: picked, Retry: !picked}
	c.mu.Lock()
	c.log = append(c.log, cp)
	c.mu.Unlock()
}

func (c *completions) Completed(_ *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	cp := Completion{At: time.Now(), Address: ep.Address, OK: out.Err == nil, ConnectError: out.ConnectError}
	c.mu.Lock()
	c.log = append(c.log, cp)
	c.mu.Unlock()
}

// Close stops the gateway: its listener, connections and scraper. It is
// idempotent.
func (g *Gateway) Close() {
	g.once.Do(func() {
		close(g.done)
		_ = g.srv.Close()
		g.scraper.Stop()
		if t, ok := g.rec.next.(*http.Transport); ok {
			t.CloseIdleConnections()
		}
	})
}

// Attempt is one upstream request the gateway sent.
type Attempt struct {
	// At is when the attempt was sent.
	At time.Time
	// Address is the endpoint's host:port.
	Address string
	// End is when the response headers arrived or the attempt failed.
	End time.Time
	// ConnectError reports that the attempt got no response (a refused or
	// reset connection).
	ConnectError bool
	// Err is the attempt's error, "" on a response.
	Err string
}

// recorder is an http.RoundTripper that records attempts.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []Attempt
}

func newRecorder(next http.RoundTripper) *recorder { return &recorder{next: next} }

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	at := time.Now()
	resp, err := r.next.RoundTrip(req)
	a := Attempt{At: at, End: time.Now(), Address: req.URL.Host, ConnectError: err != nil && req.Context().Err() == nil}
	if err != nil {
		a.Err = err.Error()
	}
	r.mu.Lock()
	r.log = append(r.log, a)
	r.mu.Unlock()
	return resp, err
}

func (r *recorder) snapshot() []Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Attempt(nil), r.log...)
}
