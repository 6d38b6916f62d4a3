package router

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferroute/inferroute/internal/canon"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Defaults of Config.
const (
	// DefaultMaxBodyBytes is the request body limit: 4 MiB.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxRetries is how many fallbacks a request may be retried on.
	DefaultMaxRetries = 2
	// DefaultRetryAfter is the Retry-After of a shed (429) request.
	DefaultRetryAfter = time.Second
	// DefaultMaxResponseBuffer bounds the non-streaming JSON response that is
	// held to read its usage and rewrite its model: 8 MiB.
	DefaultMaxResponseBuffer = 8 << 20
)

// HeaderDestination is the Gateway API Inference Extension's header naming
// the endpoint chosen for a request (its endpoint picker protocol). A client
// must not choose its upstream, so the Proxy and the Middleware always strip
// it from incoming requests; the Middleware can set it for the next hop.
const HeaderDestination = "x-gateway-destination-endpoint"

// Config tunes a Proxy or a Middleware. The zero value of every field means
// its default.
type Config struct {
	// Transport sends upstream requests; nil means the built-in HTTP/1.1
	// client: plain TCP, a keep-alive pool of DefaultMaxIdleConnsPerHost
	// connections per endpoint closed after DefaultIdleConnTimeout idle,
	// requests written and responses read by the handler's goroutine. Set
	// it (NewTransport is a tuned http.Transport) for a custom dialer,
	// HTTP/2, or, with UpstreamScheme "https", the TLS settings of the
	// endpoints (a private CA, client certificates, a server name).
	Transport http.RoundTripper
	// UpstreamScheme is the scheme of upstream requests: "http" (the
	// default; "" means it) or "https". Any other value is an error. With
	// "https" and a nil Transport the Proxy sends through NewTransport,
	// which verifies each endpoint's certificate against the system roots
	// for the host of its address; the built-in client speaks only plain
	// HTTP/1.1.
	UpstreamScheme string
	// Clock measures TTFT and latency; nil means the system clock.
	Clock signals.Clock
	// Hasher renders and hashes prompts for the prefix index; nil means
	// prefix.NewHasher with its defaults. Use the same Hasher configuration
	// everywhere the index is fed.
	Hasher *prefix.Hasher
	// Parse tunes which headers carry the session key and priority.
	Parse ParseOptions
	// MaxBodyBytes is the request body limit; a larger body is answered
	// 413. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxRetries bounds the fallback endpoints tried after a connect error,
	// a malformed response (ErrUpstreamProtocol), a 5xx status or a 429,
	// before any response byte reached the client. 0 means
	// DefaultMaxRetries; negative means no retry. The picker's Config
	// Fallbacks bounds it too. When every endpoint tried failed to connect,
	// the picker is asked once more, now that health reflects the failures,
	// and its choice gets one more attempt: at most MaxRetries+2 attempts
	// in all, and just one when MaxRetries is negative.
	MaxRetries int
	// UpstreamTimeout bounds the wait for an endpoint's response headers
	// (prefill of a non-streaming request included); when it expires the
	// client gets 504. 0 means no limit.
	UpstreamTimeout time.Duration
	// StreamIdleTimeout bounds the wait for each line of an SSE stream
	// once its headers came: a stream that sends nothing for this long (a
	// model server whose engine hung behind a live HTTP server) is cut, the
	// client gets the stream's error event and Done ErrStreamIdle (wrapped
	// in ErrStreamBroken). The first token may come long after the
	// headers when the server queues the request, so set it above the
	// longest queueing expected. 0 means no limit.
	StreamIdleTimeout time.Duration
	// StripHeaders are more client headers removed before picking and
	// forwarding, in addition to the hop-by-hop headers and
	// HeaderDestination: for example the subset filter's header, if only
	// the gateway may set it.
	StripHeaders []string
	// EndpointHeader, when not "", is set on the upstream request (Proxy)
	// or the incoming request handed to the next handler (Middleware) to the
	// chosen endpoint's address; HeaderDestination is the usual name.
	EndpointHeader string
	// RetryAfter is the Retry-After sent with 429; 0 means DefaultRetryAfter.
	RetryAfter time.Duration
	// MaxResponseBuffer bounds the non-streaming JSON response held to
	// read its usage and rewrite its model, and each line of an SSE stream
	// held to do the same; a longer one is streamed through unchanged. 0
	// means DefaultMaxResponseBuffer.
	MaxResponseBuffer int64
	// Logger receives warnings about upstream failures and debug lines per
	// request; nil means discard.
	Logger *slog.Logger
	// MeterProvider records the router's metrics (requests by pool, model
	// and status; request duration; TTFT; retries); nil means none.
	MeterProvider metric.MeterProvider
	// RequestID, when not nil, makes the x-request-id of each request
	// that came without one (NewRequestID is a generator): the upstream
	// request carries it (vLLM takes it as its own request id, in its
	// logs), and so do signals.Request.ID and the access log. The
	// response then carries the request's id, made or the client's, in
	// X-Request-Id, as OpenAI's API returns one with every response
	// (its SDKs expose it), unless the model server's response has its
	// own. The Middleware hands its next handler the request with it. An
	// id that is empty or not a valid header value is not used.
	RequestID func() string
	// AccessLog, when not nil, receives one line per request the Proxy
	// answers, at Info level, when it has been answered: "request" with
	// method, path, status, duration and, when known, the client's
	// address, x-request-id, model, pool, the endpoint that answered
	// (or was tried last) and the attempts made, stream, ttft, the token
	// usage the response reported, and the error (duration and ttft as
	// time.Duration attributes: nanoseconds in slog's JSON handler). A
	// client that went away is status 499. The line is built only when the logger is
	// enabled for Info, so a logger switched off costs one call; on, a
	// line costs about 3 µs through slog's JSON handler
	// (BenchmarkProxy/1KB-accesslog against /1KB). The Middleware writes
	// the same line once its next handler has returned: the status, ttft
	// and error it saw of the response, the attempts counted by
	// Decision.Retry, the last one's endpoint, and the usage the next
	// handler reported for that attempt through its Done.
	AccessLog *slog.Logger
	// TracerProvider, when not nil, records a server span per request
	// (named "POST /v1/chat/completions" and so on; a path outside
	// OpenAI's API by its method alone): a child of the trace context
	// the request carries (Propagator), with the model, pool, endpoint,
	// attempts, status, TTFT and token usage as attributes (OpenTelemetry's
	// HTTP and gen_ai conventions where they have names), an error status
	// for a 5xx or a response that broke off. The picker's span
	// (picker.WithTracerProvider) is its child, and the upstream request
	// carries the span's context in place of the client's, so that a
	// model server that traces continues the trace. The Middleware does
	// the same around its next handler, whose request carries the span
	// in its context and header. nil records none, at the cost of one
	// nil check per request; with the OpenTelemetry SDK sampling every
	// request a span costs about 3.4 µs and 17 allocations before its
	// exporter's work (BenchmarkProxy/1KB-traced against /1KB).
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context of incoming requests and writes
	// it into upstream ones, with TracerProvider; nil means W3C Trace
	// Context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
	// Allow, when not nil, decides whether r may take route: it is
	// called once the route is known and before anything is picked or
	// sent, and a non-nil error refuses the request. An *APIError is
	// sent as it is; an error wrapping ErrModelNotFound is the 404
	// model_not_found of a model that does not exist, which OpenAI also
	// gives a key without access to a model, so that a client cannot
	// tell the two apart; any other error is a 403 permission_denied
	// with its message. Listings ask it too: GET /v1/models lists only
	// the names whose route r is allowed, and /v1/models/{model} of
	// another is 404 as if unknown. It is for per-client model grants
	// (r's context carries whatever the server's authentication put
	// there); nil allows every route. It must be safe for concurrent use
	// and fast: it runs on every request, and for a listing once per
	// name of the table.
	Allow func(r *http.Request, route Route) error
	// Completed, when not nil, is called once for each request the Proxy
	// or Middleware answered other than a listing, when it has been
	// answered (refused ones included), with what the access log says
	// of it: for accounting per client, such as tokens used per API key
	// (r's context carries what the server's authentication put there).
	// It runs on the request's goroutine before ServeHTTP returns, so it
	// should be quick.
	Completed func(r *http.Request, c Completion)
}

