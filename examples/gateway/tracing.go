package main

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// newTracerProvider returns the provider of the gateway's spans (the
// router's span per request, the pickers' span per pick), which exports
// them in batches by OTLP over HTTP, or nil when no collector is named.
// It is configured the standard way, by environment variables (the
// OpenTelemetry SDK specification's): OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names the collector and turns
// tracing on, OTEL_TRACES_EXPORTER=none turns it off again,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG choose the sampler
// (default: every trace a client has not sampled out, parentbased_always_on),
// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT and _COMPRESSION tune the
// exporter. A protocol other than http/protobuf is refused rather than
// exporting nowhere.
func newTracerProvider(ctx context.Context, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	if os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return nil, nil
	}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	if p := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("traces: OTLP protocol %q: the gateway exports over http/protobuf only", p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("traces: OTLP exporter: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// tracerProvider is g's provider as the interface the router and the
// pickers take: nil, not a nil pointer in an interface, when tracing is
// off.
func (g *Gateway) tracerProvider() trace.TracerProvider {
	if g.tp == nil {
		return nil
	}
	return g.tp
}
