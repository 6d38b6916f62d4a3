package main

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver: what the gateway exported.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	svc   []string // each batch's service.name
}

func newCollector(t *testing.T) (*httptest.Server, *collector) {
	t.Helper()
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP trace export", http.StatusNotFound)
			return
		}
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		var req collectortrace.ExportTraceServiceRequest
		require.NoError(t, proto.Unmarshal(b, &req))
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					c.svc = append(c.svc, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv, c
}

// TestTracesExported: with OTEL_EXPORTER_OTLP_ENDPOINT set, the gateway
// exports a server span per request, in the client's trace, with the
// picker's span under it, and the model server gets the gateway's span
// as its parent; Close flushes what is batched.
func TestTracesExported(t *testing.T) {
	col, c := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	pod, parents := headerPod(t, "Traceparent")
	cfg, err := ParseConfig([]byte(gatewayYAML(pod.Listener.Addr().String())))
	require.NoError(t, err)
	g, err := newGateway(cfg, slog.New(slog.DiscardHandler), io.Discard)
	require.NoError(t, err)
	require.NotNil(t, g.tp, "tracing on")

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	w := httptest.NewRecorder()
	g.Handler().ServeHTTP(w, r)
	require.Equal(t, 200, w.Code, w.Body.String())
	upstream := strings.Join(<-parents, ",")
	require.NoError(t, g.Close(context.Background()))

	c.mu.Lock()
	defer c.mu.Unlock()
	var server, pick *tracepb.Span
	for _, s := range c.spans {
		switch s.Name {
		case "POST /v1/chat/completions":
			server = s
		case "inferroute.Pick":
			pick = s
		}
	}
	require.NotNil(t, server, "the request's span was exported")
	require.NotNil(t, pick, "the pick's span was exported")
	assert.Equal(t, traceID, hex.EncodeToString(server.TraceId), "in the client's trace")
	assert.Equal(t, clientSpan, hex.EncodeToString(server.ParentSpanId))
	assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, server.Kind)
	assert.Equal(t, server.SpanId, pick.ParentSpanId, "the pick is the request's child")
	assert.Equal(t, "00-"+traceID+"-"+hex.EncodeToString(server.SpanId)+"-01", upstream,
		"the model server's parent is the gateway's span")
	got := map[string]string{}
	for _, kv := range server.Attributes {
		got[kv.Key] = kv.GetValue().String()
	}
	assert.Contains(t, got["inferroute.pool"], "llama")
	assert.Contains(t, got["inferroute.endpoint"], "pod-a")
	assert.Contains(t, got["gen_ai.request.model"], "llama")
	assert.Contains(t, c.svc, "inferroute-gateway")
}

// TestTracesOff: without a collector named, or with
// OTEL_TRACES_EXPORTER=none, nothing is traced; a protocol the gateway
// cannot export is refused at start rather than exporting nowhere.
func TestTracesOff(t *testing.T) {
	build := func() *Gateway {
		t.Helper()
		cfg, err := ParseConfig([]byte("pools: [{name: a}]"))
		require.NoError(t, err)
		g, err := NewGateway(cfg, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		return g
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	assert.Nil(t, build().tp, "no collector named")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	assert.Nil(t, build().tp, "OTEL_TRACES_EXPORTER=none")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	err := buildConfig("pools: [{name: a}]")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `traces: OTLP protocol "grpc": the gateway exports over http/protobuf only`)
}
