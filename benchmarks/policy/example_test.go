package policy_test

import (
	"context"
	"fmt"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

// firstPolicy always picks the first endpoint: the smallest policy there is.
type firstPolicy struct{}

func (firstPolicy) Name() string { return "first" }

func (firstPolicy) Pick(_ context.Context, req *signals.Request, eps []*signals.Endpoint) (policy.Choice, error) {
	if len(eps) == 0 {
		return policy.Choice{}, policy.ErrNoEndpoints
	}
	ep := eps[0]
	ep.Dispatch(req.PromptTokens)
	return policy.Choice{Endpoint: ep, Done: func(signals.Outcome) { ep.Complete(req.PromptTokens) }}, nil
}

// ExampleRegistry adds a policy to the default registry, where routebench's
// suite finds it by name.
func ExampleRegistry() {
	r := policy.Default()
	if err := r.Register("first", func(policy.Env) (policy.Policy, error) { return firstPolicy{}, nil }); err != nil {
		panic(err)
	}
	fmt.Println(r.Names())

	eps := []*signals.Endpoint{
		signals.NewEndpoint(signals.EndpointSpec{Name: "a", Address: "10.0.0.1:8000"}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "b", Address: "10.0.0.2:8000"}),
	}
	p, err := r.New("first", policy.Env{Endpoints: eps})
	if err != nil {
		panic(err)
	}
	ch, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 100}, eps)
	if err != nil {
		panic(err)
	}
	fmt.Println(ch.Endpoint.Name, ch.Endpoint.InFlight())
	ch.Done(signals.Outcome{})
	fmt.Println(ch.Endpoint.InFlight())
	// Output:
	// [aibrix-prefix dynamo-kv first inferroute least-request llm-d oracle random round-robin sglang-cache-aware sglang-least-load]
	// a 1
	// 0
}
