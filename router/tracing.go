package router

import (
	"context"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the router's spans.
const tracerName = "github.com/inferroute/inferroute/router"

// Span attribute keys. The HTTP ones are OpenTelemetry's HTTP semantic
// conventions (semconv 1.26 and later), the gen_ai ones its generative-AI
// conventions; the inferroute ones say where the request went.
const (
	attrHTTPMethod   = "http.request.method"
	attrHTTPRoute    = "http.route"
	attrHTTPStatus   = "http.response.status_code"
	attrURLPath      = "url.path"
	attrClientAddr   = "client.address"
	attrModel        = "gen_ai.request.model"
	attrInputTokens  = "gen_ai.usage.input_tokens"
	attrOutputTokens = "gen_ai.usage.output_tokens"
	attrPool         = "inferroute.pool"
	attrEndpoint     = "inferroute.endpoint"
	attrAttempts     = "inferroute.attempts"
	attrStream       = "inferroute.stream"
	attrTTFT         = "inferroute.ttft_ms"
	attrRequestID    = "inferroute.request_id"
)

// tracing is the Proxy's tracer and propagator, set when
// Config.TracerProvider is.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func newTracing(cfg Config) tracing {
	if cfg.TracerProvider == nil {
		return tracing{}
	}
	t := tracing{tracer: cfg.TracerProvider.Tracer(tracerName), prop: cfg.Propagator}
	if t.prop == nil {
		t.prop = propagation.TraceContext{}
	}
	return t
}

// start opens the server span of r, a child of the trace context r
// carries, and returns r with the span in its context. Its name is the
// method and, for an OpenAI API path, the path (semconv's "{method}
// {http.route}"; any other path would make a name per URL).
func (t tracing) start(r *http.Request) (*http.Request, trace.Span) {
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	name := r.Method
	attrs := []attribute.KeyValue{attribute.String(attrHTTPMethod, r.Method), attribute.String(attrURLPath, r.URL.Path)}
	if KindOf(r.URL.Path) != KindOther {
		route := strings.TrimRight(r.URL.Path, "/")
		name += " " + route
		attrs = append(attrs, attribute.String(attrHTTPRoute, route))
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, attribute.String(attrClientAddr, host))
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return r.WithContext(ctx), span
}

// inject writes the trace context of ctx, the request's span, into hdr,
// the upstream request's headers, over the client's: a model server that
// traces (vLLM's --otlp-traces-endpoint) continues the trace under the
// gateway's span.
func (t tracing) inject(ctx context.Context, hdr http.Header) {
	t.prop.Inject(ctx, propagation.HeaderCarrier(hdr))
}

// finish records on span what became of the request and ends it: the
// route and endpoint when it was routed, the status, TTFT and token usage,
// and an error status for a 5xx answer or a response that broke off (a
// 4xx is the client's, not the server's, error: semconv's rule for server
// spans).
func (t tracing) finish(span trace.Span, c *call, status int, ttft time.Duration, aborted bool, err error) {
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs, attribute.Int(attrHTTPStatus, status))
	if c != nil {
		if c.parsed.Model != "" {
			attrs = append(attrs, attribute.String(attrModel, clip(c.parsed.Model)))
		}
		if c.parsed.RequestID != "" {
			attrs = append(attrs, attribute.String(attrRequestID, clip(c.parsed.RequestID)))
		}
		if c.route.Pool != nil {
			attrs = append(attrs, attribute.String(attrPool, c.route.Pool.Name))
		}
		if c.ep != nil {
			attrs = append(attrs, attribute.String(attrEndpoint, c.ep.Name), attribute.Int(attrAttempts, c.attempts),
				attribute.Bool(attrStream, c.parsed.Stream))
		}
		if ttft > 0 {
			attrs = append(attrs, attribute.Float64(attrTTFT, float64(ttft)/float64(time.Millisecond)))
		}
		if o := &c.outcome; o.PromptTokens > 0 || o.CompletionTokens > 0 {
			attrs = append(attrs, attribute.Int(attrInputTokens, o.PromptTokens), attribute.Int(attrOutputTokens, o.CompletionTokens))
		}
		if err == nil {
			err = c.outcome.Err
		}
	}
	span.SetAttributes(attrs...)
	if status >= 500 || aborted {
		msg := http.StatusText(status)
		if err != nil {
			msg = clip(err.Error())
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}