// Completion is what a Proxy or Middleware knows of a request it has
// answered (Config.Completed).
type Completion struct {
	// Route is the request's route; its Pool is nil when the request was
	// refused before it was routed (a malformed body, an unknown model),
	// set when it was refused after (by Config.Allow, or shed).
	Route Route
	// Status is the status answered, 499 when the client went away.
	Status int
	// Duration runs from the request's arrival to its end, TTFT to the
	// answer's first byte (0 when none came, or it was an error's).
	Duration, TTFT time.Duration
	// Endpoint is the endpoint that answered or was tried last, nil when
	// none was; Attempts counts the upstream attempts made.
	Endpoint *signals.Endpoint
	Attempts int
	// PromptTokens, CachedTokens and CompletionTokens are the usage the
	// response reported, 0 when it reported none (a stream without
	// stream_options.include_usage, an error).
	PromptTokens, CachedTokens, CompletionTokens int
	// Err is why the request was refused or failed; nil when it was
	// served.
	Err error
}

// NewTransport returns a net/http transport for Config.Transport: keep-alive
// pools sized for a gateway that sends many concurrent requests to a few
// hosts (MaxIdleConnsPerHost at least the connections in flight, or every
// request opens one), idle connections closed after DefaultIdleConnTimeout
// (below the model servers' keep-alive, so that a request is rarely sent on
// a connection the server is closing: net/http does not resend a POST that
// failed there), HTTP/1.1 only, no proxy from the environment, and no
// transparent compression (prompts and streams pass as they are).
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       DefaultIdleConnTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        32 << 10,
	}
}

// Proxy is an OpenAI-compatible reverse proxy: it reads the model from the
// request body, routes it through a Table to a pool, asks the pool's picker
// for an endpoint, and forwards the request, streaming SSE responses with a
// flush per event. See the package documentation for the behaviour on
// errors and retries.
//
// A Proxy is safe for concurrent use. ServeHTTP blocks for the duration of
// the upstream exchange.
type Proxy struct {
	cfg       Config
	transport http.RoundTripper // nil when h1 is used
	h1        *h1Client
	scheme    string // of upstream URLs: "http" or "https"
	endpointH string // canonical Config.EndpointHeader
	clock     signals.Clock
	hasher    *prefix.Hasher
	log       *slog.Logger
	strip     []string
	retries   int
	inst      instruments
	tr        tracing
	// via is the Via field value the Proxy adds to upstream requests
	// ("1.1 inferroute-" and 8 random hex digits, RFC 9110 section
	// 7.6.3's received-protocol and a pseudonym), viaName its pseudonym,
	// which an incoming Via holds when the request looped back.
	via     []string
	viaName string

	table   atomic.Pointer[Table]
	calls   sync.Pool
	prompts sync.Pool // *prefix.Prompt of hasher, held only during admit
}

