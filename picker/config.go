package picker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/inferroute/inferroute/scorer"
)

// Config is the picker's configuration: which filters run, which scorers
// with which weights, how the winner is chosen. It is loaded from YAML or
// JSON with ParseConfig (one schema for both) and applied with New or, to a
// running picker, Reconfigure. The zero Config means: no filters, no
// scorers (every candidate ties), max-score, 2 fallbacks, a 2 s staleness
// half-life, fail open.
type Config struct {
	// Filters run in order; each removes endpoints that cannot serve.
	Filters []Plugin `yaml:"filters,omitempty"`
	// Scorers are summed with their weights.
	Scorers []Plugin `yaml:"scorers,omitempty"`
	// Strategy chooses among the scored candidates.
	Strategy Strategy `yaml:"strategy,omitempty"`
	// Fallbacks is how many ranked alternatives a Result carries for
	// retries; nil means DefaultFallbacks. At most MaxFallbacks.
	Fallbacks *int `yaml:"fallbacks,omitempty"`
	// StalenessHalfLife is the age at which a scraped value's confidence
	// halves; 0 means DefaultHalfLife.
	StalenessHalfLife Duration `yaml:"stalenessHalfLife,omitempty"`
	// FailClosed makes a filter that removes every endpoint fail the pick
	// with ErrNoEndpoints. By default (fail open) such a filter is skipped
	// and the pick continues with the endpoints it was given, so the
	// least-bad endpoint is chosen rather than none.
	FailClosed bool `yaml:"failClosed,omitempty"`
}

// Plugin names a registered filter or scorer, its weight (scorers only) and
// its parameters.
type Plugin struct {
	Name   string        `yaml:"name"`
	Weight float64       `yaml:"weight,omitempty"`
	Params scorer.Params `yaml:"params,omitempty"`
}

// Strategy selects how the winner is drawn from the scored candidates.
type Strategy struct {
	// Name is StrategyMaxScore (the default when empty), StrategyWeightedRandom
	// or StrategySoftmax.
	Name string `yaml:"name,omitempty"`
	// Temperature is the softmax temperature in score units (softmax only).
	Temperature float64 `yaml:"temperature,omitempty"`
	// TieBand widens what max-score calls a tie: candidates whose total is
	// within TieBand × (the sum of the scorer weights) of the best total are
	// tied, and ties are broken by rotating over the candidates in order
	// (round-robin) instead of at random. When the signals cannot tell
	// endpoints apart — a homogeneous fleet at moderate load, where their
	// differences are scrape noise — round-robin's even spacing is the best
	// blind choice, and random tie-breaks lose to it on tail latency.
	// 0 means exact ties only, broken at random. Max-score only.
	TieBand float64 `yaml:"tieBand,omitempty"`
}

// Strategy names.
const (
	// StrategyMaxScore picks the highest total, breaking exact ties at random.
	StrategyMaxScore = "max-score"
	// StrategyWeightedRandom draws with probability proportional to the
	// total (Efraimidis–Spirakis A-Res keys).
	StrategyWeightedRandom = "weighted-random"
	// StrategySoftmax draws with probability proportional to
	// exp(total / Temperature).
	StrategySoftmax = "softmax"
)

// Defaults.
const (
	DefaultFallbacks = 2
	MaxFallbacks     = 16
	DefaultHalfLife  = 2 * time.Second
)

// Duration is a time.Duration written as a Go duration string ("250ms") in
// YAML and JSON.
type Duration time.Duration

