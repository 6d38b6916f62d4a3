package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/inferroute/inferroute/signals"
)

// The client's trace: its trace id and the id of its span, the parent of
// the router's.
const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID      = "00f067aa0ba902b7"
	clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// endedSpans waits for n spans to have ended (a span ends once the
// handler returns, which the client may see after its answer) and
// returns them.
func endedSpans(t *testing.T, rec *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	require.Eventually(t, func() bool { return len(rec.Ended()) >= n }, 5*time.Second, time.Millisecond)
	spans := rec.Ended()
	require.Len(t, spans, n)
	return spans
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestProxyTracing: with a TracerProvider, each request is a server span,
// the child of the client's trace context, named by its method and API
// route, with where it went and what it cost; the model server gets the
// span's context instead of the client's; 5xx answers are errors, 4xx
// answers are not.
func TestProxyTracing(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var e *env
	addr, got := backend(t, jsonHandler(200, ok, func() { e.clock.Advance(250 * time.Millisecond) }))
	e = newEnv(t, Config{TracerProvider: tp}, addr)
	traced := http.Header{"Traceparent": {clientTraceparent}, "X-Request-Id": {"req-7"}}

	r := e.post(t, "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, traced)
	require.Equal(t, 200, r.StatusCode)
	_, _ = io.Copy(io.Discard, r.Body)
	s := endedSpans(t, rec, 1)[0]
	assert.Equal(t, "POST /v1/chat/completions", s.Name())
	assert.Equal(t, trace.SpanKindServer, s.SpanKind())
	assert.Equal(t, clientTraceID, s.SpanContext().TraceID().String(), "in the client's trace")
	assert.Equal(t, clientSpanID, s.Parent().SpanID().String(), "under the client's span")
	assert.True(t, s.Parent().IsRemote())
	a := attrs(s)
	assert.Equal(t, "POST", a["http.request.method"].AsString())
	assert.Equal(t, "/v1/chat/completions", a["http.route"].AsString())
	assert.Equal(t, int64(200), a["http.response.status_code"].AsInt64())
	assert.Equal(t, "127.0.0.1", a["client.address"].AsString())
	assert.Equal(t, "llama", a["gen_ai.request.model"].AsString())
	assert.Equal(t, "req-7", a["inferroute.request_id"].AsString())
	assert.Equal(t, "llama", a["inferroute.pool"].AsString())
	assert.Equal(t, "ep0", a["inferroute.endpoint"].AsString())
	assert.Equal(t, int64(1), a["inferroute.attempts"].AsInt64())
	assert.False(t, a["inferroute.stream"].AsBool())
	assert.Equal(t, 250.0, a["inferroute.ttft_ms"].AsFloat64(), "the injected clock's advance before the first byte")
	assert.Equal(t, int64(8), a["gen_ai.usage.input_tokens"].AsInt64(), "the fixture's usage")
	assert.Equal(t, int64(377), a["gen_ai.usage.output_tokens"].AsInt64())
	assert.Equal(t, codes.Unset, s.Status().Code)
	up := (<-got).header.Get("Traceparent")
	assert.Equal(t, "00-"+clientTraceID+"-"+s.SpanContext().SpanID().String()+"-01", up,
		"the model server continues the trace under the router's span")

	// Refused: the client's error, not the server's.
	requireAPIError(t, e.post(t, "/v1/chat/completions", `{"model":"gpt-9"}`, nil), 404, "model_not_found")
	s = endedSpans(t, rec, 2)[1]
	assert.Equal(t, int64(404), attrs(s)["http.response.status_code"].AsInt64())
	assert.Equal(t, "gpt-9", attrs(s)["gen_ai.request.model"].AsString())
	assert.NotContains(t, attrs(s), attribute.Key("inferroute.endpoint"))
	assert.Equal(t, codes.Unset, s.Status().Code)
	assert.False(t, s.Parent().IsValid(), "a request without a trace context starts a trace")

	// A listing, and a path outside the API, named by its method alone.
	resp, err := e.front.Client().Get(e.front.URL + "/v1/models")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, "GET /v1/models", endedSpans(t, rec, 3)[2].Name())
	require.Equal(t, 200, e.post(t, "/tokenize/7f3a", "plain text", nil).StatusCode)
	<-got
	s = endedSpans(t, rec, 4)[3]
	assert.Equal(t, "POST", s.Name())
	assert.Equal(t, "/tokenize/7f3a", attrs(s)["url.path"].AsString())
	assert.NotContains(t, attrs(s), attribute.Key("http.route"))
	e.requireIdle(t)
}

// TestProxyTracingUpstreamDown: a request no endpoint could serve is an
// error span naming the endpoint tried last and why.
func TestProxyTracingUpstreamDown(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	e := newEnv(t, Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}, nettest.RefusedAddr(t), nettest.RefusedAddr(t))
	r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"user","content":"hi"}]}`, nil)
	require.GreaterOrEqual(t, r.StatusCode, 500)
	s := endedSpans(t, rec, 1)[0]
	assert.Equal(t, int64(r.StatusCode), attrs(s)["http.response.status_code"].AsInt64())
	assert.Equal(t, "ep1", attrs(s)["inferroute.endpoint"].AsString())
	assert.Equal(t, int64(2), attrs(s)["inferroute.attempts"].AsInt64())
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Contains(t, s.Status().Description, "connect")
}

// TestProxyWithoutTracing: with no TracerProvider the client's trace
// context reaches the model server as it came.
func TestProxyWithoutTracing(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	require.Equal(t, 200, e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`,
		http.Header{"Traceparent": {clientTraceparent}}).StatusCode)
	assert.Equal(t, clientTraceparent, (<-got).header.Get("Traceparent"))
	e.rec.next(t)
}

// TestMiddlewareTracing: the Middleware's span covers its next handler,
// which gets the span in its request's context and header, and records
// what the handler answered and reported.
func TestMiddlewareTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock, TracerProvider: tp})
	require.NoError(t, err)
	var inCtx trace.SpanContext
	var inHeader string
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inCtx, inHeader = trace.SpanContextFromContext(r.Context()), r.Header.Get("Traceparent")
		d, _ := FromContext(r.Context())
		e.clock.Advance(40 * time.Millisecond)
		w.WriteHeader(502)
		_, _ = io.WriteString(w, "bad gateway")
		d.Done(signals.Outcome{PromptTokens: 3})
	})))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions/", strings.NewReader(`{"model":"llama","prompt":"x"}`))
	require.NoError(t, err)
	req.Header.Set("Traceparent", clientTraceparent)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, 502, resp.StatusCode)
	s := endedSpans(t, rec, 1)[0]
	assert.Equal(t, "POST /v1/completions", s.Name(), "the route without its trailing slash")
	assert.Equal(t, s.SpanContext(), inCtx, "the next handler runs in the span")
	assert.Equal(t, "00-"+clientTraceID+"-"+s.SpanContext().SpanID().String()+"-01", inHeader)
	assert.Equal(t, clientSpanID, s.Parent().SpanID().String())
	a := attrs(s)
	assert.Equal(t, int64(502), a["http.response.status_code"].AsInt64())
	assert.Equal(t, "ep0", a["inferroute.endpoint"].AsString())
	assert.Equal(t, int64(3), a["gen_ai.usage.input_tokens"].AsInt64(), "what the handler reported")
	assert.NotContains(t, a, attribute.Key("inferroute.ttft_ms"), "an error body's first byte is no token's")
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Contains(t, s.Status().Description, "502")
	e.rec.next(t)
}