// NewProxy returns a Proxy routing with t. It fails only when t is nil,
// cfg.UpstreamScheme is neither "http" nor "https", or the metric
// instruments cannot be created.
func NewProxy(t *Table, cfg Config) (*Proxy, error) {
	if t == nil {
		return nil, errors.New("router: nil table")
	}
	cfg.Parse = cfg.Parse.Canonical()
	p := &Proxy{cfg: cfg, transport: cfg.Transport, clock: cfg.Clock, hasher: cfg.Hasher, log: cfg.Logger}
	switch cfg.UpstreamScheme {
	case "", "http":
		p.scheme = "http"
	case "https":
		p.scheme = "https"
		if p.transport == nil {
			p.transport = NewTransport()
		}
	default:
		return nil, fmt.Errorf("router: upstream scheme %q: want \"http\" or \"https\"", cfg.UpstreamScheme)
	}
	if p.transport == nil {
		p.h1 = newH1Client()
	}
	if cfg.EndpointHeader != "" {
		p.endpointH = http.CanonicalHeaderKey(cfg.EndpointHeader)
	}
	if p.clock == nil {
		p.clock = signals.SystemClock{}
	}
	if p.hasher == nil {
		p.hasher = prefix.NewHasher(prefix.HashConfig{})
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.cfg.MaxBodyBytes <= 0 {
		p.cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if p.cfg.RetryAfter <= 0 {
		p.cfg.RetryAfter = DefaultRetryAfter
	}
	if p.cfg.MaxResponseBuffer <= 0 {
		p.cfg.MaxResponseBuffer = DefaultMaxResponseBuffer
	}
	switch {
	case cfg.MaxRetries == 0:
		p.retries = DefaultMaxRetries
	case cfg.MaxRetries < 0:
		p.retries = 0
	default:
		p.retries = min(cfg.MaxRetries, picker.MaxFallbacks)
	}
	p.strip = append(p.strip, http.CanonicalHeaderKey(HeaderDestination))
	for _, h := range cfg.StripHeaders {
		p.strip = append(p.strip, http.CanonicalHeaderKey(h))
	}
	if err := p.inst.init(cfg.MeterProvider); err != nil {
		return nil, err
	}
	p.tr = newTracing(cfg)
	p.viaName = "inferroute-" + NewRequestID()[:8]
	p.via = []string{"1.1 " + p.viaName}
	p.table.Store(t)
	p.calls.New = func() any { return new(call) }
	p.prompts.New = func() any { return p.hasher.NewPrompt() }
	return p, nil
}

// SetTable swaps the routing table atomically; requests in flight finish
// with the table they started with.
func (p *Proxy) SetTable(t *Table) {
	if t != nil {
		p.table.Store(t)
	}
}

// Table returns the current routing table.
func (p *Proxy) Table() *Table { return p.table.Load() }

// call is the per-request scratch space, pooled. Its signals.Request is
// handed to the picker and must not be reused before Done.
type call struct {
	body []byte
	send []byte // body as sent upstream (body, or a rewritten copy)
	req  signals.Request
	hdr  http.Header
	// decoded: the body came gzip-coded and c.body is its decoded bytes
	// (decodeBody).
	decoded bool
	parsed  Parsed
	route   Route
	start   time.Time

	targets [picker.MaxFallbacks + 1]*signals.Endpoint
	br      *bufio.Reader
	line    []byte
	out     []byte
	rbuf    []byte
	cancel  context.CancelCauseFunc
	fb      firstByte
	h1req   h1Request
	pick    picker.Result // the pick being forwarded, for FirstToken
	again   picker.Result // a retry's: a fallback's assignment, or the second pick when every ranked target failed
	// buffered: the response body came whole, not as an SSE stream, so
	// its first byte (the TTFT measured) followed its last token.
	buffered bool
	// noToken: the SSE stream's first data event was an error, so its
	// first byte was no token's and the outcome has no TTFT.
	noToken bool
	// open counts the request bodies handed to Config.Transport that it has
	// not closed yet (see sentBody): they read send, so the call is not
	// reused while any is open.
	open atomic.Int32

	// For the access log: the endpoint that answered or was tried last,
	// the upstream attempts made, and the outcome of the one answered.
	ep       *signals.Endpoint
	attempts int
	outcome  signals.Outcome
}

// noCancel is the cancel of an attempt that made no context of its own.
func noCancel(error) {}

func (p *Proxy) getCall() *call { return p.calls.Get().(*call) }

func (p *Proxy) putCall(c *call) {
	const outsized = 4 * DefaultMaxBodyBytes
	if cap(c.body) > outsized || cap(c.rbuf) > outsized || cap(c.line) > outsized || cap(c.out) > outsized {
		return // do not keep outsized buffers
	}
	if c.open.Load() != 0 {
		return // a Config.Transport still reads the request body
	}
	blocks := c.req.PromptBlocks[:0]
	body, line, out, rbuf, br := c.body[:0], c.line[:0], c.out[:0], c.rbuf[:0], c.br
	var hdr http.Header
	if p.h1 != nil && len(c.hdr) <= 64 {
		// The built-in client wrote the headers before returning the
		// response, and Done has run: nothing holds the map any more. A
		// Config.Transport may still be writing the request after it
		// returned (net/http.Transport does, on an early response), so
		// its map is never reused.
		hdr = c.hdr
	}
	*c = call{body: body, line: line, out: out, rbuf: rbuf, br: br, hdr: hdr}
	c.req.PromptBlocks = blocks
	p.calls.Put(c)
}

// ServeHTTP implements http.Handler. It answers GET /v1/models and
// /v1/models/{model} from the table and proxies everything else: see the
// package documentation.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var span trace.Span
	if p.tr.tracer != nil {
		r, span = p.tr.start(r)
	}
	if p.serveListing(w, r, span) {
		return
	}
	c := p.getCall()
	defer p.putCall(c)
	c.start = p.clock.Now()
	res, err := p.admit(r, c)
	if p.cfg.RequestID != nil {
		p.echoRequestID(w, c.hdr)
	}
	if err != nil {
		status := p.refuse(w, r, c, span, err)
		p.log.LogAttrs(r.Context(), slog.LevelDebug, "request rejected", slog.Int("status", status),
			slog.String("error", err.Error()))
		return
	}
	if span != nil {
		p.tr.inject(r.Context(), c.hdr)
	}
	status, ttft, aborted := p.forward(w, r, c, res)
	p.report(r, c, span, status, p.clock.Now().Sub(c.start), ttft, aborted, nil)
	if aborted {
		// The body broke off after bytes were sent and the format has no
		// in-band error: abort the connection so the client sees a failed
		// response rather than a silently truncated one.
		panic(http.ErrAbortHandler)
	}
}

// refuse answers r, which admit refused with err, in OpenAI's error shape
// and records its end (report); it returns the status sent.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, c *call, span trace.Span, err error) int {
	ae := errorFor(err, p.cfg.RetryAfter)
	WriteError(w, ae)
	p.report(r, c, span, ae.Status, p.clock.Now().Sub(c.start), 0, false, err)
	return ae.Status
}

// report records the end of a request that admit saw, answered with
// status after d: its metrics, its access log line and its span, when
// not nil. err is why it was refused or failed, when the outcome in c
// does not say.
func (p *Proxy) report(r *http.Request, c *call, span trace.Span, status int, d, ttft time.Duration, aborted bool, err error) {
	p.inst.request(r.Context(), c, status, d, ttft)
	if p.cfg.AccessLog != nil {
		p.logAccess(r, c, status, d, ttft, err)
	}
	if p.cfg.Completed != nil {
		o := &c.outcome
		why := err
		if why == nil {
			why = o.Err
		}
		p.cfg.Completed(r, Completion{Route: c.route, Status: status, Duration: d, TTFT: ttft,
			Endpoint: c.ep, Attempts: c.attempts, PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens,
			CompletionTokens: o.CompletionTokens, Err: why})
	}
	if span != nil {
		p.tr.finish(span, c, status, ttft, aborted, err)
	}
}

// serveListing answers r from the table when it is a listing (GET or
// HEAD of /v1/models or /v1/models/{model}), logs it and ends span, its
// span when not nil, and reports whether it did.
func (p *Proxy) serveListing(w http.ResponseWriter, r *http.Request, span trace.Span) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	var start time.Time
	if p.cfg.AccessLog != nil {
		start = p.clock.Now()
	}
	status := p.serveModels(w, r)
	if status == 0 {
		return false
	}
	if p.cfg.AccessLog != nil {
		p.logAccess(r, nil, status, p.clock.Now().Sub(start), 0, nil)
	}
	if span != nil {
		p.tr.finish(span, nil, status, 0, false, nil)
	}
	return true
}

// logAccess writes the access log line of a request answered with status
// after d; c is nil for a listing answered from the table, and err the
// reason a request was refused before it was sent.
func (p *Proxy) logAccess(r *http.Request, c *call, status int, d, ttft time.Duration, err error) {
	ctx := r.Context()
	l := p.cfg.AccessLog
	if !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String("method", clip(r.Method)), slog.String("path", clip(r.URL.Path)),
		slog.Int("status", status), slog.Duration("duration", d))
	if r.RemoteAddr != "" {
		attrs = append(attrs, slog.String("client", r.RemoteAddr))
	}
	if c != nil {
		if c.parsed.RequestID != "" {
			attrs = append(attrs, slog.String("request_id", clip(c.parsed.RequestID)))
		}
		if c.parsed.Model != "" {
			attrs = append(attrs, slog.String("model", clip(c.parsed.Model)))
		}
		if c.route.Pool != nil {
			attrs = append(attrs, slog.String("pool", c.route.Pool.Name))
		}
		if c.ep != nil {
			attrs = append(attrs, slog.String("endpoint", c.ep.Name), slog.Int("attempts", c.attempts),
				slog.Bool("stream", c.parsed.Stream))
		}
		if ttft > 0 {
			attrs = append(attrs, slog.Duration("ttft", ttft))
		}
		if o := &c.outcome; o.PromptTokens > 0 || o.CompletionTokens > 0 {
			attrs = append(attrs, slog.Int("prompt_tokens", o.PromptTokens),
				slog.Int("cached_tokens", o.CachedTokens), slog.Int("completion_tokens", o.CompletionTokens))
		}
		if err == nil {
			err = c.outcome.Err
		}
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", clip(err.Error())))
	}
	l.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
}