// UnmarshalYAML parses a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("want a duration such as \"250ms\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration such as \"250ms\"", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// DefaultConfig returns the configuration inferroute recommends: drop
// endpoints that cannot serve (model, health, subset hint, saturation, a
// latency objective carried by the request), then weigh LoRA 12, KV cache
// 10, prefill 10, queue 2.5, prefix 2, burst 0.5, trust scrapes with a 2 s
// half-life, and pick the maximum.
//
// How these were chosen. The picker started from queue 2, KV 2, prefix 3,
// LoRA 1, running 1, predicted latency 3 (the Gateway API Inference
// Extension's default profile weighs queue 2, KV 2, prefix 3). routebench's
// default suite then showed:
//   - on a homogeneous fleet that start was 17–51% worse than round-robin on
//     p99 TTFT: after each scrape a request still in prefill looks like any
//     decoding one, so picks collided. A lag-free signal of this process's
//     own dispatches fixes that: first a decayed count of recent dispatches
//     (burst), then the exact one, the prefill queue (prefill: uncached
//     prompt tokens sent and not yet answered by a first byte, over the
//     pod's prefill rate, least-work-left), which also sizes each request
//     by its prompt and each pod by its speed;
//   - a 250 ms staleness half-life faded 50 ms-old scrapes toward the local
//     in-flight count, a poor proxy for a queue; at 2 s a scrape is
//     replaced long before it fades, and the fade is left for pods whose
//     scrapes stop;
//   - a coordinate-descent search (routebench -tune, scored on held-out
//     traffic, a loss to round-robin anywhere costing 4× its gain) over
//     the five scenarios with the prefill scorer added raised KV and LoRA
//     to 12 (a full cache and a missing adapter cost more than any queue),
//     dropped the running count, and cut burst to 0.5 (the prefill queue
//     does its work, exactly);
//   - the predicted-latency scorer was then dropped: on homogeneous fleets
//     the per-pod models' noise steered bursts onto the pods that looked
//     fastest (Azure traces at 90% load, quick suite, seeds 1–3: p99
//     4.5–6.1% worse than round-robin with the old default and 26–33% worse
//     with the searched weights; without it 5.3% better in two seeds and
//     5.7% worse in the third), and the prefill queue now carries the
//     speed differences it was there for. The predictor still learns each
//     pod's prefill rate for the prefill scorer and serves the slo filter;
//   - the saturation filter's queue threshold went from 64 to 10 waiting
//     requests (scorer.DefaultSaturationFilter): on the mixed fleet at 90%
//     load the L4 pods were sent about twice their share of the capacity
//     and their queues made the p99 (146 s, against llm-d's 73 s; 62 s at
//     10, below llm-d's in five seeds of five);
//   - queue 5 → 2.5 and KV cache 12 → 10: the queue scorer counts waiting
//     requests, not their tokens, and its min-max scores turn one waiting
//     request more into the whole weight, so on the Mooncake trace (15k-token
//     prompts, 90% load) it overrode the prefill queue's least-work-left
//     choice; Dynamo's KV router, which weighs blocks to prefill against
//     blocks held, had the lower p99 in 16 of 30 runs (seeds 1–10 × 50, 70
//     and 90% load), 6 of 30 after. Over the 150 runs of the default suite
//     at seeds 1–10 the p99 TTFT's geometric mean fell by 5.2% and the mean
//     TTFT's by 5.1%, and the p99 was at or below the best peer's in 107
//     runs instead of 99 (Mooncake at 90% load: 4.3 s against 7.1 s over the
//     ten seeds; mixed fleet at 70%: 713 ms against 793 ms; the uniform
//     fleet and the Azure traces within 1.2%). Lower queue weights did more
//     for the Mooncake trace (1.25 with KV 8: 3.9 s, and 112 runs at or
//     below the best peer) but not for the short runs of routebench -quick
//     that users gate their CI on: on the uniform fleet its p99 went up to
//     1.8× round-robin's, failing `-check ci` in 8 of 20 seeds against 1 of
//     20 before and 2 of 20 now (those two, and the one before, on the Azure
//     traces' p99, 0.5–4.3% over round-robin's).
//   - Session 38 changed the latency predictor, not the weights: the
//     rate it publishes for the prefill scorer leans on the pool's until
//     an endpoint's model is confident, observations are clipped to 4×
//     the prediction after that, and its queued-work feature counts
//     prefill work only. With the same weights, over seeds 1–10 the p99
//     TTFT's geometric mean was 0.995 of what it was (mean TTFT 0.993), at
//     or below the best peer's in 109 runs of 150 (107 before; many are
//     near-ties), Dynamo's KV router lower on the Mooncake trace in 5 of
//     30 (its p99 at 90% load over seeds 11–40: a geometric mean 1.3%
//     lower, lower at 16 seeds of 30); over seeds 1–100 of the quick
//     suite the uniform fleet missed the gate's 5% in 1 run of 300
//     instead of 5 (the worst 1.09× round-robin's p99 instead of 2.04×),
//     and the Azure traces' p99 at 90% load was not below round-robin's
//     in 10 runs of 100 instead of 11.
//   - Then queues were counted in time on mixed fleets, not the weights:
//     the saturation filter and the queue scorer take each candidate's
//     waiting requests in the fastest candidate's terms, scaled by the
//     speeds the endpoints' labels give (signals.Endpoint.RelativeSpeed),
//     so an L4 (0.39 of an A100) among H100s (2.2) saturates at 1.8
//     waiting requests instead of 10. On the mixed fleet at 90% load every
//     pod went over 10 in the overloads, and the filter kept the one with
//     the fewest, often an L4 whose dozen waiting requests were a minute
//     of work against a few seconds on an H100: the L4s' first tokens
//     were the whole p99. Over seeds 1–10 there the p99 TTFT fell to 0.321
//     of what it was (0.28–0.39 by seed) and the mean to 0.843. The median
//     rose (seeds 1–5: 0.22–1.44 s before, 0.26–3.09 s after) and the share
//     of requests meeting the scenario's SLO (TTFT ≤ 2 s, TPOT ≤ 100 ms)
//     fell (0.49–0.69 to 0.33–0.60): the old count served many requests at
//     once on the fast pods by starving a few on the slow ones, and the
//     oracle, which sees every pod's queue, does not do that either
//     (0.24–0.47). At 50% and 70% load the mean moved by −1.6% and −0.9%
//     and the p99 by at most 4% either way per seed; the four scenarios of
//     one GPU type gave the same results to the last digit.
//   - The prefix scorer then stopped applying its yield margins on a miss
//     (scorer.PrefixScorer): when no candidate holds the prompt, all score
//     1. The margins compare raw request counts, so on a miss they were a
//     load scorer of their own, worth the prefix weight, that preferred the
//     pods with the fewest requests: on the mixed fleet the L4s, long
//     prompts included (a 7434-token prompt waited 1.1 s for an L4's
//     prefill at 50% load while no H100 had a request waiting), and on
//     one GPU type the pods with the fewest requests rather than the
//     least work queued.
//     Over the 150 runs of seeds 1–10 the p99 TTFT's geometric mean fell
//     by 0.7%: the Mooncake trace at 90% load 0.879 times (mean 0.958),
//     the uniform fleet at 90% 0.959, the mixed fleet at 90% 1.056 (mean
//     0.987; at 50% the mean 0.969), the Mooncake trace at 50% 1.034, the
//     bursty traffic within 2.3%, the Azure traces within 0.5%; the p99
//     was at or below the best peer's in 113 runs of 150 instead of 109,
//     and Dynamo's KV router had the lower p99 on the Mooncake trace in 1
//     of 30 instead of 5 (at 90% load, seeds 1–10: 3.2–6.1 s against its
//     4.1–4.2 s).
//   - Then the prefill scorer gave candidates labelled with one speed the
//     mean of their measured prefill rates (scorer.PrefillScorer): on
//     identical pods the per-pod rates differ by measurement noise, and
//     least-work-left followed it. With that its weight went from 5 to
//     10 (at 10 without the shared rate the mixed fleet gained as much,
//     but the uniform fleet at 90% load lost 12% of p99, seeds 1–4: what
//     a fleet of one GPU now pays if its pods carry no GPU label). Over
//     the 150 runs of seeds 1–10 the p99 TTFT's geometric mean fell by
//     3.4%: the mixed fleet at 50% load 0.839 times (mean 0.880; its p99
//     1.49 times the oracle's, 1.78 before, geometric means over the
//     seeds), at 70% 0.934, the Mooncake trace at 90% 0.874 (mean
//     0.929), bursty LoRA traffic 0.937–0.965, the uniform fleet and the
//     Azure traces within 1.2%; it costs bursty LoRA traffic 5.3% and
//     6.5% of mean TTFT at 50% and 70% load, the Mooncake trace 2.5% of
//     p99 at 50%, and the mixed fleet at 90% 3% of mean. The p99 was at
//     or below the best peer's in 116 runs of 150 instead of 113.
//   - Not taken (with the prefill weight at 5): SGLang's cache-aware
//     router stays 5–14% ahead on the Azure traces' p99. With nothing
//     shared it sends each request to the pod it has sent the fewest
//     prompt blocks, a balance over the whole run. A trial scorer of
//     tokens dispatched (decayed with a 5 s half-life) at weight 10, with
//     the saturation filter's queue check off, matched it there (1.000
//     over seeds 1–6) and multiplied the mixed fleet's p99 at 90% load by
//     25 and bursty LoRA traffic's by 70 (seeds 1–3). With the check on,
//     no weight tried (2, 5, 15) closed more than a quarter of the gap;
//     at weight 2, against the defaults (seeds 1–3), the Azure p99 moved
//     by 2.4% at most, the Mooncake trace was 3–8% worse and the uniform
//     fleet at 90% 8% worse.
//
// On the default suite (seed 1) this configuration's p99 TTFT is below
// round-robin's on a homogeneous fleet at every load (−0.1%, −2.5% and
// −80.5% at 50%, 70% and 90%), and 98.9–100% lower on mixed GPUs and bursty
// multi-tenant LoRA traffic; README.md has the table and the command.
func DefaultConfig() Config {
	return Config{
		Filters: []Plugin{
			{Name: scorer.FilterModel},
			{Name: scorer.FilterHealthy},
			{Name: scorer.FilterSubset},
			{Name: scorer.FilterSaturation},
			{Name: scorer.FilterSLO},
		},
		Scorers: []Plugin{
			{Name: scorer.ScorerQueue, Weight: 2.5},
			{Name: scorer.ScorerKVCache, Weight: 10},
			{Name: scorer.ScorerPrefix, Weight: 2},
			{Name: scorer.ScorerLoRA, Weight: 12},
			{Name: scorer.ScorerPrefill, Weight: 10},
			{Name: scorer.ScorerBurst, Weight: 0.5},
		},
		Strategy:          Strategy{Name: StrategyMaxScore},
		StalenessHalfLife: Duration(DefaultHalfLife),
	}
}

