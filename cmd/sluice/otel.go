package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-rl/sluice/tracing"
)

// tracingFromEnv makes the decisions' tracer from the standard OpenTelemetry
// variables, or returns nil (tracing off, the default). Tracing is on when
// OTEL_TRACES_EXPORTER is otlp, an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or
// envoyproxy/ratelimit's TRACING_ENABLED=true; never with
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The exporter,
// sampler and batching read their own variables (OTEL_EXPORTER_OTLP_*,
// OTEL_TRACES_SAMPLER, OTEL_BSP_*). The returned function flushes the
// spans not yet sent, within 5 s.
func tracingFromEnv(log *slog.Logger) (*tracing.Tracer, func(), error) {
	off := func() {}
	exporter := os.Getenv("OTEL_TRACES_EXPORTER")
	switch {
	case os.Getenv("OTEL_SDK_DISABLED") == "true", exporter == "none":
		return nil, off, nil
	case exporter != "" && exporter != "otlp":
		return nil, off, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp or none", exporter)
	case exporter == "" && os.Getenv("TRACING_ENABLED") != "true" &&
		os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "":
		return nil, off, nil
	}
	protocol := firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL", "TRACING_EXPORTER_PROTOCOL")
	ctx := context.Background()
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf", "http":
		protocol = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, off, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, off, fmt.Errorf("OpenTelemetry exporter: %w", err)
	}
	name := "sluice"
	if v := os.Getenv("TRACING_SERVICE_NAME"); v != "" {
		name = v
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", name), attribute.String("service.version", buildVersion())),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, off, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	// The batcher's queue is bounded (OTEL_BSP_MAX_QUEUE_SIZE, 2048): spans
	// beyond it are dropped, never waited for by a decision.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("sluice: tracing decisions (OpenTelemetry)", "protocol", protocol,
		"endpoint", firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	return tracing.New(tp), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("sluice: spans not sent at exit", "error", err)
		}
	}, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}