// echoRequestID sets the response's X-Request-Id to the request's, in
// hdr, the upstream request's header, if it has one (Config.RequestID);
// a model server's response that has its own replaces it.
func (p *Proxy) echoRequestID(w http.ResponseWriter, hdr http.Header) {
	if id := canon.Get(hdr, canonicalRequestID); id != "" {
		w.Header()[canonicalRequestID] = []string{id}
	}
}

// newRequestID is Config.RequestID's next id, or "" when that is empty or
// not a valid header value: a generator's id is checked as a client's is,
// since one with a control character would split the upstream request's
// head.
func (p *Proxy) newRequestID() string {
	if id := p.cfg.RequestID(); id != "" && validFieldValue(id) {
		return id
	}
	return ""
}

// NewRequestID returns a new request id for Config.RequestID: 32 hex
// digits, 128 random bits from math/rand/v2's runtime source, the form of
// the ids vLLM makes (a UUID4's hex). It is unique with overwhelming
// probability, not unguessable: it names a request, it grants nothing.
func NewRequestID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// maxLogValue bounds each value of an access log line that the client
// chose (the model name can be as long as the body limit): the line of a
// hostile request stays short.
const maxLogValue = 512

// clip cuts s to maxLogValue bytes, marking the cut with "…".
func clip(s string) string {
	if len(s) <= maxLogValue {
		return s
	}
	return s[:maxLogValue] + "…"
}

// serveModels answers a GET or HEAD of /v1/models with the table's list
// of models, and of /v1/models/{model} (OpenAI's retrieve-model call, which
// the model servers cannot answer for the table's aliases) with the
// model's entry, or 404 model_not_found. It returns the status it
// answered with, or 0 when the path was none of those.
func (p *Proxy) serveModels(w http.ResponseWriter, r *http.Request) int {
	path := strings.TrimRight(r.URL.Path, "/")
	model, one := strings.CutPrefix(path, "/v1/models/")
	if !one && path != "/v1/models" {
		return 0
	}
	if p.cfg.RequestID != nil {
		// A listing answered from the table has its id too.
		id := canon.Get(r.Header, canonicalRequestID)
		if id == "" {
			id = p.newRequestID()
		}
		if id != "" {
			w.Header()[canonicalRequestID] = []string{id}
		}
	}
	t := p.table.Load()
	var b []byte
	if !one {
		b = t.ModelsJSON()
		if p.cfg.Allow != nil {
			b = t.modelsAllowed(func(rt Route) bool { return p.cfg.Allow(r, rt) == nil })
		}
	} else {
		var ok bool
		if b, ok = t.ModelJSON(model); ok && p.cfg.Allow != nil {
			rt, _ := t.Lookup(model)
			ok = p.cfg.Allow(r, rt) == nil
		}
		if !ok {
			ae := errorFor(fmt.Errorf("%w: %q", ErrModelNotFound, model), p.cfg.RetryAfter)
			WriteError(w, ae)
			return ae.Status
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return http.StatusOK
}

// admit reads and parses the request, routes it and picks an endpoint. On
// error nothing was dispatched.
func (p *Proxy) admit(r *http.Request, c *call) (picker.Result, error) {
	if err := checkRequestLine(r); err != nil {
		return picker.Result{}, err
	}
	var err error
	if c.hdr, err = p.cleanHeader(r, c.hdr); err != nil {
		return picker.Result{}, err
	}
	if p.cfg.RequestID != nil && canon.Get(c.hdr, canonicalRequestID) == "" {
		if id := p.newRequestID(); id != "" {
			c.hdr[canonicalRequestID] = []string{id}
		}
	}
	if err := p.readBody(r, c); err != nil {
		return picker.Result{}, err
	}
	// The prompt is rendered while the body is parsed, and hashed once the
	// route is known; it is not needed after Prepare.
	pr := p.prompts.Get().(*prefix.Prompt)
	defer p.prompts.Put(pr)
	// Health checks and listings (GET, HEAD) take the fallback route
	// whatever their body, which they should not have: it is forwarded but
	// not read, so that a malformed one is not an error. Their headers are
	// still read and checked.
	bodyless := r.Method == http.MethodGet || r.Method == http.MethodHead
	parse := c.body
	if bodyless {
		parse = nil
	}
	c.parsed, err = ParseRequestPrompt(r.URL.Path, c.hdr, parse, p.cfg.Parse, pr)
	defer func() { c.parsed.prompt = nil }()
	if err != nil {
		return picker.Result{}, err
	}
	t := p.table.Load()
	if bodyless {
		c.route = t.Fallback()
	} else if c.route, err = t.Route(&c.parsed); err != nil {
		return picker.Result{}, err
	}
	if p.cfg.Allow != nil {
		if err := p.cfg.Allow(r, c.route); err != nil {
			return picker.Result{}, denied(err)
		}
	}
	c.send = c.body
	if c.route.Rewrites() {
		c.send = c.parsed.RewriteModel(c.body, c.route.Upstream)
	}
	if err := Prepare(&c.req, &c.parsed, c.route, c.body, c.hdr, p.hasher, c.req.PromptBlocks); err != nil {
		return picker.Result{}, err
	}
	setPoolHeader(c.hdr, c.route.Pool.header)
	return c.route.Pool.Picker.Pick(r.Context(), &c.req)
}

// denied returns the error a Config.Allow refusal is answered with: err
// when errorFor has an answer of its own for it (an *APIError, a model
// not found), a 403 with its message otherwise, which errorFor would
// take for an upstream failure.
func denied(err error) error {
	var ae *APIError
	if errors.As(err, &ae) || errors.Is(err, ErrModelNotFound) {
		return err
	}
	return &APIError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "permission_denied",
		Message: err.Error()}
}

// readBody reads the request body into c.body, failing with
// ErrBodyTooLarge past the limit.
func (p *Proxy) readBody(r *http.Request, c *call) error {
	limit := p.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrBodyTooLarge, r.ContentLength, limit)
	}
	if r.Body == nil || r.Body == http.NoBody {
		c.body = c.body[:0]
		return nil
	}
	buf := c.body[:0]
	if r.ContentLength > 0 && int64(cap(buf)) <= r.ContentLength {
		// One spare byte so that the read returning EOF does not grow it.
		buf = make([]byte, 0, r.ContentLength+1)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			c.body = buf[:0]
			return fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
		}
		if err == io.EOF {
			// Closing a body read to its end costs nothing; left open,
			// net/http drains it once more before the response head
			// (an io.CopyN and an allocation per request).
			_ = r.Body.Close()
			break
		}
		if err != nil {
			c.body = buf[:0]
			return invalidRequest("reading the request body: " + err.Error())
		}
	}
	c.body = buf
	if ce := c.hdr["Content-Encoding"]; len(ce) > 0 {
		return p.decodeBody(c, ce)
	}
	return nil
}

