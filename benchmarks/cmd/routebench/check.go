package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
)

// CheckSpec is a set of regression thresholds for -check, written in YAML
// or JSON:
//
//	rules:
//	  - policy: inferroute        # the policy under test (default inferroute)
//	    figure: ttft_p99          # ttft_mean, ttft_p50, ttft_p90, ttft_p99, tpot_mean, tpot_p99, e2e_mean, e2e_p99
//	    versus: round-robin       # a policy name, or best-peer (the best of the peers in the run), or oracle
//	    max_ratio: 1.05           # fail when figure(policy) > max_ratio × figure(versus)
//	    scenarios: [uniform]      # optional: only these scenarios (default: all)
//	    loads: [0.7, 0.9]         # optional: only these loads (default: all)
//
// Every rule is checked against every matching scenario and load of the
// report; a rule whose versus policy did not run is an error (add it to
// -policies), so a check can never pass by not measuring.
type CheckSpec struct {
	Rules []CheckRule `yaml:"rules"`
}

// CheckRule is one threshold of a CheckSpec.
type CheckRule struct {
	Policy    string    `yaml:"policy,omitempty"`
	Figure    string    `yaml:"figure"`
	Versus    string    `yaml:"versus"`
	MaxRatio  float64   `yaml:"max_ratio"`
	Scenarios []string  `yaml:"scenarios,omitempty"`
	Loads     []float64 `yaml:"loads,omitempty"`
}

// Versus values that name a group rather than one policy.
const (
	versusBestPeer = "best-peer"
)

// figures maps a figure name to its value in a run's metrics.
var figures = map[string]func(m *sim.Metrics) float64{
	"ttft_mean": func(m *sim.Metrics) float64 { return m.TTFTMean },
	"ttft_p50":  func(m *sim.Metrics) float64 { return m.TTFTP50 },
	"ttft_p90":  func(m *sim.Metrics) float64 { return m.TTFTP90 },
	"ttft_p99":  func(m *sim.Metrics) float64 { return m.TTFTP99 },
	"tpot_mean": func(m *sim.Metrics) float64 { return m.TPOTMean },
	"tpot_p99":  func(m *sim.Metrics) float64 { return m.TPOTP99 },
	"e2e_mean":  func(m *sim.Metrics) float64 { return m.E2EMean },
	"e2e_p99":   func(m *sim.Metrics) float64 { return m.E2EP99 },
}

// builtinChecks are the threshold sets -check accepts by name.
//
//   - targets: the mission's headline for the default picker (issue 8,
//     "Targets"): in hetero and bursty at 70% and 90% load, mean TTFT at
//     least 82% and p99 TTFT at least 97% lower than round-robin; in
//     uniform, mean and p99 within 5% of round-robin; everywhere, p99 no
//     worse than the best peer and within 1.25× of the oracle.
//   - ci: the CI gate, the same rules as benchmarks/sim's
//     TestQuickSuiteGate: p99 TTFT below round-robin's in hetero, bursty,
//     prefix and azure; mean and p99 within 5% of round-robin in uniform.
var builtinChecks = map[string]string{
	"targets": `
rules:
  - {figure: ttft_mean, versus: round-robin, max_ratio: 0.18, scenarios: [hetero, bursty], loads: [0.7, 0.9]}
  - {figure: ttft_p99,  versus: round-robin, max_ratio: 0.03, scenarios: [hetero, bursty], loads: [0.7, 0.9]}
  - {figure: ttft_mean, versus: round-robin, max_ratio: 1.05, scenarios: [uniform]}
  - {figure: ttft_p99,  versus: round-robin, max_ratio: 1.05, scenarios: [uniform]}
  - {figure: ttft_p99,  versus: best-peer,   max_ratio: 1.0}
  - {figure: ttft_p99,  versus: oracle,      max_ratio: 1.25}
`,
	"ci": `
rules:
  - {figure: ttft_p99,  versus: round-robin, max_ratio: 1.0,  scenarios: [hetero, bursty, prefix, azure]}
  - {figure: ttft_p99,  versus: round-robin, max_ratio: 1.05, scenarios: [uniform]}
  - {figure: ttft_mean, versus: round-robin, max_ratio: 1.05, scenarios: [uniform]}
`,
}

// loadCheckSpec returns the built-in set named spec, or parses the file
// at path spec.
func loadCheckSpec(spec string) (*CheckSpec, error) {
	text, ok := builtinChecks[spec]
	if !ok {
		data, err := os.ReadFile(spec)
		if err != nil {
			names := make([]string, 0, len(builtinChecks))
			for n := range builtinChecks {
				names = append(names, n)
			}
			slices.Sort(names)
			return nil, fmt.Errorf("-check: %q is neither a built-in set (%s) nor a readable file: %w",
				spec, strings.Join(names, ", "), err)
		}
		text = string(data)
	}
	return parseCheckSpec([]byte(text))
}

// parseCheckSpec parses and validates a CheckSpec (unknown fields are
// errors).
func parseCheckSpec(data []byte) (*CheckSpec, error) {
	var s CheckSpec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("-check: %w", err)
	}
	if len(s.Rules) == 0 {
		return nil, errors.New("-check: no rules")
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		if r.Policy == "" {
			r.Policy = policy.Inferroute
		}
		if _, ok := figures[r.Figure]; !ok {
			return nil, fmt.Errorf("-check: rule %d: unknown figure %q", i+1, r.Figure)
		}
		if r.Versus == "" {
			return nil, fmt.Errorf("-check: rule %d: versus is required", i+1)
		}
		if !(r.MaxRatio > 0) || math.IsInf(r.MaxRatio, 0) {
			return nil, fmt.Errorf("-check: rule %d: max_ratio %v must be a positive number", i+1, r.MaxRatio)
		}
	}
	return &s, nil
}

