package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
)

// Decision is the routing decision the Middleware stores in the request
// context for the next handler.
type Decision struct {
	// Route is the table's route for the request.
	Route Route
	// Parsed is what was read from the request.
	Parsed Parsed
	// Request is what the picker was given. It must not be modified.
	Request *signals.Request
	// Endpoint is the chosen endpoint: send the request to
	// Endpoint.Address.
	Endpoint *signals.Endpoint
	// Fallbacks are ranked alternatives for retries. The slice is the
	// Decision's own copy and stays valid after Done; account a retry on
	// one with Retry.
	Fallbacks []*signals.Endpoint

	start time.Time
	clock signals.Clock
	done  func(signals.Outcome)
	res   picker.Result

	// mu guards what the access log reads of the attempts: whether the
	// Decision's own outcome is in, the attempts made (1 + Retry calls),
	// the endpoint of the last one and, once reported, its outcome.
	mu        sync.Mutex
	reported  bool
	attempts  int
	last      *signals.Endpoint
	lastOut   signals.Outcome
	lastKnown bool
}

// FirstToken reports that the endpoint's first response byte arrived
// (picker.Result.FirstToken): the request's prompt is prefilled and it
// leaves the endpoint's prefill queue while it decodes. The Middleware
// calls it when the next handler writes its first body byte; a handler
// that sees the upstream's first byte earlier may call it then. Calls
// after the first, and after Done, are no-ops. Safe for concurrent use.
func (d *Decision) FirstToken() { d.res.FirstToken() }

// Retry accounts a retry of the request on ep, usually one of Fallbacks,
// with the pool's picker (picker.Picker.Assign): the endpoint's in-flight
// and prefill counters, and the prefix index and latency model, learn of
// it as of a pick. The caller reports the attempt's outcome through the
// returned Result's Done, exactly once, and its first byte through
// FirstToken; the Decision's own Done stays the first attempt's.
func (d *Decision) Retry(ctx context.Context, ep *signals.Endpoint) picker.Result {
	res := d.Route.Pool.Picker.Assign(ctx, d.Request, ep)
	d.mu.Lock()
	d.attempts++
	n := d.attempts
	d.last, d.lastKnown = ep, false
	d.mu.Unlock()
	done := res.Done
	res.Done = func(o signals.Outcome) {
		d.record(n, o)
		done(o)
	}
	return res
}

// record keeps o, the outcome of attempt n (1-based), for the access log
// when it is the last attempt made.
func (d *Decision) record(n int, o signals.Outcome) {
	d.mu.Lock()
	if n == d.attempts {
		d.lastOut, d.lastKnown = o, true
	}
	d.mu.Unlock()
}

// lastAttempt returns the attempts made, the endpoint of the last one and
// its outcome, when reported.
func (d *Decision) lastAttempt() (attempts int, ep *signals.Endpoint, o signals.Outcome, known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attempts, d.last, d.lastOut, d.lastKnown
}

// Done reports the outcome to the picker. Only the first call counts, so
// the next handler may call it with the real TTFT and token usage, and the
// Middleware calls it after the handler returns with what it observed
// (first byte written; as an error a final status ≥ 400, the client gone
// before the handler returned, or a handler that panicked) if the handler
// did not. Safe for concurrent use.
func (d *Decision) Done(o signals.Outcome) {
	d.mu.Lock()
	first := !d.reported
	d.reported = true
	if first && d.attempts == 1 {
		d.lastOut, d.lastKnown = o, true
	}
	d.mu.Unlock()
	if first {
		d.done(o)
	}
}

// errHandlerAborted is the outcome reported when the next handler panicked
// (http.ErrAbortHandler included) or exited its goroutine.
var errHandlerAborted = errors.New("inferroute router: the handler behind the Middleware aborted")

type decisionKey struct{}

// FromContext returns the Decision the Middleware stored in ctx, if any.
func FromContext(ctx context.Context) (*Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(*Decision)
	return d, ok
}

// NewContext returns ctx carrying d, for tests and for gateways that make
// their own decisions but reuse handlers written against FromContext.
func NewContext(ctx context.Context, d *Decision) context.Context {
	return context.WithValue(ctx, decisionKey{}, d)
}

// Middleware is the router for gateways that already own their proxy: it
// parses and routes the request, picks an endpoint, stores the Decision in
// the request context, optionally names the endpoint in a header
// (Config.EndpointHeader), and calls the next handler with the request body
// restored (rewritten to the served model name when the route says so).
// Errors are answered in OpenAI's shape as by the Proxy, and the next
// handler is not called. Safe for concurrent use.
//
// Unlike the Proxy, the Middleware does not touch the response: for an
// alias, rewriting the answer's "model" back to the client's name
// (Decision.Route.ClientModel) is the next handler's job, and so are
// retries on Decision.Fallbacks (accounted with Decision.Retry).
type Middleware struct {
	p *Proxy
}

// NewMiddleware returns a Middleware routing with t. Config fields that
// concern forwarding (Transport, MaxRetries, UpstreamTimeout,
// MaxResponseBuffer) are not used.
func NewMiddleware(t *Table, cfg Config) (*Middleware, error) {
	p, err := NewProxy(t, cfg)
	if err != nil {
		return nil, err
	}
	return &Middleware{p: p}, nil
}