// decodeBody replaces a gzip-coded request body by its decoded bytes, so
// that the request is routed by its content and forwarded as plain JSON
// (model servers do not decode request bodies), and drops the
// Content-Encoding field from the forwarded headers. The decoded body is
// held to the same limit as a plain one: a few KB of gzip can decode to
// gigabytes. A coding other than gzip (or identity) is refused with 415.
func (p *Proxy) decodeBody(c *call, codings []string) error {
	coding := strings.ToLower(strings.TrimSpace(strings.Join(codings, ",")))
	switch coding {
	case "identity":
		delete(c.hdr, "Content-Encoding")
		return nil
	case "gzip", "x-gzip":
	default:
		return &APIError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("request Content-Encoding %q is not supported: send the body as it is or gzip-coded", coding)}
	}
	zr, err := gzip.NewReader(bytes.NewReader(c.body))
	if err != nil {
		return invalidRequest("the request body is not gzip-coded as its Content-Encoding says: " + err.Error())
	}
	limit := p.cfg.MaxBodyBytes
	var out bytes.Buffer
	out.Grow(int(min(limit+1, int64(4*len(c.body)+512))))
	n, err := io.Copy(&out, io.LimitReader(zr, limit+1))
	switch {
	case n > limit:
		return fmt.Errorf("%w: more than %d bytes once decoded", ErrBodyTooLarge, limit)
	case err != nil:
		return invalidRequest("decoding the gzip-coded request body: " + err.Error())
	}
	c.body = out.Bytes()
	c.decoded = true
	delete(c.hdr, "Content-Encoding")
	return nil
}

// isHopHeader reports whether the canonical header key k is a hop-by-hop
// field of RFC 9110 section 7.6.1 (or the non-standard Proxy-Connection and
// Keep-Alive), which a proxy must not forward. Headers are copied without
// them rather than deleted after the copy: nine map deletes per request
// and direction cost more than the comparisons.
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// cleanHeader returns the headers to forward: r's headers without the
// hop-by-hop fields, those named by Connection, and the routing headers a
// client may not set; with Via and X-Forwarded-For extended and
// compression off. It fails with ErrLoop when the request's Via shows it
// has passed through this Proxy before.
// It fills reuse (cleared first) when not nil. Keys are matched whatever
// their case: net/http's server canonicalises them, but a handler in front
// may have set one by hand.
//
// It fails, with an error the client gets as 400, on a field that could not
// be forwarded verbatim: a name that is not a token or a value with control
// characters (RFC 9110 section 5), which could split the upstream request.
// net/http's server refuses such requests itself, so this guards against
// front ends and handlers that do not; the upstream client relies on it
// and writes the fields unchecked.
func (p *Proxy) cleanHeader(r *http.Request, reuse http.Header) (http.Header, error) {
	out := reuse
	if out == nil {
		out = make(http.Header, len(r.Header)+2)
	} else {
		clear(out)
	}
	for k, v := range r.Header {
		ck, ok := fieldKey(k) // k itself, unallocated, when canonical
		if !ok {
			return out, invalidRequest(fmt.Sprintf("request header %q is not a valid header field name", k))
		}
		if isHopHeader(ck) || p.stripped(ck) {
			continue
		}
		for _, s := range v {
			if !validFieldValue(s) {
				return out, invalidRequest(fmt.Sprintf("request header %q has a control character in its value", k))
			}
		}
		if prior, ok := out[ck]; ok { // the same field under another case
			v = append(slices.Clip(prior), v...)
		}
		out[ck] = v
	}
	for _, v := range r.Header["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out.Del(f)
			}
		}
	}
	if prior := out["Via"]; len(prior) > 0 {
		for _, v := range prior {
			if strings.Contains(v, p.viaName) {
				return out, ErrLoop
			}
		}
		out["Via"] = append(slices.Clip(prior), p.via...)
	} else {
		out["Via"] = p.via // shared, never modified
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := out["X-Forwarded-For"]; len(prior) > 0 {
			host = strings.Join(prior, ", ") + ", " + host
		}
		out["X-Forwarded-For"] = []string{host}
	}
	out["Accept-Encoding"] = identityEncoding
	return out, nil
}

// setPoolHeader applies a pool's PoolConfig.Header to hdr, the headers to
// forward: its fields replace hdr's, and one with no values removes it.
// hdr shares the pool's value slices, which no one modifies.
func setPoolHeader(hdr, pool http.Header) {
	for k, v := range pool {
		if len(v) == 0 {
			delete(hdr, k)
		} else {
			hdr[k] = v
		}
	}
}

// stripped reports whether the canonical header key k is a routing header
// a client may not set (HeaderDestination, Config.StripHeaders).
func (p *Proxy) stripped(k string) bool { return slices.Contains(p.strip, k) }

// invalidRequest is the 400 for a request the Proxy cannot take as it is.
func invalidRequest(msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_request", Message: msg}
}

// checkRequestLine fails, with an error the client gets as 400, when r's
// method or query could not be written into an HTTP/1.1 request line as
// they are: a method that is not a token, or a query with spaces or control
// characters. (The path is written escaped, so it cannot.) net/http's server
// never hands a handler such a request; a handler in front of the Proxy
// could.
func checkRequestLine(r *http.Request) error {
	if !validFieldName(r.Method) {
		return invalidRequest(fmt.Sprintf("request method %q is not a token", r.Method))
	}
	for i := 0; i < len(r.URL.RawQuery); i++ {
		if c := r.URL.RawQuery[i]; c <= ' ' || c == 0x7f {
			return invalidRequest("request query has a space or a control character")
		}
	}
	return nil
}

// identityEncoding is the Accept-Encoding of every upstream request; shared,
// never modified.
var identityEncoding = []string{"identity"}

