package scrape

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferroute/inferroute/signals"
)

// engineOf returns the built-in engine whose map reads a fixture file.
func engineOf(file string) string {
	switch {
	case strings.HasPrefix(file, "sglang"):
		return EngineSGLang
	case strings.HasPrefix(file, "tgi"):
		return EngineTGI
	case strings.HasPrefix(file, "triton"):
		return EngineTritonTensorRTLLM
	}
	return EngineVLLM
}

// BenchmarkScrapeParse compares, on every fixture page, a complete
// prom2json parse (full) with the fast line scanner (fast). Both extract the
// same Page; the target is fast ≤ 1/20 of full in ns/op and allocs/op on the
// vLLM and TGI pages.
func BenchmarkScrapeParse(b *testing.B) {
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.prom"))
	if err != nil || len(files) == 0 {
		b.Fatalf("no fixtures in %s: %v", fixtureDir, err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".prom")
		page := readFixture(b, filepath.Base(f))
		m, _ := BuiltinMap(engineOf(name))
		p, err := NewParser(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/full", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(page)))
			for b.Loop() {
				if _, err := p.ParseFullBytes(page); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(page)))
			for b.Loop() {
				if _, err := p.Parse(page); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScrape measures one whole scrape of the vLLM V0 page over
// loopback HTTP (request, read, parse, snapshot, publication), server side
// included. It is context for the parse numbers, not a target.
func BenchmarkScrape(b *testing.B) {
	page := readFixture(b, "vllm-v0.prom")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(page)
	}))
	defer srv.Close()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "v", Address: srv.Listener.Addr().String()})
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	s.SetEndpoints([]*signals.Endpoint{ep})
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(page)))
	for b.Loop() {
		if err := s.Scrape(ctx, ep); err != nil {
			b.Fatal(err)
		}
	}
}
