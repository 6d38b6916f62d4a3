package latency_test

import (
	"fmt"
	"time"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
)

// The predictor starts from a prior scaled by the endpoint's GPU label,
// then learns the endpoint's real behaviour from outcomes. Here the
// endpoint's TTFT is 20 ms + prompt tokens / 10000 tokens/s: 0.22 s for
// 2000 tokens, 0.12 s with half of them cached. (The ridge prior keeps the
// fit within about 1% of that.)
func ExamplePredictor() {
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	p := latency.New(latency.Config{Clock: clk})
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-a", Address: "10.0.0.7:8000",
		Labels: map[string]string{signals.LabelGPU: "h100"}})
	req := &signals.Request{PromptTokens: 2000}

	// Prior: 50 ms + 2 kilotokens × 0.25 s / 2.2 (an H100 is 2.2× an A100).
	v, _ := p.PredictTTFT(req, ep, 0)
	fmt.Printf("prior: %.0f ms, confidence %.1f\n", v*1000, p.Confidence(ep))

	for i := 0; i < 60; i++ {
		r := &signals.Request{PromptTokens: 500 + 50*i}
		ep.Dispatch(r.PromptTokens) // the picker does this, then tells observers
		p.Dispatched(r, ep)
		ttft := 0.020 + float64(r.PromptTokens)/10000
		clk.t = clk.t.Add(100 * time.Millisecond)
		ep.Complete(r.PromptTokens)
		p.Completed(r, ep, signals.Outcome{TTFT: time.Duration(ttft * float64(time.Second))})
	}

	v, _ = p.PredictTTFT(req, ep, 0)
	fmt.Printf("learned: %.2f s, confidence %.1f\n", v, p.Confidence(ep))
	v, _ = p.PredictTTFT(req, ep, 0.5) // half the prompt already cached
	fmt.Printf("half cached: %.2f s\n", v)
	tp, _ := ep.Throughput()
	fmt.Printf("prefill throughput: %.0fk tokens/s\n", tp/1000)
	// Output:
	// prior: 277 ms, confidence 0.2
	// learned: 0.22 s, confidence 1.0
	// half cached: 0.12 s
	// prefill throughput: 10k tokens/s
}