// forward sends the request to the picked endpoint, retrying on its
// fallbacks, and relays the response. It calls res.Done exactly once and
// returns the status sent (499 for a client that went away), the TTFT, and
// whether the response must be aborted (see respond).
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, c *call, res picker.Result) (int, time.Duration, bool) {
	ctx := r.Context()
	targets := append(c.targets[:0], res.Endpoint)
	fb := res.Fallbacks
	if len(fb) > p.retries {
		fb = fb[:p.retries]
	}
	targets = append(targets, fb...) // copied: res.Fallbacks dies with Done
	var lastErr error
	lastConnect := false
	repicked := -1 // index in targets of the endpoint chosen by a second pick
	// ready: the pick or one of its fallbacks was healthy when the request
	// arrived (one atomic load when the pick is). A picker that fails open
	// sends requests to endpoints marked down when none is up; if those
	// fail too, no endpoint was ready: 503, not 502.
	ready := slices.ContainsFunc(targets, (*signals.Endpoint).Healthy)
	c.pick = res
	for i := 0; ; i++ {
		if i > 0 && ctx.Err() != nil {
			// The client went away during the last attempt (a 5xx drained):
			// no fallback is sent a request nobody waits for. The built-in
			// client would write it on an idle connection before noticing.
			c.outcome.Err = ctx.Err()
			return 499, 0, false
		}
		if i == len(targets) {
			// Every ranked target failed to connect or was marked down since
			// the pick: ask the picker once more, now that health reflects
			// the failures (a pod that died after the pick, and its
			// fallbacks dying with it, must not lose the request).
			if repicked >= 0 || p.retries == 0 || !lastConnect || c.route.Pool == nil || c.route.Pool.Picker == nil {
				break
			}
			res2, err := c.route.Pool.Picker.Pick(ctx, &c.req)
			if err != nil {
				break
			}
			next := res2.Endpoint
			if slices.Contains(targets, next) {
				// The picker still prefers a target that failed (it may
				// have come back): take its best untried fallback instead.
				next = nil
				for _, f := range res2.Fallbacks {
					if f.Healthy() && !slices.Contains(targets, f) {
						next = f
						break
					}
				}
				res2.Done(signals.Outcome{Err: errNotSent})
				if next == nil {
					break
				}
				res2 = c.route.Pool.Picker.Assign(ctx, &c.req, next)
			}
			c.again, repicked = res2, len(targets)
			targets = append(targets, next)
			ready = ready || next.Healthy()
		}
		ep := targets[i]
		done := res.Done
		first := &c.pick // whose FirstToken the first response byte reports
		if i == repicked {
			p.inst.retry(ctx, c)
			done, first = c.again.Done, &c.again
		} else if i > 0 && !ep.Healthy() {
			// The fallbacks were ranked at pick time; one that has failed
			// since (another request's connect error) is skipped rather
			// than sent traffic it cannot serve.
			continue
		} else if i > 0 {
			// The picker accounts the retry as it accounts its own
			// choices, so that the prefix index learns where the prompt
			// went and the latency model what its first token took.
			p.inst.retry(ctx, c)
			c.again = c.route.Pool.Picker.Assign(ctx, &c.req, ep)
			done, first = c.again.Done, &c.again
		}
		c.ep, c.attempts = ep, c.attempts+1
		t0 := p.clock.Now()
		resp, err := p.roundTrip(ctx, r, c, ep)
		if err != nil {
			o := signals.Outcome{Err: err, Latency: p.clock.Now().Sub(t0)}
			switch {
			case ctx.Err() != nil:
				o.Err = ctx.Err()
				c.outcome = o
				done(o)
				return 499, 0, false
			case errors.Is(err, ErrUpstreamTimeout):
				c.outcome = o
				done(o)
				WriteError(w, errorFor(err, 0))
				return http.StatusGatewayTimeout, 0, false
			case errors.Is(err, ErrUpstreamProtocol):
				// It answered, with a head that is not HTTP: not proof
				// that it is gone (see signals.Endpoint.ReportProtocolError),
				// and no byte reached the client, so a fallback may serve
				// the request as after a 5xx.
				done(o)
				ep.ReportProtocolError()
				p.log.LogAttrs(ctx, slog.LevelWarn, "upstream sent a malformed response", slog.String("endpoint", ep.Name),
					slog.String("address", ep.Address), slog.String("error", err.Error()), slog.Int("attempt", i+1))
				lastErr, lastConnect = err, false
				continue
			}
			o.ConnectError = true
			done(o)
			p.log.LogAttrs(ctx, slog.LevelWarn, "upstream unreachable", slog.String("endpoint", ep.Name),
				slog.String("address", ep.Address), slog.String("error", err.Error()), slog.Int("attempt", i+1))
			lastErr, lastConnect = err, true
			continue
		}
		if resp.StatusCode >= 500 {
			// Up but not serving: enough of these in a row take the pod
			// out of rotation (signals.Endpoint.ReportServerError).
			ep.ReportServerError()
		}
		// A 5xx or 429 is retried only when a fallback is left that will be
		// tried (those marked down since the pick are skipped); otherwise
		// it is the answer.
		if retryStatus(resp.StatusCode) && slices.ContainsFunc(targets[i+1:], (*signals.Endpoint).Healthy) {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			c.cancel(nil)
			err := fmt.Errorf("%w: %d from %s", ErrUpstreamStatus, resp.StatusCode, ep.Address)
			done(signals.Outcome{Err: err, Latency: p.clock.Now().Sub(t0)})
			p.log.LogAttrs(ctx, slog.LevelWarn, "upstream error status, retrying", slog.String("endpoint", ep.Name),
				slog.Int("status", resp.StatusCode), slog.Int("attempt", i+1))
			lastErr, lastConnect = err, false
			continue
		}
		return p.respond(w, r, c, resp, t0, done, first)
	}
	if lastConnect && !ready {
		// Without the dial error: it names an address, and the attempts
		// are logged above with theirs.
		lastErr = fmt.Errorf("%w: every endpoint tried was down before the request and failed to connect",
			picker.ErrNoEndpoints)
	}
	c.outcome.Err = lastErr
	ae := errorFor(lastErr, 0)
	WriteError(w, ae)
	return ae.Status, 0, false
}

// errNotSent is the outcome reported for a pick that a retry did not use.
var errNotSent = errors.New("inferroute router: pick not used by the retry")

// roundTrip sends one attempt. On success c.cancel must be called once the
// response is consumed.
func (p *Proxy) roundTrip(ctx context.Context, r *http.Request, c *call, ep *signals.Endpoint) (*http.Response, error) {
	if p.h1 != nil && p.cfg.UpstreamTimeout <= 0 && p.cfg.StreamIdleTimeout <= 0 {
		// No timer to cancel the attempt: the request's own context (the
		// client going away) is the only cancellation.
		resp, err := p.h1.do(ctx, p.h1Request(r, c, ep))
		if err != nil {
			return nil, err
		}
		c.cancel = noCancel
		return resp, nil
	}
	actx, cancel := context.WithCancelCause(ctx)
	var timer *time.Timer
	if d := p.cfg.UpstreamTimeout; d > 0 {
		timer = time.AfterFunc(d, func() { cancel(ErrUpstreamTimeout) })
	}
	var resp *http.Response
	var err error
	if p.h1 != nil {
		resp, err = p.h1.do(actx, p.h1Request(r, c, ep))
	} else {
		resp, err = p.transport.RoundTrip(p.httpRequest(actx, r, c, ep))
	}
	if timer != nil && !timer.Stop() && err == nil {
		// The timer fired as the headers arrived: the body is cancelled.
		_ = resp.Body.Close()
		resp, err = nil, ErrUpstreamTimeout
	}
	if err != nil {
		if errors.Is(context.Cause(actx), ErrUpstreamTimeout) {
			err = ErrUpstreamTimeout
		}
		cancel(nil)
		return nil, err
	}
	c.cancel = cancel
	return resp, nil
}

// h1Request fills c's request for the built-in client.
func (p *Proxy) h1Request(r *http.Request, c *call, ep *signals.Endpoint) *h1Request {
	c.h1req = h1Request{
		method:     r.Method,
		addr:       ep.Address,
		path:       r.URL.EscapedPath(),
		query:      r.URL.RawQuery,
		header:     c.hdr,
		body:       c.send,
		sendLength: r.Method != http.MethodGet && r.Method != http.MethodHead,
		watchNow:   p.cfg.UpstreamTimeout > 0,
	}
	if p.endpointH != "" {
		c.h1req.extraKey, c.h1req.extraValue = p.endpointH, ep.Address
	}
	return &c.h1req
}

