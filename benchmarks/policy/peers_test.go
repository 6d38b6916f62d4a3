package policy_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

// blocks returns n chained block hashes starting from seed.
func blocks(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed
	for i := range out {
		h = h*0x9e3779b97f4a7c15 + uint64(i) + 1
		out[i] = h
	}
	return out
}

func setScrape(ep *signals.Endpoint, waiting, kv float64) {
	ep.SetMetrics(&signals.Metrics{
		Waiting:            signals.Known(waiting),
		Running:            signals.Known(0),
		KVCacheUtilization: signals.Known(kv),
	})
}

// pick builds policy name on eps and picks req, returning the chosen index.
func pickIndex(t *testing.T, p policy.Policy, eps []*signals.Endpoint, req *signals.Request) (int, func(signals.Outcome)) {
	t.Helper()
	ch, err := p.Pick(context.Background(), req, eps)
	require.NoError(t, err)
	for i, ep := range eps {
		if ep == ch.Endpoint {
			return i, ch.Done
		}
	}
	t.Fatalf("foreign endpoint %v", ch.Endpoint)
	return -1, nil
}

func newPolicy(t *testing.T, name string, eps []*signals.Endpoint) policy.Policy {
	t.Helper()
	p, err := policy.Default().New(name, policy.Env{Endpoints: eps, Seed: 7})
	require.NoError(t, err)
	require.Equal(t, name, p.Name())
	return p
}

func TestPeersNoEndpoints(t *testing.T) {
	for _, name := range policy.Peers() {
		t.Run(name, func(t *testing.T) {
			p := newPolicy(t, name, nil)
			_, err := p.Pick(context.Background(), &signals.Request{PromptTokens: 1}, nil)
			require.ErrorIs(t, err, policy.ErrNoEndpoints)
		})
	}
}

func TestPeersAccounting(t *testing.T) {
	for _, name := range policy.Peers() {
		t.Run(name, func(t *testing.T) {
			eps := endpoints(3)
			p := newPolicy(t, name, eps)
			req := &signals.Request{PromptTokens: 100, PromptBlocks: blocks(1, 6)}
			i, done := pickIndex(t, p, eps, req)
			assert.Equal(t, int64(1), eps[i].InFlight())
			assert.Equal(t, int64(100), eps[i].InFlightTokens())
			done(signals.Outcome{})
			assert.Equal(t, int64(0), eps[i].InFlight())
			assert.Equal(t, int64(0), eps[i].InFlightTokens())
		})
	}
}

func TestGIE(t *testing.T) {
	t.Run("queue and kv", func(t *testing.T) {
		eps := endpoints(2)
		setScrape(eps[0], 10, 0.9)
		setScrape(eps[1], 0, 0.1)
		p := newPolicy(t, policy.GIE, eps)
		// pod-0: 2·0 + 2·0.1 = 0.2; pod-1: 2·1 + 2·0.9 = 3.8.
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 10})
		assert.Equal(t, 1, i)
	})
	t.Run("prefix outweighs a queue of four", func(t *testing.T) {
		eps := endpoints(2)
		setScrape(eps[0], 0, 0.5)
		setScrape(eps[1], 0, 0.5)
		p := newPolicy(t, policy.GIE, eps)
		bs := blocks(3, 8)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 128, PromptBlocks: bs})
		other := 1 - first
		// The holder now has a queue of 4 and the other none: holder
		// 2·0 + 2·0.5 + 3·1 = 4, other 2·1 + 2·0.5 + 3·0 = 3.
		setScrape(eps[first], 4, 0.5)
		setScrape(eps[other], 0, 0.5)
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 128, PromptBlocks: bs})
		assert.Equal(t, first, i)
		// Half the prompt matched: holder 1 + 3·0.5 = 2.5 < other 3.
		half := append(append([]uint64(nil), bs[:4]...), blocks(99, 4)...)
		i, _ = pickIndex(t, p, eps, &signals.Request{PromptTokens: 128, PromptBlocks: half})
		assert.Equal(t, other, i)
	})
}

