package main

import (
	"context"
	"log/slog"
	"os"
	"testing"
)

// FuzzParseConfig feeds ParseConfig arbitrary files. It never panics; a
// configuration it accepts has its defaults filled and at least one pool;
// NewGateway builds it or refuses it with an error; and one that builds
// reloads onto itself, which must change nothing and succeed.
func FuzzParseConfig(f *testing.F) {
	example, err := os.ReadFile("gateway.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example),
		gatewayYAML("127.0.0.1:8001", "127.0.0.1:8002"),
		twoPools([]string{"127.0.0.1:8001"}, "127.0.0.1:8003", "    picker:\n      scorers: [{name: queue, weight: 1}]\n"),
		"pools: [{name: a}]",
		"pools: [{name: a, models: [m], adapters: {l: m}, aliases: {x: l}, admission: {shedTTFTMs: 100}}]",
		"tls: {certFile: a.pem, keyFile: a.key}\npools: [{name: a}]",
		"router: {upstreamScheme: https}\npools: [{name: a, endpoints: [{address: 'h:1', engine: sglang, labels: {z: a}}]}]",
		"defaultPool: b\nfallbackPool: a\npools: [{name: a}, {name: b, models: [m]}]",
	} {
		f.Add([]byte(seed))
	}
	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		if cfg.Listen == "" || cfg.ReadHeaderTimeout <= 0 || cfg.IdleTimeout <= 0 || cfg.DrainTimeout <= 0 ||
			cfg.LogLevel == "" || len(cfg.Pools) == 0 {
			t.Fatalf("accepted without its defaults: %+v", cfg)
		}
		g, err := NewGateway(cfg, log)
		if err != nil {
			return
		}
		defer func() { _ = g.Close(context.Background()) }()
		if err := g.Reload(cfg); err != nil {
			t.Fatalf("a configuration that built does not reload onto itself: %v", err)
		}
	})
}
