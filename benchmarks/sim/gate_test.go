//go:build !race

// The gate simulates a single goroutine deterministically; the race
// detector has nothing to find there and slows it tenfold, so it is built
// without -race only. .ci/run runs it as
//
//	go test -run TestQuickSuiteGate ./benchmarks/sim

package sim

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/policy"
)

// TestQuickSuiteGate is the CI regression gate on the quick suite (issue 7):
// inferroute's default picker must beat round-robin on p99 TTFT in every
// scenario at every load — hetero (mixed GPUs), bursty (shared prompts,
// LoRA, bursts), prefix (Mooncake) and azure (two Azure tenants, heavy-
// tailed prompts) — except in uniform (identical GPUs, Poisson, nothing
// shared), where round-robin's even spacing is close to the best and it
// must stay within 5% of round-robin on mean and p99 TTFT. It needs the
// shared traces beside the repository for the prefix and azure scenarios,
// and fails if they are missing (CI has them).
func TestQuickSuiteGate(t *testing.T) {
	rep, err := RunSuite(context.Background(), Options{
		Quick:     true,
		Policies:  []string{policy.RoundRobin, policy.Inferroute},
		TracesDir: tracesDir,
	})
	require.NoError(t, err)
	require.Empty(t, rep.Skipped, "the quick suite needs %s", tracesDir)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Logf("quick suite:\n%s", table.String())
	require.Len(t, rep.Scenarios, 5*len(DefaultLoads))
	for _, s := range rep.Scenarios {
		rr, ir := gatePair(t, &s)
		require.Zero(t, ir.Failed, "%s at %.0f%%: inferroute failed requests", s.Name, 100*s.Load)
		if s.Name == "uniform" {
			assertWithinRoundRobin(t, "", &s, rr, ir)
			continue
		}
		assert.Less(t, ir.TTFTP99, rr.TTFTP99,
			"%s at %.0f%%: inferroute p99 TTFT %.1f ms does not beat round-robin's %.1f ms",
			s.Name, 100*s.Load, 1000*ir.TTFTP99, 1000*rr.TTFTP99)
	}
}

// TestQuickSuiteGateUniformSeeds holds the uniform fleet's rule of the gate
// above over forty more seeds, as a statistical rule. One seed is a thin
// guard: the quick suite's runs are short (2 500 requests, so its p99 is
// the 26th-worst TTFT), and a picker can pass at seed 1 while something
// piles requests on one pod at other seeds. Two such faults were found
// that way. Session 37's first retuning (queue 1.25, KV cache 8) passed
// the full suite at seeds 1–10 but made the p99 up to 2.7× round-robin's
// (725 against 272 ms at seed 5, 90% load). And the latency predictor
// published a prefill rate learned from an endpoint's first few
// observations at face value (until 09896ee): at seed 34, 90% load, one
// pod was taken to run at 745 000 tokens/s, the prefill scorer preferred
// it for 280 picks, and the p99 was 1.23× round-robin's; at seed 81 2.04×.
// Before that fix two runs of seeds 2–41 missed the rule (seeds 34 and 36
// at 90% load, 1.23× and 1.21×), and this test fails there.
//
// The rule, over seeds 2–41 at the three loads (120 runs): inferroute's
// mean and p99 TTFT may exceed round-robin's by more than 5% in at most
// one run, and by more than 25% in none. The allowance is for chance: with
// the fix, over seeds 1–100 one run of 300 missed 5% (1.09× at seed 25,
// 70% load), so a strict rule over 120 runs would fail about a third of
// unrelated changes. Uniform only: it is the scenario whose rule needs no
// trace files and whose margin is thinnest. About 10 s without -race;
// .ci/run's -run TestQuickSuiteGate pattern runs it too.
func TestQuickSuiteGateUniformSeeds(t *testing.T) {
	const firstSeed, seeds = 2, 40
	var misses []string
	for seed := uint64(firstSeed); seed < firstSeed+seeds; seed++ {
		rep, err := RunSuite(context.Background(), Options{
			Quick:     true,
			Scenarios: []string{"uniform"},
			Policies:  []string{policy.RoundRobin, policy.Inferroute},
			Seed:      seed,
		})
		require.NoError(t, err)
		require.Len(t, rep.Scenarios, len(DefaultLoads))
		for _, s := range rep.Scenarios {
			rr, ir := gatePair(t, &s)
			prefix := fmt.Sprintf("seed %d, ", seed)
			assertWithinRoundRobinBy(t, prefix, 1.25, &s, rr, ir)
			if ir.TTFTMean > 1.05*rr.TTFTMean || ir.TTFTP99 > 1.05*rr.TTFTP99 {
				misses = append(misses, fmt.Sprintf("%s%s at %.0f%%: mean %.1f against %.1f ms, p99 %.1f against %.1f ms",
					prefix, s.Name, 100*s.Load, 1000*ir.TTFTMean, 1000*rr.TTFTMean, 1000*ir.TTFTP99, 1000*rr.TTFTP99))
			}
		}
	}
	assert.LessOrEqual(t, len(misses), 1, "runs more than 5%% above round-robin (at most 1 of %d):\n%s",
		seeds*len(DefaultLoads), strings.Join(misses, "\n"))
}

// gatePair returns the round-robin and inferroute metrics of s.
func gatePair(t *testing.T, s *ScenarioResult) (rr, ir Metrics) {
	t.Helper()
	rr, ok := s.Policy(policy.RoundRobin)
	require.True(t, ok)
	ir, ok = s.Policy(policy.Inferroute)
	require.True(t, ok)
	return rr, ir
}

// assertWithinRoundRobin is the uniform fleet's rule: inferroute's mean and
// p99 TTFT at most 5% above round-robin's. prefix starts the messages.
func assertWithinRoundRobin(t *testing.T, prefix string, s *ScenarioResult, rr, ir Metrics) {
	t.Helper()
	assertWithinRoundRobinBy(t, prefix, 1.05, s, rr, ir)
}

// assertWithinRoundRobinBy asserts inferroute's mean and p99 TTFT at most
// ratio times round-robin's.
func assertWithinRoundRobinBy(t *testing.T, prefix string, ratio float64, s *ScenarioResult, rr, ir Metrics) {
	t.Helper()
	over := 100 * (ratio - 1)
	assert.LessOrEqual(t, ir.TTFTMean, ratio*rr.TTFTMean,
		"%s%s at %.0f%%: inferroute mean TTFT %.1f ms is more than %.0f%% above round-robin's %.1f ms",
		prefix, s.Name, 100*s.Load, 1000*ir.TTFTMean, over, 1000*rr.TTFTMean)
	assert.LessOrEqual(t, ir.TTFTP99, ratio*rr.TTFTP99,
		"%s%s at %.0f%%: inferroute p99 TTFT %.1f ms is more than %.0f%% above round-robin's %.1f ms",
		prefix, s.Name, 100*s.Load, 1000*ir.TTFTP99, over, 1000*rr.TTFTP99)
}
