package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

// TestAIBrixEqualMatchGoesToFewerRequests: AIBrix sorts the matched pods
// by decreasing match percentage and, for equal percentages, by
// increasing request count ("for same prefix_match_percent, sort in
// increasing running_request count", pkg/plugins/gateway/algorithms
// README and getTargetPodFromMatchedPods), then takes the first within
// mean + stddev. Two pods holding the whole prompt, both within the bound,
// must resolve to the less loaded one whatever the seed.
func TestAIBrixEqualMatchGoesToFewerRequests(t *testing.T) {
	bs := blocks(77, 32) // 512 tokens: 4 AIBrix blocks
	req := func() *signals.Request { return &signals.Request{PromptTokens: 512, PromptBlocks: bs} }
	for seed := uint64(1); seed <= 24; seed++ {
		eps := endpoints(4)
		p, err := policy.Default().New(policy.AIBrixPrefix, policy.Env{Endpoints: eps, Seed: seed})
		require.NoError(t, err)
		// Loads 0,1,1,1: no match, least loaded pod-0 gets the prompt.
		for _, i := range []int{1, 2, 3} {
			eps[i].Dispatch(1)
		}
		i, _ := pickIndex(t, p, eps, req())
		require.Equal(t, 0, i)
		// Loads 3,1,2,2: mean 2, sample std √(2/3) ≈ 0.82; pod-0's 3 is
		// above 2.82, so the least loaded pod-1 gets the prompt too.
		eps[0].Dispatch(1)
		eps[0].Dispatch(1)
		eps[2].Dispatch(1)
		eps[3].Dispatch(1)
		i, _ = pickIndex(t, p, eps, req())
		require.Equal(t, 1, i)
		// Loads 3,2,4,4: mean 3.25, sample std ≈ 0.96, bound ≈ 4.2. Pods 0
		// and 1 both match 100% and are within the bound; pod-1 has fewer
		// requests.
		for range 2 {
			eps[2].Dispatch(1)
			eps[3].Dispatch(1)
		}
		i, _ = pickIndex(t, p, eps, req())
		require.Equal(t, 1, i, "seed %d: equal matches go to the pod with fewer requests", seed)
	}
}

// TestPeersPickOnANewFleetWithoutPromptBlocks: the fleet given to Pick may
// differ from Env.Endpoints ("the same slice ... unless the fleet
// changes"), and a prompt shorter than one block has no PromptBlocks.
// Every peer must still pick one of the endpoints it is given.
func TestPeersPickOnANewFleetWithoutPromptBlocks(t *testing.T) {
	for _, name := range policy.Peers() {
		t.Run(name, func(t *testing.T) {
			p := newPolicy(t, name, nil)
			eps := endpoints(3)
			var i int
			require.NotPanics(t, func() { i, _ = pickIndex(t, p, eps, &signals.Request{PromptTokens: 5}) })
			require.True(t, i >= 0 && i < len(eps))
		})
	}
}

// TestDynamoKVCountsSharedActiveBlocksOnce: Dynamo's potential active
// blocks are the worker's active blocks plus the request's blocks not
// already among them (ActiveSequences: potential_blocks = new_blocks +
// active_blocks, new_blocks counting the blocks absent from the worker's
// unique_blocks), so a prompt shared with a request in flight adds no
// decode blocks. Two workers, a 10-block prompt in flight on the holder,
// the same prompt again: holder cost = 1.0 × (10 − 10) + (10 + 0) = 10,
// other = 1.0 × 10 + (0 + 10) = 20, so the holder wins whatever the seed
// (counting the shared blocks twice makes it a 20–20 tie).
func TestDynamoKVCountsSharedActiveBlocksOnce(t *testing.T) {
	bs := blocks(21, 10)
	for seed := uint64(1); seed <= 24; seed++ {
		eps := endpoints(2)
		p, err := policy.Default().New(policy.DynamoKV, policy.Env{Endpoints: eps, Seed: seed})
		require.NoError(t, err)
		first, done1 := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		i, done2 := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: bs})
		require.Equal(t, first, i, "seed %d: the shared prompt's blocks are active once", seed)
		// Both in flight hold the same 10 blocks: a fresh 10-block prompt
		// costs holder 10 + (10 + 10) = 30, other 10 + (0 + 10) = 20.
		j, done3 := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: blocks(22, 10)})
		require.Equal(t, 1-first, j, "seed %d", seed)
		// Once the first two finish, the holder's blocks are free: a
		// third prompt costs holder 10 + 10 = 20, other 10 + (10 + 10)
		// = 30.
		done1(signals.Outcome{})
		done2(signals.Outcome{})
		k, _ := pickIndex(t, p, eps, &signals.Request{PromptTokens: 160, PromptBlocks: blocks(23, 10)})
		require.Equal(t, first, k, "seed %d: finished requests release their blocks", seed)
		done3(signals.Outcome{})
	}
}