func TestSGLangCacheAware(t *testing.T) {
	t.Run("cache hit above threshold", func(t *testing.T) {
		eps := endpoints(3)
		p := newPolicy(t, policy.SGLangCacheAware, eps)
		bs := blocks(5, 10)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		// 4 of 10 blocks (40% > 30%) match: the holder again, even with
		// requests in flight.
		q := append(append([]uint64(nil), bs[:4]...), blocks(6, 6)...)
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: q})
		assert.Equal(t, first, i)
	})
	t.Run("miss goes to the smallest tree", func(t *testing.T) {
		eps := endpoints(2)
		p := newPolicy(t, policy.SGLangCacheAware, eps)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: blocks(8, 10)})
		// 2 of 10 blocks match (20% ≤ 30%): the other pod, whose tree is
		// empty.
		q := append(append([]uint64(nil), blocks(8, 10)[:2]...), blocks(9, 8)...)
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: q})
		assert.Equal(t, 1-first, i)
	})
	t.Run("imbalance goes to the least loaded", func(t *testing.T) {
		eps := endpoints(2)
		p := newPolicy(t, policy.SGLangCacheAware, eps)
		bs := blocks(11, 10)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		// 70 requests in flight on the holder vs 1 elsewhere: 69 > 64 and
		// 70 > 1.5.
		for range 69 {
			eps[first].Dispatch(1)
		}
		eps[1-first].Dispatch(1)
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		assert.Equal(t, 1-first, i)
	})
	t.Run("difference of 64 is balanced", func(t *testing.T) {
		eps := endpoints(2)
		p := newPolicy(t, policy.SGLangCacheAware, eps)
		bs := blocks(12, 10)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		for range 63 {
			eps[first].Dispatch(1)
		}
		// 64 vs 0: not more than 64, cache affinity holds.
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		assert.Equal(t, first, i)
	})
}

func TestDynamoKV(t *testing.T) {
	eps := endpoints(2)
	p := newPolicy(t, policy.DynamoKV, eps)
	bs := blocks(21, 10)
	first, done := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
	other := 1 - first
	// Same prompt again after the first request finished: holder prefill
	// 0 + active 10 = 10 < other 10 + 10 = 20. (With the first still in
	// flight the shared blocks are active once, the same 10 < 20:
	// TestDynamoKVCountsSharedActiveBlocksOnce.)
	done(signals.Outcome{})
	i, done2 := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
	assert.Equal(t, first, i)
	// With both requests on the holder in flight (done2 pending): a fresh
	// prompt of 10 blocks costs holder 10 + (10+10) = 30, other 10 + 10 = 20.
	j, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: blocks(22, 10)})
	assert.Equal(t, other, j)
	done2(signals.Outcome{})
}

func TestAIBrixPrefix(t *testing.T) {
	bs := blocks(31, 32) // 512 tokens = 4 AIBrix blocks of 128 tokens
	t.Run("prefix within mean plus stddev", func(t *testing.T) {
		eps := endpoints(3)
		p := newPolicy(t, policy.AIBrixPrefix, eps)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 512, PromptBlocks: bs})
		for i := range eps {
			if i != first {
				eps[i].Dispatch(1)
			}
		}
		// Loads 1,1,1: mean 1, std 0; the holder's 1 ≤ 1 keeps the prefix.
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 512, PromptBlocks: bs})
		assert.Equal(t, first, i)
		// Loads now 2,1,1: mean 4/3, sample std √(1/3) ≈ 0.577, bound 1.91
		// < 2: the least loaded instead.
		j, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 512, PromptBlocks: bs})
		assert.NotEqual(t, first, j)
	})
	t.Run("imbalance above 8", func(t *testing.T) {
		eps := endpoints(2)
		p := newPolicy(t, policy.AIBrixPrefix, eps)
		first, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 512, PromptBlocks: bs})
		for range 8 {
			eps[first].Dispatch(1)
		}
		// 9 vs 0 > 8: least loaded.
		i, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 512, PromptBlocks: bs})
		assert.Equal(t, 1-first, i)
	})
}

func TestSGLangLeastLoad(t *testing.T) {
	eps := endpoints(3)
	p := newPolicy(t, policy.SGLangLeastLoad, eps)
	eps[0].Dispatch(500)
	eps[1].Dispatch(100)
	eps[1].Dispatch(100)
	eps[2].Dispatch(300)
	// Loads 500, 200, 300 prompt tokens: pod-1.
	i, done := pickIndex(t, p, eps, &signals.Request{PromptTokens: 200})
	assert.Equal(t, 1, i)
	// Now 500, 400, 300: pod-2.
	j, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 10})
	assert.Equal(t, 2, j)
	done(signals.Outcome{})
	// 500, 200, 310: pod-1 again; equal loads go to the first.
	k, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 10})
	assert.Equal(t, 1, k)
}
