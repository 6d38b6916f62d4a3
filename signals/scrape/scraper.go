package scrape

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/sync/semaphore"

	"github.com/inferroute/inferroute/internal/rawio"
	"github.com/inferroute/inferroute/signals"
)

// Config tunes a Scraper. The zero value of every field means its default.
type Config struct {
	// Interval is the time between two scrapes of a healthy endpoint.
	// Default 50 ms.
	Interval time.Duration
	// Jitter is the fraction of the interval (or backoff) added or removed
	// at random for each scrape, so that pods are not hit in lockstep.
	// Default 0.2; a negative value disables jitter, and values above 0.9
	// are capped at 0.9, so a delay never shrinks below a tenth of the
	// interval (or backoff).
	Jitter float64
	// Timeout bounds one scrape, from dial to the last byte of the page.
	// Default 1 s.
	Timeout time.Duration
	// MaxPageBytes caps the bytes read from one metrics page (after
	// decompression); a larger page is an error. Default 4 MiB.
	MaxPageBytes int64
	// Concurrency bounds the scrapes in flight. Default 32.
	Concurrency int
	// FailureThreshold is the number of consecutive failed scrapes after
	// which an endpoint is marked unhealthy. Default 3.
	FailureThreshold int
	// MaxBackoff bounds the exponential backoff between the scrapes of a
	// failing endpoint (interval × 2^failures). Default 5 s.
	MaxBackoff time.Duration
	// EngineLabel is the endpoint label that names the engine when
	// EndpointSpec.Engine is empty. Default "engine"; "-" disables it. An
	// endpoint with neither is read with the vLLM map.
	EngineLabel string
	// Engines are user-defined metric maps by engine name (compared
	// case-insensitively); they take precedence over the built-in maps of
	// the same name. Nil means built-in maps only.
	Engines map[string]*MetricMap
}

