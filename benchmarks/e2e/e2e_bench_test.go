package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferroute/inferroute/benchmarks/emulator"
)

// BenchmarkGatewayStream measures one streaming completion of 16 tokens
// from a client through the gateway (router.Proxy, default picker,
// scraper) to an emulated H100 pod running 1000× faster than the GPU, so
// that HTTP, SSE relaying and picking dominate.
func BenchmarkGatewayStream(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := emulator.StartFleet(ctx, []emulator.Options{{Speed: 1000, Lifetime: 10 * time.Minute}})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	g, err := StartGateway(ctx, f, GatewayConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	body := `{"model":"` + emulator.DefaultModel + `","prompt":"` + strings.Repeat("benchmark ", 64) + `","max_tokens":16,"stream":true}`
	client := newClient()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := client.Post(g.URL()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}