// httpRequest builds the upstream request for Config.Transport.
func (p *Proxy) httpRequest(actx context.Context, r *http.Request, c *call, ep *signals.Endpoint) *http.Request {
	hdr := c.hdr
	if p.cfg.EndpointHeader != "" {
		hdr = hdr.Clone()
		hdr.Set(p.cfg.EndpointHeader, ep.Address)
	}
	out := (&http.Request{
		Method:     r.Method,
		URL:        &url.URL{Scheme: p.scheme, Host: ep.Address, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     hdr,
		Host:       ep.Address,
	}).WithContext(actx)
	if len(c.send) > 0 || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		// The body is the call's buffer itself: GetBody replays the same
		// bytes on the transport's own retries, no second copy.
		out.ContentLength = int64(len(c.send))
		out.Body = http.NoBody
		if len(c.send) > 0 {
			b := newSentBody(c, c.send)
			out.Body, out.GetBody = b, b.reopen
		}
	}
	return out
}

// sentBody is a request body handed to Config.Transport: data, a buffer of
// the call, read in place. An http.RoundTripper may read and close the body
// after RoundTrip returned (net/http.Transport goes on writing it when the
// response arrives first), so the call, counting its open bodies, is not
// reused before every one is closed.
type sentBody struct {
	bytes.Reader
	c      *call
	data   []byte
	closed atomic.Bool
}

func newSentBody(c *call, data []byte) *sentBody {
	c.open.Add(1)
	b := &sentBody{c: c, data: data}
	b.Reset(data)
	return b
}

// Close implements io.Closer; calls after the first are no-ops.
func (b *sentBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.c.open.Add(-1)
	}
	return nil
}

// reopen is the request's GetBody: a new body of the same bytes.
func (b *sentBody) reopen() (io.ReadCloser, error) { return newSentBody(b.c, b.data), nil }

// firstByte records when the first response body byte arrives and reports
// it to the pick (picker.Result.FirstToken), when there is one.
type firstByte struct {
	r     io.Reader
	clock signals.Clock
	t0    time.Time
	ttft  time.Duration
	seen  bool
	pick  *picker.Result
}

func (f *firstByte) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if n > 0 && !f.seen {
		f.seen = true
		f.ttft = f.clock.Now().Sub(f.t0)
		if f.pick != nil {
			f.pick.FirstToken()
		}
	}
	return n, err
}

// respond relays resp to the client, reports its first body byte to pick
// (nil for a fallback the picker did not choose) and calls done once with
// the outcome. It returns the status sent, the TTFT, and aborted when the
// body broke off after bytes were sent in a format with no in-band error:
// the handler must then abort the response.
func (p *Proxy) respond(w http.ResponseWriter, r *http.Request, c *call, resp *http.Response, t0 time.Time, done func(signals.Outcome), pick *picker.Result) (int, time.Duration, bool) {
	defer c.cancel(nil)
	defer resp.Body.Close()
	c.fb = firstByte{r: resp.Body, clock: p.clock, t0: t0, pick: pick}
	fb := &c.fb
	var o signals.Outcome
	failed := failedStatus(resp.StatusCode)
	if failed {
		o.Err = fmt.Errorf("%w: %d", ErrUpstreamStatus, resp.StatusCode)
	}
	copyHeader(w.Header(), resp.Header)
	ct := mediaType(canon.Get(resp.Header, "Content-Type"))
	status := resp.StatusCode
	var err error
	var aborted bool
	switch {
	case resp.Body == http.NoBody:
		// A response that has no body whatever its headers say (to a
		// HEAD, or a 204 or 304): relayed as it is, with the
		// Content-Length the upstream declared.
		w.WriteHeader(status)
	case ct == eventStream:
		err = p.streamSSE(w, r, c, fb, resp.StatusCode, &o)
	case (ct == "application/json" || (len(ct) > 5 && strings.EqualFold(ct[len(ct)-5:], "+json"))) && resp.ContentLength <= p.cfg.MaxResponseBuffer:
		status, aborted, err = p.bufferJSON(w, r, c, fb, resp.StatusCode, &o)
	default:
		status, aborted, err = p.copyBody(w, r, fb, resp.StatusCode)
	}
	if err != nil && o.Err == nil {
		o.Err = err
	}
	if r.Context().Err() != nil {
		o.Err = r.Context().Err()
		status = 499
	}
	if !failed && !c.noToken {
		o.TTFT = fb.ttft
	}
	o.Latency = p.clock.Now().Sub(t0)
	o.Buffered = ct != eventStream
	c.buffered = o.Buffered
	c.outcome = o
	done(o)
	return status, o.TTFT, aborted
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		if !isHopHeader(k) {
			dst[k] = v
		}
	}
	for _, v := range src["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				dst.Del(f)
			}
		}
	}
}

// bufferJSON reads a JSON response whole (up to MaxResponseBuffer), takes
// its usage, rewrites its model back to the client's name, and sends it.
// Nothing reaches the client before the body is complete, so a failure to
// read it is answered 502 instead of a truncated body. A body too long to
// hold is sent as far as it was read and streamed on (unrewritten) like
// copyBody's; it reports aborted when that stream breaks off.
func (p *Proxy) bufferJSON(w http.ResponseWriter, r *http.Request, c *call, fb *firstByte, status int, o *signals.Outcome) (int, bool, error) {
	limit := p.cfg.MaxResponseBuffer
	buf := c.rbuf[:0]
	var rerr error
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := fb.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = err
			break
		}
		if int64(len(buf)) > limit {
			break
		}
	}
	c.rbuf = buf
	h := w.Header()
	if rerr != nil {
		status, err := p.brokenBefore(w, r, rerr)
		return status, false, err
	}
	if int64(len(buf)) > limit {
		// Too long to hold: send what was read and stream the rest.
		h.Del("Content-Length")
		w.WriteHeader(status)
		if _, err := w.Write(buf); err != nil {
			return status, false, err
		}
		bp := copyBufs.Get().(*[32 << 10]byte)
		defer copyBufs.Put(bp)
		aborted, err := relay(w, fb, bp, 0, nil)
		return status, aborted, err
	}
	if u, ok := parseUsage(buf); ok {
		u.apply(o)
	}
	out := buf
	if c.route.Rewrites() {
		out = rewriteModelField(buf, c.route.ClientModel)
	}
	if !isLength(h["Content-Length"], len(out)) {
		// Only when the length changed (a rewritten model name) or the
		// upstream sent none: setting it allocates.
		h.Set("Content-Length", strconv.Itoa(len(out)))
	}
	w.WriteHeader(status)
	_, err := w.Write(out)
	return status, false, err
}

// brokenBefore answers a response whose body broke off (rerr) before any
// of it was sent: 502 in OpenAI's shape instead of the upstream's headers,
// or nothing when the client has gone (499). It returns the status and the
// error to report.
func (p *Proxy) brokenBefore(w http.ResponseWriter, r *http.Request, rerr error) (int, error) {
	clear(w.Header())
	if r.Context().Err() != nil {
		return 499, rerr
	}
	WriteError(w, &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_stream_error",
		Message: "the model server's response broke off: " + withoutAddresses(rerr)})
	return http.StatusBadGateway, fmt.Errorf("%w: %w", ErrStreamBroken, rerr)
}

// isLength reports whether vs is one Content-Length value equal to n.
func isLength(vs []string, n int) bool {
	if len(vs) != 1 {
		return false
	}
	v, ok := parseLength(vs[0])
	return ok && v == int64(n)
}