// SetTable swaps the routing table atomically.
func (m *Middleware) SetTable(t *Table) { m.p.SetTable(t) }

// Wrap returns next behind the router. GET /v1/models and
// /v1/models/{model} are answered from the table without calling next. The
// Decision is valid until next returns.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := m.p
		var span trace.Span
		if p.tr.tracer != nil {
			r, span = p.tr.start(r)
		}
		if p.serveListing(w, r, span) {
			return
		}
		c := new(call)
		c.start = p.clock.Now()
		res, err := p.admit(r, c)
		if p.cfg.RequestID != nil {
			p.echoRequestID(w, c.hdr)
		}
		if err != nil {
			p.refuse(w, r, c, span, err)
			return
		}
		d := &Decision{
			Route: c.route, Parsed: c.parsed, Request: &c.req, Endpoint: res.Endpoint,
			Fallbacks: append([]*signals.Endpoint(nil), res.Fallbacks...),
			start:     c.start, clock: p.clock, done: res.Done, res: res,
			attempts: 1, last: res.Endpoint,
		}
		r2 := r.WithContext(NewContext(r.Context(), d))
		r2.Header = r.Header.Clone()
		if p.cfg.RequestID != nil && r2.Header.Get(canonicalRequestID) == "" {
			r2.Header[canonicalRequestID] = c.hdr[canonicalRequestID] // the one admit made
		}
		// One pass, matching keys in any case: the routing headers go, and
		// so do the fields the router sets itself, the pool's and Via.
		pool := c.route.Pool.header
		for k := range r2.Header {
			ck, _ := fieldKey(k) // an invalid name is kept as it is, as net/http would
			if _, set := pool[ck]; set || ck == "Via" || p.stripped(ck) {
				delete(r2.Header, k)
			}
		}
		for k, v := range pool {
			if len(v) > 0 {
				r2.Header[k] = slices.Clone(v) // r2.Header is the next handler's to change
			}
		}
		r2.Header["Via"] = slices.Clone(c.hdr["Via"]) // the client's and the router's: a request that comes back is refused
		if p.cfg.EndpointHeader != "" {
			r2.Header.Set(p.cfg.EndpointHeader, res.Endpoint.Address)
		}
		if span != nil {
			p.tr.inject(r2.Context(), r2.Header) // for a next handler that forwards the header as it is
		}
		if c.decoded {
			r2.Header.Del("Content-Encoding") // the body handed on is the decoded one
		}
		r2.Body = io.NopCloser(bytes.NewReader(c.send))
		r2.ContentLength = int64(len(c.send))
		if r2.Header.Get("Content-Length") != "" {
			r2.Header.Set("Content-Length", strconv.Itoa(len(c.send)))
		}
		rw := &watchWriter{ResponseWriter: w, clock: p.clock, status: http.StatusOK, d: d}
		returned := false // next returned rather than panicked or exited
		// The outcome's times run from dispatch, as the Proxy's do; the
		// request's duration in the metrics runs from its arrival.
		dispatched := p.clock.Now()
		defer func() {
			end := p.clock.Now()
			o := signals.Outcome{Latency: end.Sub(dispatched)}
			status := rw.status
			if rw.wrote {
				if !failedStatus(rw.status) {
					o.TTFT = rw.first.Sub(dispatched) // an error body's first byte is no token's
				}
				o.Buffered = mediaType(rw.Header().Get("Content-Type")) != eventStream
				c.buffered = o.Buffered
			}
			switch {
			case !returned:
				// httputil.ReverseProxy panics with http.ErrAbortHandler
				// when the upstream body breaks off: the response is not
				// whole, whatever its status.
				o.Err = errHandlerAborted
			case r.Context().Err() != nil:
				o.Err, status = r.Context().Err(), 499
			case failedStatus(rw.status):
				o.Err = fmt.Errorf("%w: %d", ErrUpstreamStatus, rw.status)
			}
			d.Done(o)
			if p.cfg.AccessLog != nil || span != nil || p.cfg.Completed != nil {
				// The line and the span name the last attempt, with the
				// usage the next handler reported for it; the status, ttft
				// and error are what the Middleware saw of the response.
				var known bool
				c.attempts, c.ep, c.outcome, known = d.lastAttempt()
				if !known {
					c.outcome = signals.Outcome{}
				}
			}
			p.report(r, c, span, status, end.Sub(c.start), o.TTFT, !returned, o.Err)
		}()
		next.ServeHTTP(rw, r2)
		returned = true
	})
}

// watchWriter records the status and the time of the first body byte.
type watchWriter struct {
	http.ResponseWriter
	d      *Decision
	clock  signals.Clock
	first  time.Time
	status int
	header bool
	wrote  bool
}

func (w *watchWriter) WriteHeader(code int) {
	// An interim 1xx response (103 Early Hints) comes before the final
	// one, whose status is the response's; 101 Switching Protocols is final.
	if !w.header && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.header = true
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *watchWriter) Write(b []byte) (int, error) {
	w.header = true
	if !w.wrote && len(b) > 0 {
		w.wrote = true
		w.first = w.clock.Now()
		w.d.FirstToken()
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *watchWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *watchWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