// Defaults of Config.
const (
	DefaultInterval         = 50 * time.Millisecond
	DefaultJitter           = 0.2
	DefaultTimeout          = time.Second
	DefaultMaxPageBytes     = 4 << 20
	DefaultConcurrency      = 32
	DefaultFailureThreshold = 3
	DefaultMaxBackoff       = 5 * time.Second
	DefaultEngineLabel      = "engine"
)

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Jitter == 0 {
		c.Jitter = DefaultJitter
	}
	if c.Jitter < 0 {
		c.Jitter = 0
	}
	c.Jitter = min(c.Jitter, 0.9)
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxPageBytes <= 0 {
		c.MaxPageBytes = DefaultMaxPageBytes
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.EngineLabel == "" {
		c.EngineLabel = DefaultEngineLabel
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	c.MaxBackoff = max(c.MaxBackoff, c.Interval)
	return c
}

// Option configures a Scraper.
type Option func(*Scraper)

// WithClock sets the time source (default signals.SystemClock). The
// scheduling loop still waits on real timers; a virtual-time simulator
// calls Scrape itself instead of Start.
func WithClock(c signals.Clock) Option { return func(s *Scraper) { s.clock = c } }

// WithSeed seeds the jitter's random source (math/rand/v2 PCG). Default 1.
func WithSeed(seed uint64) Option { return func(s *Scraper) { s.seed = seed } }

// WithHTTPClient sets the client used for scrapes. Nil means a client owned
// by the Scraper with dial and header timeouts, whose idle connections Stop
// closes; a caller-supplied client's connections are the caller's.
func WithHTTPClient(c *http.Client) Option { return func(s *Scraper) { s.client = c } }

// WithMeterProvider sets where the scrape metrics are recorded (default: a
// no-op provider).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(s *Scraper) { s.mp = mp } }

// WithLogger sets the logger for health transitions (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Scraper) { s.log = l } }

// Scrape failure reasons, as Error.Reason and as the "reason" attribute of
// the errors counter.
const (
	ReasonEngine      = "engine"       // no metric map for the endpoint's engine
	ReasonRequest     = "request"      // the metrics URL is invalid
	ReasonConnect     = "connect"      // dial, TLS or transport failure
	ReasonTimeout     = "timeout"      // Config.Timeout expired
	ReasonStatus      = "status"       // HTTP status other than 200
	ReasonContentType = "content_type" // an HTML or binary page
	ReasonTooLarge    = "too_large"    // more than Config.MaxPageBytes
	ReasonRead        = "read"         // the body broke off
	ReasonParse       = "parse"        // not the text exposition format
	ReasonCanceled    = "canceled"     // the caller's context ended
)

// Sentinel errors. ErrPageTooLarge, ErrBadStatus and ErrContentType are
// wrapped by Error; ErrUnknownEndpoint and ErrStarted are returned as they
// are.
var (
	// ErrUnknownEndpoint is returned by Scrape for an endpoint that is not
	// in the Scraper's set. (Status reports that case by returning false.)
	ErrUnknownEndpoint = errors.New("scrape: endpoint not in the scraper's set")
	// ErrPageTooLarge: the page exceeded Config.MaxPageBytes.
	ErrPageTooLarge = errors.New("scrape: metrics page too large")
	// ErrBadStatus: the server answered with a status other than 200.
	ErrBadStatus = errors.New("scrape: unexpected HTTP status")
	// ErrContentType: the server answered with HTML or a binary format.
	ErrContentType = errors.New("scrape: unexpected content type")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("scrape: scraper already started")
)

// Error is the error of one failed scrape. It wraps the cause: one of the
// sentinel errors above, a *ParseError, ErrEmptyPage, ErrUnknownEngine, a
// context error or a transport error.
type Error struct {
	// Endpoint is the endpoint's name.
	Endpoint string
	// Reason is one of the Reason constants.
	Reason string
	// StatusCode is the HTTP status when Reason is ReasonStatus.
	StatusCode int
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("scrape %s: %s: %v", e.Endpoint, e.Reason, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Status is the scrape state of one endpoint.
type Status struct {
	// LastAttempt is when the last scrape was sent; zero before the first.
	LastAttempt time.Time
	// LastSuccess is when the last good scrape was sent.
	LastSuccess time.Time
	// LastError is the error of the last scrape, nil if it succeeded.
	LastError error
	// ConsecutiveFailures counts failed scrapes since the last good one.
	ConsecutiveFailures int
	// Scrapes and Failures count every scrape and every failed one.
	Scrapes, Failures uint64
}

// Scraper polls the metrics pages of a set of endpoints and publishes a
// signals.Metrics snapshot on each endpoint after every good scrape.
//
// All methods are safe for concurrent use. A Scraper runs at most once:
// Start, then Stop.
type Scraper struct {
	cfg       Config
	maps      map[string]*compiledMap
	clock     signals.Clock
	seed      uint64
	client    *http.Client
	ownClient bool
	mp        metric.MeterProvider
	log       *slog.Logger
	tel       *telemetry
	sem       *semaphore.Weighted
	wake      chan struct{}

	mu       sync.Mutex
	rng      *rand.Rand
	targets  map[*signals.Endpoint]*target
	leaving  map[*signals.Endpoint]*target // removed while busy
	queue    targetHeap
	deadline time.Time
	started  bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// target is the scrape state of one endpoint.
type target struct {
	ep     *signals.Endpoint
	parser *Parser
	mapErr error
	tel    targetTelemetry

	// Guarded by Scraper.mu.
	next     time.Time
	heapIdx  int
	busy     bool // popped from the queue: a scrape is in flight or about to start
	removed  bool
	status   Status
	lastSent time.Time

	// Guarded by scrapeMu: one scrape of an endpoint at a time.
	scrapeMu    sync.Mutex
	body        bytes.Buffer
	havePrev    bool
	prevHits    float64
	prevQueries float64
	runRaw      string
	runList     []string
	waitRaw     string
	waitList    []string
}

// New returns a Scraper with cfg and opts. It returns an error when a
// configured metric map is invalid. It starts nothing: call SetEndpoints
// and Start.
func New(cfg Config, opts ...Option) (*Scraper, error) {
	s := &Scraper{
		cfg:     cfg.withDefaults(),
		maps:    map[string]*compiledMap{},
		seed:    1,
		targets: map[*signals.Endpoint]*target{},
		leaving: map[*signals.Endpoint]*target{},
		wake:    make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(s)
	}
	for _, e := range BuiltinEngines() {
		m, _ := BuiltinMap(e)
		cm, err := compile(m)
		if err != nil {
			return nil, fmt.Errorf("scrape: built-in map %s: %w", e, err)
		}
		s.maps[e] = cm
	}
	for name, m := range s.cfg.Engines {
		cm, err := compile(m)
		if err != nil {
			return nil, fmt.Errorf("scrape: engine %q: %w", name, err)
		}
		s.maps[strings.ToLower(name)] = cm
	}
	if s.clock == nil {
		s.clock = signals.SystemClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.client == nil {
		s.client = defaultClient(s.cfg.Timeout)
		s.ownClient = true
	}
	if s.mp == nil {
		s.mp = noop.NewMeterProvider()
	}
	s.rng = rand.New(rand.NewPCG(s.seed, s.seed^0x9e3779b97f4a7c15))
	s.sem = semaphore.NewWeighted(int64(s.cfg.Concurrency))
	tel, err := newTelemetry(s.mp, s.observeAges)
	if err != nil {
		return nil, err
	}
	s.tel = tel
	return s, nil
}

func defaultClient(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		// Raw reads and writes on Linux (internal/rawio): a scrape of an
		// idle gateway is its first system call after a gap, which would
		// wake the runtime's sysmon into polling.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return rawio.Wrap(c), nil
		},
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// SetEndpoints replaces the set of endpoints to scrape. Endpoints are
// identified by pointer: one already in the set keeps its state (previous
// counters, failure count), a new one is first scraped within one interval
// (at a random offset), and one no longer listed is dropped (a scrape of it
// in flight completes but is not rescheduled). One listed again while a
// scrape of it is still in flight is not new: it keeps its state and is
// rescheduled when that scrape completes, so that an endpoint is never
// scraped twice at once. eps is not retained; nil entries are ignored. It
// never blocks on I/O.
func (s *Scraper) SetEndpoints(eps []*signals.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	keep := make(map[*signals.Endpoint]bool, len(eps))
	for _, ep := range eps {
		if ep == nil || keep[ep] {
			continue
		}
		keep[ep] = true
		if _, ok := s.targets[ep]; ok {
			continue
		}
		if t := s.leaving[ep]; t != nil {
			t.removed = false
			delete(s.leaving, ep)
			s.targets[ep] = t
			continue
		}
		t := s.newTarget(ep)
		t.next = now.Add(time.Duration(s.rng.Float64() * float64(s.cfg.Interval)))
		s.targets[ep] = t
		heap.Push(&s.queue, t)
	}
	for ep, t := range s.targets {
		if keep[ep] {
			continue
		}
		t.removed = true
		if t.heapIdx >= 0 {
			heap.Remove(&s.queue, t.heapIdx)
		} else if t.busy {
			s.leaving[ep] = t
		}
		delete(s.targets, ep)
	}
	s.poke()
}

func (s *Scraper) newTarget(ep *signals.Endpoint) *target {
	t := &target{ep: ep, heapIdx: -1, tel: s.tel.forEndpoint(ep.Name)}
	engine := ep.Engine
	if engine == "" && s.cfg.EngineLabel != "-" {
		engine = ep.Labels[s.cfg.EngineLabel]
	}
	engine = strings.ToLower(engine)
	if engine == "" {
		engine = EngineVLLM
	}
	if cm, ok := s.maps[engine]; ok {
		t.parser = newParser(cm)
	} else {
		t.mapErr = fmt.Errorf("%w %q", ErrUnknownEngine, engine)
	}
	return t
}

// Endpoints returns the endpoints in the set, in no particular order. The
// slice is the caller's.
func (s *Scraper) Endpoints() []*signals.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*signals.Endpoint, 0, len(s.targets))
	for ep := range s.targets {
		out = append(out, ep)
	}
	return out
}

// Status returns the scrape state of ep, or false when ep is not in the set.
func (s *Scraper) Status(ep *signals.Endpoint) (Status, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.targets[ep]
	if !ok {
		return Status{}, false
	}
	return t.status, true
}

// Start starts the scheduling loop in a new goroutine and returns at once.
// The loop runs until ctx ends or Stop is called. It returns ErrStarted if
// the Scraper was started before.
func (s *Scraper) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return ErrStarted
	}
	s.started = true
	ctx, s.cancel = context.WithCancel(ctx)
	s.wg.Add(1)
	go s.loop(ctx)
	return nil
}

// Stop stops the loop and blocks until every goroutine the Scraper started
// has returned (scrapes in flight are cancelled). It also unregisters the
// snapshot-age callback and closes the idle connections of the Scraper's own
// HTTP client. It is idempotent and may be called without Start.
func (s *Scraper) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.started = true // a stopped Scraper cannot be started
		cancel := s.cancel
		s.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		s.wg.Wait()
		s.tel.close()
		if s.ownClient {
			s.client.CloseIdleConnections()
		}
	})
}