// ParseConfig parses a YAML or JSON configuration. Unknown fields and
// anything after the configuration (a second document, trailing text) are
// errors; values are checked when the configuration is compiled by New or
// Reconfigure, which name the bad field and value.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, nil // an empty document is the zero Config
		}
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			return Config{}, fmt.Errorf("picker config: %s", te.Errors[0])
		}
		return Config{}, fmt.Errorf("picker config: %w", err)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("picker config: more than one document, or text after the configuration")
	}
	return c, nil
}

// Marshal writes the configuration as YAML that ParseConfig reads back.
func (c Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// compiled is a validated Config with its plugins built. It is immutable
// and swapped atomically.
type compiled struct {
	filters     []namedFilter
	scorers     []scorer.Weighted
	names       []string // scorer names, aligned with scorers
	normalized  []bool   // whether each scorer implements scorer.Normalized
	weights     []float64
	strategy    string
	temperature float64
	tieBand     float64 // absolute, in total-score units
	fallbacks   int
	halfLife    time.Duration
	failClosed  bool
}

type namedFilter struct {
	name   string
	filter scorer.Filter
}

// compile validates c and builds its plugins from reg.
func compile(c Config, reg *scorer.Registry, env scorer.Env) (*compiled, error) {
	out := &compiled{
		strategy:    c.Strategy.Name,
		temperature: c.Strategy.Temperature,
		fallbacks:   DefaultFallbacks,
		halfLife:    time.Duration(c.StalenessHalfLife),
		failClosed:  c.FailClosed,
	}
	if out.halfLife < 0 {
		return nil, fmt.Errorf("stalenessHalfLife: %v is negative", out.halfLife)
	}
	if out.halfLife == 0 {
		out.halfLife = DefaultHalfLife
	}
	env.HalfLife = out.halfLife
	if c.Fallbacks != nil {
		if *c.Fallbacks < 0 || *c.Fallbacks > MaxFallbacks {
			return nil, fmt.Errorf("fallbacks: %d is not in [0, %d]", *c.Fallbacks, MaxFallbacks)
		}
		out.fallbacks = *c.Fallbacks
	}
	switch out.strategy {
	case "":
		out.strategy = StrategyMaxScore
	case StrategyMaxScore, StrategyWeightedRandom:
	case StrategySoftmax:
		if !(out.temperature > 0) || math.IsInf(out.temperature, 0) {
			return nil, fmt.Errorf("strategy.temperature: %v must be a positive number for softmax", out.temperature)
		}
	default:
		return nil, fmt.Errorf("strategy.name: unknown strategy %q (want %s, %s or %s)",
			out.strategy, StrategyMaxScore, StrategyWeightedRandom, StrategySoftmax)
	}
	if b := c.Strategy.TieBand; math.IsNaN(b) || b < 0 || b > 1 {
		return nil, fmt.Errorf("strategy.tieBand: %v is not in [0, 1]", b)
	}
	for i, p := range c.Filters {
		if p.Weight != 0 {
			return nil, fmt.Errorf("filters[%d] (%s).weight: filters take no weight", i, p.Name)
		}
		f, err := reg.NewFilter(p.Name, p.Params, env)
		if err != nil {
			return nil, fmt.Errorf("filters[%d]: %w", i, err)
		}
		out.filters = append(out.filters, namedFilter{name: p.Name, filter: f})
	}
	seen := make(map[string]bool)
	for i, p := range c.Scorers {
		if math.IsNaN(p.Weight) || math.IsInf(p.Weight, 0) || p.Weight < 0 {
			return nil, fmt.Errorf("scorers[%d] (%s).weight: %v must be a finite number >= 0", i, p.Name, p.Weight)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("scorers[%d]: %q is listed twice", i, p.Name)
		}
		seen[p.Name] = true
		s, err := reg.NewScorer(p.Name, p.Params, env)
		if err != nil {
			return nil, fmt.Errorf("scorers[%d]: %w", i, err)
		}
		out.scorers = append(out.scorers, scorer.Weighted{Name: p.Name, Weight: p.Weight, Scorer: s})
		_, normalized := s.(scorer.Normalized)
		out.normalized = append(out.normalized, normalized)
		out.weights = append(out.weights, p.Weight)
		out.names = append(out.names, p.Name)
		out.tieBand += p.Weight
	}
	switch {
	case len(c.Scorers) > 0 && out.tieBand == 0:
		// Weight is optional and 0 when omitted: every pick would be a tie.
		return nil, errors.New("scorers: every weight is 0, so every pick would be a tie; give at least one scorer a positive weight")
	case math.IsInf(out.tieBand, 0):
		return nil, errors.New("scorers: the weights add up to more than a float64 holds; scale them down")
	}
	out.tieBand *= c.Strategy.TieBand
	return out, nil
}
