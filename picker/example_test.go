package picker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// scraped returns an endpoint whose last scrape reported the given load, as
// signals/scrape would publish it.
func scraped(name string, running, waiting, kv float64) *signals.Endpoint {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: name, Address: name + ":8000", Model: "llama-3-8b"})
	ep.SetMetrics(&signals.Metrics{
		ScrapedAt:          time.Unix(0, 0),
		Running:            signals.Known(running),
		Waiting:            signals.Known(waiting),
		KVCacheUtilization: signals.Known(kv),
	})
	return ep
}

// The default picker over three endpoints: the one with the shortest queue
// and the emptiest KV cache wins, and the others are ranked as fallbacks.
func Example() {
	p, err := picker.New(picker.DefaultConfig(), picker.WithClock(signalstest.NewClock(time.Unix(0, 0))))
	if err != nil {
		log.Fatal(err)
	}
	p.SetEndpoints([]*signals.Endpoint{
		scraped("pod-a", 12, 6, 0.91),
		scraped("pod-b", 4, 0, 0.35),
		scraped("pod-c", 8, 2, 0.60),
	})
	res, err := p.Pick(context.Background(), &signals.Request{Model: "llama-3-8b", PromptTokens: 900})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("chosen:", res.Endpoint.Name)
	for _, f := range res.Fallbacks {
		fmt.Println("fallback:", f.Name)
	}
	res.Done(picker.DoneInfo{TTFT: 120 * time.Millisecond, Latency: 2 * time.Second})
	// Output:
	// chosen: pod-b
	// fallback: pod-c
	// fallback: pod-a
}

// Example_readme is the library example shown in README.md.
func Example_readme() {
	ctx := context.Background()
	p, err := picker.New(picker.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	p.SetEndpoints([]*signals.Endpoint{
		signals.NewEndpoint(signals.EndpointSpec{Name: "h100-0", Address: "10.0.0.1:8000"}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "a100-0", Address: "10.0.0.2:8000"}),
	})

	res, err := p.Pick(ctx, &signals.Request{Model: "llama-3-8b", PromptTokens: 900})
	if err != nil {
		log.Fatal(err) // errors.Is(err, picker.ErrNoEndpoints) → 503, picker.ErrSaturated → 429
	}
	// ... send the request to res.Endpoint.Address; account a retry on res.Fallbacks with p.Assign ...
	fmt.Println(len(res.Fallbacks), "fallback")
	res.FirstToken() // when the first response byte arrives
	ttft, total := 150*time.Millisecond, 3*time.Second
	res.Done(picker.DoneInfo{TTFT: ttft, Latency: total})
	// Output: 1 fallback
}

// zoneScorer prefers endpoints in the request's zone: a custom scorer is a
// type with one method.
type zoneScorer struct{}

func (zoneScorer) Score(_ context.Context, in *scorer.Input, out []float64) {
	want := in.Request.Headers.Get("x-zone")
	for i, ep := range in.Endpoints {
		out[i] = 0
		if want != "" && ep.Labels["zone"] == want {
			out[i] = 1
		}
	}
}

// A custom scorer registered by name and weighted from YAML next to a
// built-in one. The zone preference (weight 3) outweighs a slightly longer
// queue (weight 1).
func Example_customScorer() {
	reg := scorer.NewRegistry()
	if err := reg.RegisterScorer("zone", func(scorer.Params, scorer.Env) (scorer.Scorer, error) {
		return zoneScorer{}, nil
	}); err != nil {
		log.Fatal(err)
	}
	cfg, err := picker.ParseConfig([]byte(`
scorers:
  - name: queue
    weight: 1
  - name: zone
    weight: 3
`))
	if err != nil {
		log.Fatal(err)
	}
	p, err := picker.New(cfg, picker.WithRegistry(reg), picker.WithClock(signalstest.NewClock(time.Unix(0, 0))))
	if err != nil {
		log.Fatal(err)
	}
	east, west := scraped("east-0", 2, 1, 0.5), scraped("west-0", 2, 3, 0.5)
	east.Labels = map[string]string{"zone": "us-east"}
	west.Labels = map[string]string{"zone": "us-west"}
	p.SetEndpoints([]*signals.Endpoint{east, west})

	req := &signals.Request{Headers: map[string][]string{"X-Zone": {"us-west"}}}
	res, err := p.Pick(context.Background(), req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Endpoint.Name)
	res.Done(picker.DoneInfo{})
	// Output: west-0
}

// Reading the breakdown of a decision: every candidate's weighted
// contribution from each scorer, with the raw value behind it.
func ExampleBreakdown() {
	cfg := picker.Config{Scorers: []picker.Plugin{
		{Name: scorer.ScorerQueue, Weight: 2},
		{Name: scorer.ScorerKVCache, Weight: 2},
	}}
	p, err := picker.New(cfg, picker.WithClock(signalstest.NewClock(time.Unix(0, 0))))
	if err != nil {
		log.Fatal(err)
	}
	p.SetEndpoints([]*signals.Endpoint{scraped("pod-a", 3, 4, 0.80), scraped("pod-b", 3, 0, 0.40)})
	res, err := p.Pick(context.Background(), nil)
	if err != nil {
		log.Fatal(err)
	}
	b := res.Breakdown
	for s, name := range b.Scorers() {
		fmt.Printf("%-8s pod-a %.2f (raw %.2f)  pod-b %.2f (raw %.2f)\n", name,
			b.Contribution(s, 0), b.Raw(s, 0), b.Contribution(s, 1), b.Raw(s, 1))
	}
	fmt.Printf("total    pod-a %.2f  pod-b %.2f  → %s\n", b.Total(0), b.Total(1), res.Endpoint.Name)
	res.Done(picker.DoneInfo{})
	// Output:
	// queue    pod-a 0.00 (raw 4.00)  pod-b 2.00 (raw 0.00)
	// kv-cache pod-a 0.40 (raw 0.80)  pod-b 1.20 (raw 0.40)
	// total    pod-a 0.40  pod-b 3.20  → pod-b
}

// Errors are typed: branch on the sentinel with errors.Is, read the detail
// with errors.As.
func ExampleError() {
	p, err := picker.New(picker.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_, err = p.Pick(context.Background(), nil)
	var pe *picker.Error
	fmt.Println(errors.Is(err, picker.ErrNoEndpoints), errors.As(err, &pe) && pe.Stage == "pool")
	// Output: true true
}