func (s *Scraper) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loop is the one scheduling goroutine: it pops the endpoints that are due,
// starts a scrape for each within the concurrency bound, and sleeps until the
// next one is due or the set changes.
func (s *Scraper) loop(ctx context.Context) {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*target
	for {
		due = s.popDue(due[:0])
		for i, t := range due {
			if err := s.sem.Acquire(ctx, 1); err != nil {
				clear(due[i:])
				return
			}
			s.wg.Add(1)
			go s.run(ctx, t)
		}
		clear(due)
		s.mu.Lock()
		now := s.clock.Now()
		wait := time.Hour
		if len(s.queue) > 0 {
			wait = max(s.queue[0].next.Sub(now), 0)
		}
		s.deadline = now.Add(wait)
		s.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.wake:
		}
	}
}

func (s *Scraper) popDue(due []*target) []*target {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	for len(s.queue) > 0 && !s.queue[0].next.After(now) {
		t := heap.Pop(&s.queue).(*target)
		t.busy = true
		due = append(due, t)
	}
	return due
}

func (s *Scraper) run(ctx context.Context, t *target) {
	defer s.wg.Done()
	defer s.sem.Release(1)
	_ = s.scrape(ctx, t)
	s.mu.Lock()
	defer s.mu.Unlock()
	t.busy = false
	if t.removed {
		delete(s.leaving, t.ep)
		return
	}
	if ctx.Err() != nil {
		return
	}
	t.next = s.nextScrape(t.lastSent, t.status.ConsecutiveFailures)
	if now := s.clock.Now(); t.next.Before(now) {
		t.next = now
	}
	heap.Push(&s.queue, t)
	if t.next.Before(s.deadline) {
		s.poke()
	}
}

