package main

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
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

// FuzzParseKeys feeds parseKeys arbitrary keys files. It never panics; a
// file it accepts has one distinct, non-empty name per key line; and no
// error repeats a key (a line's last field, when no line's name holds it).
func FuzzParseKeys(f *testing.F) {
	for _, seed := range []string{
		"team-a sk-team-a-0123456789abcdef\n# comment\n\nsk-lone-0123456789abcdef\n",
		"a sk-0123456789abcdef\r\nb sk-0123456789abcdeg\r\n",
		"a sk-0123456789abcdef\nb sk-0123456789abcdef\n",
		"a sk-0123456789abcdef\na sk-0123456789abcdeg\n",
		"a b c\n", "a short\n", "a sk-0123456789abcdé\n", "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ks, err := parseKeys(data)
		var keyLines, names, keys []string
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' {
				continue
			}
			keyLines = append(keyLines, line)
			switch fields := strings.Fields(line); len(fields) {
			case 1:
				keys = append(keys, fields[0])
			case 2:
				names, keys = append(names, fields[0]), append(keys, fields[1])
			}
		}
		if err != nil {
			for _, k := range keys {
				inName := slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, k) })
				if len(k) >= minKeyLen && !inName && strings.Contains(err.Error(), k) {
					t.Fatalf("the error repeats a key: %v", err)
				}
			}
			return
		}
		if len(ks.keys) != len(keyLines) {
			t.Fatalf("%d keys taken from %d key lines", len(ks.keys), len(keyLines))
		}
		seen := map[string]bool{}
		for _, k := range ks.keys {
			if k.name == "" || seen[k.name] {
				t.Fatalf("name %q empty or given twice", k.name)
			}
			seen[k.name] = true
		}
	})
}
