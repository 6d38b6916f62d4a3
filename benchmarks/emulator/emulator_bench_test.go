package emulator

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkStreamingRequest measures one streaming chat request of 16
// output tokens through a pod running 1000× faster than the GPU it models,
// so that the emulator's own HTTP, JSON and locking costs dominate.
func BenchmarkStreamingRequest(b *testing.B) {
	p, err := Start(context.Background(), Options{Speed: 1000, Lifetime: 10 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	body := `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"` + prompt640 +
		`"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":16}`
	client := &http.Client{}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := client.Post(p.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkMetricsPage measures rendering the /metrics page.
func BenchmarkMetricsPage(b *testing.B) {
	p, err := Start(context.Background(), Options{Adapters: []string{"a", "b"}, Lifetime: 10 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	buf := make([]byte, 0, 8<<10)
	b.ReportAllocs()
	for b.Loop() {
		buf = p.appendMetrics(buf[:0])
	}
}