// nextScrape returns when an endpoint scraped at sent with the given number
// of consecutive failures is due again: one interval later, or
// interval × 2^failures (at most MaxBackoff) while it fails, jittered by
// ±Jitter. Called with s.mu held.
func (s *Scraper) nextScrape(sent time.Time, failures int) time.Time {
	d := s.cfg.Interval
	if failures > 0 {
		// Doubled while below the cap, never shifted past it: a shift
		// by the failure count overflows and wraps around for long
		// intervals (2^34 ns << 30 is 2^64).
		for i := 0; i < failures && d < s.cfg.MaxBackoff; i++ {
			if d > s.cfg.MaxBackoff/2 {
				d = s.cfg.MaxBackoff
			} else {
				d *= 2
			}
		}
		d = min(d, s.cfg.MaxBackoff)
	}
	if s.cfg.Jitter > 0 {
		d += time.Duration(float64(d) * s.cfg.Jitter * (2*s.rng.Float64() - 1))
	}
	return sent.Add(d)
}

// Scrape scrapes ep once, now, and publishes the result as the loop would:
// the new snapshot on success, the failure count and health either way. It
// blocks for at most Config.Timeout (or until ctx ends) and waits for a
// scrape of the same endpoint in flight. It returns ErrUnknownEndpoint when
// ep is not in the set, and otherwise nil or an *Error.
func (s *Scraper) Scrape(ctx context.Context, ep *signals.Endpoint) error {
	s.mu.Lock()
	t, ok := s.targets[ep]
	s.mu.Unlock()
	if !ok {
		return ErrUnknownEndpoint
	}
	return s.scrape(ctx, t)
}