// policiesNeeded returns the policies the spec's rules read, so that the
// suite can be made to run them.
func (s *CheckSpec) policiesNeeded() []string {
	var out []string
	add := func(n string) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, r := range s.Rules {
		add(r.Policy)
		if r.Versus == versusBestPeer {
			for _, p := range policy.Peers() {
				add(p)
			}
		} else {
			add(r.Versus)
		}
	}
	return out
}

// Evaluate checks rep against the rules and returns one line per
// violation (empty when every rule holds) and an error when a rule cannot
// be evaluated (a policy it needs did not run, or no scenario matched).
func (s *CheckSpec) Evaluate(rep *sim.Report) ([]string, error) {
	var fails []string
	for i, r := range s.Rules {
		fig := figures[r.Figure]
		matched := 0
		for k := range rep.Scenarios {
			sc := &rep.Scenarios[k]
			if len(r.Scenarios) > 0 && !slices.Contains(r.Scenarios, sc.Name) {
				continue
			}
			if len(r.Loads) > 0 && !slices.ContainsFunc(r.Loads, func(l float64) bool { return math.Abs(l-sc.Load) < 1e-9 }) {
				continue
			}
			matched++
			m, ok := sc.Policy(r.Policy)
			if !ok {
				return nil, fmt.Errorf("-check: rule %d needs policy %s, which did not run (add it to -policies)", i+1, r.Policy)
			}
			ref, refName, err := versus(sc, r.Versus, fig)
			if err != nil {
				return nil, fmt.Errorf("-check: rule %d: %w", i+1, err)
			}
			v := fig(&m)
			limit := r.MaxRatio * ref
			if v > limit || (m.Failed > 0 && strings.HasPrefix(r.Figure, "ttft")) {
				ratio := math.Inf(1)
				if ref > 0 {
					ratio = v / ref
				}
				msg := fmt.Sprintf("%s at %.0f%% load: %s %s %s is %s× %s's %s (limit %s×)",
					sc.Name, 100*sc.Load, r.Policy, r.Figure, fmtSeconds(v), fmtRatioAbove(ratio, r.MaxRatio), refName, fmtSeconds(ref), fmtRatio(r.MaxRatio))
				if m.Failed > 0 && v <= limit {
					msg = fmt.Sprintf("%s at %.0f%% load: %s failed %d requests (%s)", sc.Name, 100*sc.Load, r.Policy, m.Failed, r.Figure)
				}
				fails = append(fails, msg)
			}
		}
		if matched == 0 {
			return nil, fmt.Errorf("-check: rule %d (%s vs %s) matches no scenario and load of the run", i+1, r.Figure, r.Versus)
		}
	}
	return fails, nil
}

// versus returns the reference value of a rule in sc and the name of the
// policy it comes from.
func versus(sc *sim.ScenarioResult, name string, fig func(*sim.Metrics) float64) (float64, string, error) {
	if name != versusBestPeer {
		m, ok := sc.Policy(name)
		if !ok {
			return 0, "", fmt.Errorf("policy %s did not run (add it to -policies)", name)
		}
		return fig(&m), name, nil
	}
	best, bestName := math.Inf(1), ""
	for _, p := range policy.Peers() {
		m, ok := sc.Policy(p)
		if !ok {
			continue
		}
		if v := fig(&m); v < best {
			best, bestName = v, p
		}
	}
	if bestName == "" {
		return 0, "", fmt.Errorf("best-peer needs at least one peer policy in the run (%s)", strings.Join(policy.Peers(), ","))
	}
	return best, "best peer " + bestName, nil
}

// fmtRatio formats a ratio with up to four decimals.
func fmtRatio(r float64) string {
	if math.IsInf(r, 0) {
		return "∞"
	}
	return strconv.FormatFloat(math.Round(r*1e4)/1e4, 'f', -1, 64)
}

// fmtRatioAbove formats a ratio that exceeds limit as fmtRatio does, with
// as many more decimals as it takes not to print it equal to fmtRatio of
// limit: 1.00001 against a limit of 1 prints 1.00001, not 1.
func fmtRatioAbove(r, limit float64) string {
	s, l := fmtRatio(r), fmtRatio(limit)
	for prec := 5; s == l && prec <= 17; prec++ {
		s = strconv.FormatFloat(r, 'f', prec, 64)
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// fmtSeconds formats seconds as milliseconds.
func fmtSeconds(s float64) string {
	if ms := 1000 * s; ms < 100 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", 1000*s)
}

// errCheckFailed is wrapped by the error run returns when -check finds
// violations.
var errCheckFailed = errors.New("check failed")

// runCheck evaluates spec on rep, writes the verdict to w and returns an
// error wrapping errCheckFailed listing the violations.
func runCheck(spec *CheckSpec, rep *sim.Report, w io.Writer) error {
	fails, err := spec.Evaluate(rep)
	if err != nil {
		return err
	}
	if len(fails) == 0 {
		fmt.Fprintf(w, "check passed: %d rules\n", len(spec.Rules))
		return nil
	}
	return fmt.Errorf("%w: %d violations:\n  %s", errCheckFailed, len(fails), strings.Join(fails, "\n  "))
}
