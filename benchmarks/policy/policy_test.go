package policy_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

func endpoints(n int) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, n)
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{
			Name:    fmt.Sprintf("pod-%d", i),
			Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Model:   "m",
		})
	}
	return eps
}

func TestRegistry(t *testing.T) {
	nop := func(policy.Env) (policy.Policy, error) { return nil, nil }
	tests := []struct {
		name    string
		regs    []string
		factory policy.Factory
		wantErr string
	}{
		{name: "ok", regs: []string{"a", "b"}, factory: nop},
		{name: "duplicate", regs: []string{"a", "a"}, factory: nop, wantErr: `"a" already registered`},
		{name: "empty name", regs: []string{""}, factory: nop, wantErr: "empty name"},
		{name: "nil factory", regs: []string{"a"}, wantErr: "nil factory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r policy.Registry
			var err error
			for _, n := range tt.regs {
				if err = r.Register(n, tt.factory); err != nil {
					break
				}
			}
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.regs, r.Names())
		})
	}
}

func TestDefaultRegistry(t *testing.T) {
	r := policy.Default()
	assert.Equal(t, []string{"aibrix-prefix", "dynamo-kv", "inferroute", "least-request", "llm-d", "oracle",
		"random", "round-robin", "sglang-cache-aware", "sglang-least-load"}, r.Names())
	_, err := r.New("nope", policy.Env{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown policy "nope"`)
	for _, name := range []string{policy.RoundRobin, policy.Random, policy.LeastRequest} {
		p, err := r.New(name, policy.Env{Seed: 1})
		require.NoError(t, err)
		assert.Equal(t, name, p.Name())
	}
}

func TestNoEndpoints(t *testing.T) {
	r := policy.Default()
	for _, name := range policy.Baselines() {
		t.Run(name, func(t *testing.T) {
			p, err := r.New(name, policy.Env{Seed: 1})
			require.NoError(t, err)
			_, err = p.Pick(context.Background(), &signals.Request{Model: "m"}, nil)
			require.Error(t, err)
		})
	}
}

func TestRoundRobinCycles(t *testing.T) {
	eps := endpoints(3)
	p, err := policy.NewRoundRobin(policy.Env{})
	require.NoError(t, err)
	want := []int{0, 1, 2, 0, 1, 2, 0}
	for i, w := range want {
		ch, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 10}, eps)
		require.NoError(t, err)
		assert.Same(t, eps[w], ch.Endpoint, "pick %d", i)
	}
}

// TestAccounting checks that the baselines keep the endpoints' local
// accounting: a pick is a Dispatch of the prompt tokens, Done a Complete.
func TestAccounting(t *testing.T) {
	for _, name := range []string{policy.RoundRobin, policy.Random, policy.LeastRequest} {
		t.Run(name, func(t *testing.T) {
			eps := endpoints(2)
			p, err := policy.Default().New(name, policy.Env{Seed: 3})
			require.NoError(t, err)
			var dones []func(signals.Outcome)
			for range 10 {
				ch, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 100}, eps)
				require.NoError(t, err)
				dones = append(dones, ch.Done)
			}
			total := eps[0].InFlight() + eps[1].InFlight()
			assert.Equal(t, int64(10), total)
			assert.Equal(t, int64(1000), eps[0].InFlightTokens()+eps[1].InFlightTokens())
			for _, d := range dones {
				d(signals.Outcome{})
			}
			assert.Equal(t, int64(0), eps[0].InFlight()+eps[1].InFlight())
			c := eps[0].Counters()
			c1 := eps[1].Counters()
			assert.Equal(t, uint64(10), c.Dispatched+c1.Dispatched)
			assert.Equal(t, uint64(10), c.Completed+c1.Completed)
		})
	}
}

func TestLeastRequestPicksFewestInFlight(t *testing.T) {
	eps := endpoints(4)
	// In flight: 3, 1, 0, 2 → pod 2 first.
	for i, n := range []int{3, 1, 0, 2} {
		for range n {
			eps[i].Dispatch(1)
		}
	}
	p, err := policy.NewLeastRequest(policy.Env{Seed: 1})
	require.NoError(t, err)
	ch, err := p.Pick(context.Background(), &signals.Request{}, eps)
	require.NoError(t, err)
	assert.Same(t, eps[2], ch.Endpoint)
	// Now pods 1 and 2 both have 1: the next pick is one of them.
	ch, err = p.Pick(context.Background(), &signals.Request{}, eps)
	require.NoError(t, err)
	assert.Contains(t, []*signals.Endpoint{eps[1], eps[2]}, ch.Endpoint)
}

// TestLeastRequestSpreadsTies checks that with every pick held open, n
// picks over n endpoints land on n distinct endpoints, whatever the ties.
func TestLeastRequestSpreadsTies(t *testing.T) {
	eps := endpoints(8)
	p, err := policy.NewLeastRequest(policy.Env{Seed: 7})
	require.NoError(t, err)
	seen := map[*signals.Endpoint]bool{}
	for range 8 {
		ch, err := p.Pick(context.Background(), &signals.Request{}, eps)
		require.NoError(t, err)
		seen[ch.Endpoint] = true
	}
	assert.Len(t, seen, 8)
}

func TestRandomIsSeededAndSpread(t *testing.T) {
	eps := endpoints(4)
	picks := func(seed uint64) []int {
		p, err := policy.NewRandom(policy.Env{Seed: seed})
		require.NoError(t, err)
		idx := map[*signals.Endpoint]int{}
		for i, ep := range eps {
			idx[ep] = i
		}
		out := make([]int, 4000)
		for i := range out {
			ch, err := p.Pick(context.Background(), &signals.Request{}, eps)
			require.NoError(t, err)
			ch.Done(signals.Outcome{})
			out[i] = idx[ch.Endpoint]
		}
		return out
	}
	a, b, c := picks(1), picks(1), picks(2)
	assert.Equal(t, a, b, "same seed, same picks")
	assert.NotEqual(t, a, c, "different seed, different picks")
	counts := make([]int, 4)
	for _, i := range a {
		counts[i]++
	}
	// 1000 expected per endpoint; binomial sd ≈ 27, so ±150 is > 5 sd.
	for i, n := range counts {
		assert.InDelta(t, 1000, n, 150, "endpoint %d", i)
	}
}

func TestInferroutePicksFromFleet(t *testing.T) {
	eps := endpoints(3)
	p, err := policy.Default().New(policy.Inferroute, policy.Env{Endpoints: eps, Seed: 1})
	require.NoError(t, err)
	assert.Equal(t, policy.Inferroute, p.Name())
	ch, err := p.Pick(context.Background(), &signals.Request{Model: "m", PromptTokens: 10}, eps)
	require.NoError(t, err)
	assert.Contains(t, eps, ch.Endpoint)
	require.NotNil(t, ch.Done)
	assert.Equal(t, int64(1), ch.Endpoint.InFlight())
	ch.Done(signals.Outcome{})
	assert.Equal(t, int64(0), ch.Endpoint.InFlight())

	// A different fleet is swapped in.
	other := endpoints(2)
	ch, err = p.Pick(context.Background(), &signals.Request{Model: "m", PromptTokens: 10}, other)
	require.NoError(t, err)
	assert.Contains(t, other, ch.Endpoint)
	ch.Done(signals.Outcome{})
}