func (s *Scraper) scrape(ctx context.Context, t *target) error {
	t.scrapeMu.Lock()
	defer t.scrapeMu.Unlock()

	baseline := t.ep.Counters()
	mark := t.ep.HealthMark()
	sent := s.clock.Now()
	page, err := s.fetch(ctx, t)
	if err != nil && ctx.Err() != nil {
		// The caller gave up (Stop, or its own context): that says nothing
		// about the endpoint, so neither its health nor its state changes.
		return err
	}
	if err == nil {
		t.ep.SetMetrics(t.snapshot(page, sent, baseline))
	}
	t.ep.ReportScrape(mark, err, s.cfg.FailureThreshold)
	took := s.clock.Now().Sub(sent)

	s.mu.Lock()
	st := &t.status
	st.LastAttempt, st.LastError = sent, err
	st.Scrapes++
	t.lastSent = sent
	failures := 0
	if err == nil {
		failures, st.ConsecutiveFailures = st.ConsecutiveFailures, 0
		st.LastSuccess = sent
	} else {
		st.Failures++
		st.ConsecutiveFailures++
	}
	n := st.ConsecutiveFailures
	s.mu.Unlock()

	switch {
	case err == nil && failures >= s.cfg.FailureThreshold:
		s.log.Info("scrape: endpoint recovered", "endpoint", t.ep.Name, "after_failures", failures)
	case err != nil && n == s.cfg.FailureThreshold:
		s.log.Warn("scrape: endpoint marked unhealthy", "endpoint", t.ep.Name, "failures", n, "err", err)
	}
	s.tel.record(ctx, t.tel, took, err)
	return err
}

// fetch sends one scrape request and parses the page.
func (s *Scraper) fetch(ctx context.Context, t *target) (Page, error) {
	fail := func(reason string, err error) (Page, error) {
		return Page{}, &Error{Endpoint: t.ep.Name, Reason: reason, Err: err}
	}
	if t.mapErr != nil {
		return fail(ReasonEngine, t.mapErr)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.ep.MetricsAddress(), nil)
	if err != nil {
		return fail(ReasonRequest, err)
	}
	// Ask for the text format: the parser reads version 0.0.4.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.client.Do(req)
	if err != nil {
		return fail(errReason(ctx, err, ReasonConnect), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Page{}, &Error{Endpoint: t.ep.Name, Reason: ReasonStatus, StatusCode: resp.StatusCode,
			Err: fmt.Errorf("%w %d", ErrBadStatus, resp.StatusCode)}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		if mt == "text/html" || strings.HasPrefix(mt, "application/vnd.google.protobuf") || mt == "application/json" {
			return fail(ReasonContentType, fmt.Errorf("%w %q", ErrContentType, ct))
		}
	}
	limit := s.cfg.MaxPageBytes
	if resp.ContentLength > limit {
		return fail(ReasonTooLarge, fmt.Errorf("%w: Content-Length %d > %d bytes", ErrPageTooLarge, resp.ContentLength, limit))
	}
	t.body.Reset()
	// Read one byte past the cap to tell a page of exactly limit bytes from
	// a larger one; a cap of math.MaxInt64 cannot be exceeded.
	if _, err := t.body.ReadFrom(io.LimitReader(resp.Body, min(limit, math.MaxInt64-1)+1)); err != nil {
		return fail(errReason(ctx, err, ReasonRead), err)
	}
	if int64(t.body.Len()) > limit {
		t.body = bytes.Buffer{} // do not keep a buffer grown by an outlier
		return fail(ReasonTooLarge, fmt.Errorf("%w: more than %d bytes", ErrPageTooLarge, limit))
	}
	page, err := t.parser.Parse(t.body.Bytes())
	if c := t.body.Cap(); c > 1<<20 && c > 4*t.body.Len() {
		t.body = bytes.Buffer{}
	}
	if err != nil {
		return fail(ReasonParse, err)
	}
	return page, nil
}

// errReason classifies a transport error: a timeout (ours or the
// transport's), a cancellation by the caller, or otherwise.
func errReason(ctx context.Context, err error, otherwise string) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ReasonTimeout
	case ctx.Err() != nil:
		return ReasonCanceled
	}
	return otherwise
}