// copyBody streams a response of another content type, flushing after each
// read so that unknown streaming formats are not held back. The head is
// sent with the first body byte: a body that breaks off before it is
// answered 502 (brokenBefore), and one that breaks off after it reports
// aborted, for the handler to abort the response.
func (p *Proxy) copyBody(w http.ResponseWriter, r *http.Request, fb *firstByte, status int) (int, bool, error) {
	bp := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(bp)
	n, rerr := fb.Read(bp[:])
	for n == 0 && rerr == nil {
		n, rerr = fb.Read(bp[:])
	}
	if n == 0 && rerr != io.EOF {
		status, err := p.brokenBefore(w, r, rerr)
		return status, false, err
	}
	w.WriteHeader(status)
	aborted, err := relay(w, fb, bp, n, rerr)
	return status, aborted, err
}

// relay sends bp[:n] and rerr, the last read of a response body whose head
// the client already has, and copies the rest through bp, flushing after
// each read. It reports aborted when the body broke off, which the handler
// must turn into an aborted response: a truncated body must not look
// complete.
func relay(w http.ResponseWriter, fb *firstByte, bp *[32 << 10]byte, n int, rerr error) (aborted bool, err error) {
	rc := http.NewResponseController(w)
	for {
		if n > 0 {
			if _, werr := w.Write(bp[:n]); werr != nil {
				return false, werr
			}
			_ = rc.Flush()
		}
		if rerr == io.EOF {
			return false, nil
		}
		if rerr != nil {
			return true, fmt.Errorf("%w: %w", ErrStreamBroken, rerr)
		}
		n, rerr = fb.Read(bp[:])
	}
}

// copyBufs are the 32 KiB buffers of copyBody and relay.
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// eventStream is the media type of a server-sent event stream, the one
// response format that arrives token by token.
const eventStream = "text/event-stream"

// mediaType returns the media type of a Content-Type value, lower-cased,
// without parameters (RFC 9110 section 8.3.1), allocating only when the
// value is not already lower case.
func mediaType(v string) string {
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	v = strings.TrimSpace(v)
	for i := 0; i < len(v); i++ {
		if 'A' <= v[i] && v[i] <= 'Z' {
			return strings.ToLower(v)
		}
	}
	return v
}

// streamSSE relays a server-sent event stream line by line, flushing at the
// end of every event, rewriting each data chunk's model back to the
// client's name and keeping the last usage seen. If the upstream breaks off,
// or a chat or completions stream ends without "data: [DONE]", it sends an
// SSE error event in OpenAI's error shape so the client never mistakes a
// truncated answer for a complete one.
func (p *Proxy) streamSSE(w http.ResponseWriter, r *http.Request, c *call, fb *firstByte, status int, o *signals.Outcome) error {
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return err
	}
	if c.br == nil {
		c.br = bufio.NewReaderSize(fb, 16<<10)
	} else {
		c.br.Reset(fb)
	}
	defer c.br.Reset(nil)
	sawDone := false
	sawData := false // a data event other than an error came
	rewrite := c.route.Rewrites()
	cont := false // relaying the rest of a line longer than MaxResponseBuffer
	var idle *time.Timer
	var idled atomic.Bool
	if d := p.cfg.StreamIdleTimeout; d > 0 {
		cancel := c.cancel
		idle = time.AfterFunc(d, func() {
			idled.Store(true)
			cancel(ErrStreamIdle)
		})
		defer idle.Stop()
	}
	for {
		line, ends, rerr := c.readLine(p.cfg.MaxResponseBuffer)
		if idle != nil && len(line) > 0 {
			idle.Reset(p.cfg.StreamIdleTimeout)
		}
		whole := ends && !cont // a line read whole, not a piece of a long one
		cont = !ends
		if len(line) > 0 {
			out := line
			if payload, ok := sseData(line); ok && whole {
				switch {
				case len(payload) == 6 && string(payload) == "[DONE]":
					sawDone = true
				case len(payload) > 0 && payload[0] == '{':
					if bytes.HasPrefix(payload, []byte(`{"error"`)) {
						// The model server's own error event (vLLM sends
						// one when generation fails after the headers,
						// then [DONE]): relayed, and the request reported
						// failed; with no data before it, without a TTFT.
						if o.Err == nil {
							o.Err = ErrStreamErrorEvent
						}
						c.noToken = c.noToken || !sawData
						break
					}
					sawData = true
					if bytes.Contains(payload, []byte(`"usage"`)) {
						if u, ok := parseUsage(payload); ok {
							u.apply(o)
						}
					}
					if rewrite {
						c.out = append(append(append(c.out[:0], "data: "...), rewriteModelField(payload, c.route.ClientModel)...), '\n')
						out = c.out
					}
				}
			}
			if _, err := w.Write(out); err != nil {
				return err
			}
			if whole && len(line) <= 2 && (line[0] == '\n' || line[0] == '\r') {
				if err := rc.Flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if r.Context().Err() != nil {
				return r.Context().Err()
			}
			if idled.Load() {
				rerr = ErrStreamIdle
			}
			return p.streamError(w, rc, fmt.Errorf("%w: %w", ErrStreamBroken, rerr))
		}
	}
	if !sawDone && (c.parsed.Kind == KindChat || c.parsed.Kind == KindCompletions) && status < 400 {
		return p.streamError(w, rc, fmt.Errorf("%w: the stream ended without [DONE]", ErrStreamBroken))
	}
	return rc.Flush()
}

// streamError ends an SSE stream with an error event and returns err.
func (p *Proxy) streamError(w http.ResponseWriter, rc *http.ResponseController, err error) error {
	ae := &APIError{Type: "server_error", Code: "upstream_stream_error",
		Message: "the model server's stream broke off: " + withoutAddresses(err)}
	b := append(ae.AppendJSON([]byte("data: ")), "\n\n"...)
	_, _ = w.Write(b)
	_ = rc.Flush()
	return err
}

// readLine returns the next line including its newline, and ends = true;
// a line longer than the reader's buffer is assembled in c.line. A line
// longer than limit is returned in pieces of at least limit bytes, each
// but the last with ends = false, so that an upstream cannot make the
// proxy hold an unbounded line; streamSSE relays such a line unchanged,
// as it does a JSON body over MaxResponseBuffer. At the end of the stream
// it returns the last partial line (if any) with io.EOF.
func (c *call) readLine(limit int64) (line []byte, ends bool, err error) {
	line, err = c.br.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, true, err
	}
	c.line = append(c.line[:0], line...)
	for int64(len(c.line)) < limit {
		line, err = c.br.ReadSlice('\n')
		c.line = append(c.line, line...)
		if err != bufio.ErrBufferFull {
			return c.line, true, err
		}
	}
	return c.line, false, nil
}

// sseData returns the payload of an SSE "data:" line without the optional
// space after the colon and without the line ending (WHATWG HTML Living
// Standard, "Server-sent events", section 9.2.6 Interpreting an event
// stream).
func sseData(line []byte) ([]byte, bool) {
	if !bytes.HasPrefix(line, []byte("data:")) {
		return nil, false
	}
	v := line[5:]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	return bytes.TrimRight(v, "\r\n"), true
}
