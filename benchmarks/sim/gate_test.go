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
// above at five more seeds. One seed is a thin guard for it: the quick
// suite's runs are short (2 500 requests, so its p99 is the 26th-worst
// TTFT), and a picker configuration can pass at seed 1 while collisions
// double the p99 at other seeds. Session 37's first retuning (queue 1.25,
// KV cache 8) did: the full suite at seeds 1–10 held uniform within 5% of
// round-robin, but this test fails with it at seeds 2, 4 and 5 (p99 up to
// 2.7× round-robin's, 725 against 272 ms at 90% load), and routebench
// -quick -check ci failed at eight of seeds 1–20. Uniform only: it is the
// scenario whose rule needs no trace files and whose margin is thinnest.
// .ci/run's -run TestQuickSuiteGate pattern runs it too.
func TestQuickSuiteGateUniformSeeds(t *testing.T) {
	for _, seed := range []uint64{2, 3, 4, 5, 6} {
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
			assertWithinRoundRobin(t, fmt.Sprintf("seed %d, ", seed), &s, rr, ir)
		}
	}
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
	assert.LessOrEqual(t, ir.TTFTMean, 1.05*rr.TTFTMean,
		"%s%s at %.0f%%: inferroute mean TTFT %.1f ms is more than 5%% above round-robin's %.1f ms",
		prefix, s.Name, 100*s.Load, 1000*ir.TTFTMean, 1000*rr.TTFTMean)
	assert.LessOrEqual(t, ir.TTFTP99, 1.05*rr.TTFTP99,
		"%s%s at %.0f%%: inferroute p99 TTFT %.1f ms is more than 5%% above round-robin's %.1f ms",
		prefix, s.Name, 100*s.Load, 1000*ir.TTFTP99, 1000*rr.TTFTP99)
}