// snapshot turns a parsed page into the Metrics published on the endpoint,
// and advances the counter state: the prefix-cache hit rate is Δhits /
// Δqueries since the previous good scrape (the scraper's form of PromQL's
// rate(hits)/rate(queries), vLLM docs/design/metrics.md); a counter that went
// down is a reset, counted from zero as Prometheus's rate() does, and marks
// the endpoint restarted.
func (t *target) snapshot(pg Page, sent time.Time, baseline signals.Counters) *signals.Metrics {
	m := &signals.Metrics{
		ScrapedAt:          sent,
		Baseline:           baseline,
		Running:            nonNegative(pg.Running),
		Waiting:            nonNegative(pg.Waiting),
		KVCacheUtilization: unitInterval(pg.KVCacheUtilization),
		BlockSize:          pg.BlockSize,
		NumBlocks:          pg.NumBlocks,
	}
	h, q := pg.PrefixCacheHits, pg.PrefixCacheQueries
	if h.Known && q.Known && h.Value >= 0 && q.Value >= 0 {
		if t.havePrev {
			dh, dq := h.Value-t.prevHits, q.Value-t.prevQueries
			if dh < 0 || dq < 0 {
				t.ep.MarkRestarted()
				dh, dq = h.Value, q.Value
			}
			if dq > 0 {
				m.PrefixCacheHitRate = unitInterval(signals.Known(dh / dq))
			}
		}
		t.havePrev, t.prevHits, t.prevQueries = true, h.Value, q.Value
	} else {
		t.havePrev = false
	}
	if !m.PrefixCacheHitRate.Known {
		// A negative gauge means prefix caching is off (vLLM V0 reports -1).
		m.PrefixCacheHitRate = unitInterval(pg.PrefixCacheHitRate)
	}
	if pg.LoRAKnown {
		m.LoRAKnown = true
		m.MaxLoRA = pg.MaxLoRA
		m.RunningAdapters = adapters(&t.runRaw, &t.runList, pg.RunningAdapters)
		m.WaitingAdapters = adapters(&t.waitRaw, &t.waitList, pg.WaitingAdapters)
	}
	return m
}

// nonNegative returns r, or unknown when it is negative (a count cannot be).
func nonNegative(r signals.Reading) signals.Reading {
	if !r.Known || r.Value < 0 {
		return signals.Reading{}
	}
	return r
}

// unitInterval returns r clamped to at most 1, or unknown when negative.
func unitInterval(r signals.Reading) signals.Reading {
	if !r.Known || r.Value < 0 {
		return signals.Reading{}
	}
	r.Value = min(r.Value, 1)
	return r
}

// adapters splits a comma-separated adapter list, reusing the previous
// slice when the list did not change (published snapshots share it and
// never modify it).
func adapters(prevRaw *string, prevList *[]string, raw string) []string {
	if raw == *prevRaw && (*prevList != nil || raw == "") {
		return *prevList
	}
	var list []string
	for a := range strings.SplitSeq(raw, ",") {
		if a = strings.TrimSpace(a); a != "" {
			list = append(list, a)
		}
	}
	*prevRaw, *prevList = raw, list
	return list
}

// targetHeap orders targets by their next scrape time.
type targetHeap []*target

func (h targetHeap) Len() int           { return len(h) }
func (h targetHeap) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h targetHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

func (h *targetHeap) Push(x any) {
	t := x.(*target)
	t.heapIdx = len(*h)
	*h = append(*h, t)
}

func (h *targetHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.heapIdx = -1
	return t
}
