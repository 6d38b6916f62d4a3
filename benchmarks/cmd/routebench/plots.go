package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inferroute/inferroute/benchmarks/plot"
	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
)

// burstBin is the width of the arrival-time bins of the TTFT-over-time
// plots: a quarter of the bursty scenario's 2 s bursts.
const burstBin = 0.5

// writePlots writes the report's pictures into dir (created if needed) and
// returns the files written:
//
//   - cdf-<scenario>-<load>.png: the TTFT CDF of every policy, log time
//     axis, for each scenario and load;
//   - overtime-<scenario>-<load>.png for the bursty scenario: the mean TTFT
//     of the requests arriving in each 0.5 s, through the bursts, for
//     round-robin, the best peer by p99 TTFT, inferroute and the oracle
//     (those that ran), log time axis.
func writePlots(dir string, rep *sim.Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-plots: %w", err)
	}
	var files []string
	for i := range rep.Scenarios {
		sc := &rep.Scenarios[i]
		tag := fmt.Sprintf("%s-%02.0f", safeName(sc.Name), 100*sc.Load)
		c := &plot.Chart{
			Title:  fmt.Sprintf("TTFT CDF: %s at %.0f%% load (%.1f req/s, %d requests)", sc.Name, 100*sc.Load, sc.Rate, sc.Requests),
			XLabel: "time to first token (s), log scale",
			YLabel: "fraction of requests",
			LogX:   true, YMin: 0, YMax: 1, LegendBottomRight: true,
		}
		for _, m := range sc.Policies {
			c.Series = append(c.Series, plot.CDF(m.Policy, m.TTFTs))
		}
		path := filepath.Join(dir, "cdf-"+tag+".png")
		if err := c.SavePNG(path); err != nil {
			return files, fmt.Errorf("-plots: %s: %w", path, err)
		}
		files = append(files, path)

		if sc.Name != "bursty" {
			continue
		}
		t := &plot.Chart{
			Title:  fmt.Sprintf("TTFT through the bursts: %s at %.0f%% load, mean per %.1f s of arrivals", sc.Name, 100*sc.Load, burstBin),
			XLabel: "arrival time (s)",
			YLabel: "mean TTFT (s), log scale",
			LogY:   true,
		}
		for _, name := range overTimePolicies(sc) {
			m, _ := sc.Policy(name)
			s := plot.Binned(name, m.Arrivals, m.TTFTs, burstBin, plot.Mean)
			t.Series = append(t.Series, s)
		}
		if len(t.Series) == 0 {
			continue
		}
		path = filepath.Join(dir, "overtime-"+tag+".png")
		if err := t.SavePNG(path); err != nil {
			return files, fmt.Errorf("-plots: %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// overTimePolicies picks the few policies a time plot can show legibly:
// round-robin, the peer with the lowest p99 TTFT, inferroute and the
// oracle, those that ran, in that order.
func overTimePolicies(sc *sim.ScenarioResult) []string {
	var out []string
	if _, ok := sc.Policy(policy.RoundRobin); ok {
		out = append(out, policy.RoundRobin)
	}
	best, bestP99 := "", math.Inf(1)
	for _, p := range policy.Peers() {
		if m, ok := sc.Policy(p); ok && m.TTFTP99 < bestP99 {
			best, bestP99 = p, m.TTFTP99
		}
	}
	if best != "" {
		out = append(out, best)
	}
	for _, p := range []string{policy.Inferroute, policy.Oracle} {
		if _, ok := sc.Policy(p); ok {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		for _, m := range sc.Policies {
			out = append(out, m.Policy)
		}
	}
	return slices.Compact(out)
}

// safeName maps a scenario name to a file-name fragment.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
