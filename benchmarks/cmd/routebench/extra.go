package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/tune"
	"github.com/inferroute/inferroute/picker"
)

// extraFlags are the flags of the second part of routebench: plots, the CI
// check, a user's picker configuration, the capacity search and tuning.
type extraFlags struct {
	plots      *string
	check      *string
	config     *string
	capacity   *bool
	rate       *float64
	slo        *time.Duration
	maxPods    *int
	tune       *bool
	tuneBudget *int
	tuneOut    *string
}

// addExtraFlags declares the extra flags on fs.
func addExtraFlags(fs *flag.FlagSet) *extraFlags {
	return &extraFlags{
		plots: fs.String("plots", "", "write PNG plots (TTFT CDFs, TTFT through the bursts) into this folder"),
		check: fs.String("check", "", "check thresholds after the suite and exit non-zero on a regression: a built-in set (targets, ci) or a YAML/JSON file"),
		config: fs.String("config", "", "run the inferroute policy with this picker configuration (YAML or JSON, as picker.ParseConfig reads) instead of the default; "+
			"with -tune, the starting point"),
		capacity:   fs.Bool("capacity", false, "instead of the suite, find per policy the fewest pods meeting a p99 TTFT SLO at a given rate"),
		rate:       fs.Float64("rate", 0, "with -capacity: offered requests per second (default: 70% of the scenario's default fleet's capacity)"),
		slo:        fs.Duration("slo", 0, "with -capacity: the p99 TTFT objective (default: the scenario's TTFT SLO)"),
		maxPods:    fs.Int("max-pods", 0, "with -capacity: the largest fleet tried (default: 4× the scenario's fleet)"),
		tune:       fs.Bool("tune", false, "instead of the suite, search scorer weights and thresholds (coordinate descent, scored on held-out traffic) and write the best picker configuration"),
		tuneBudget: fs.Int("tune-budget", tune.DefaultBudget, "with -tune: configurations evaluated"),
		tuneOut:    fs.String("tune-out", "inferroute-tuned.yaml", "with -tune: where to write the best configuration"),
	}
}

// prepare applies the extra flags to the suite's options: the user's
// picker configuration, and the policies a check needs (added to the run
// when missing, so a check never passes by not measuring). It returns the
// parsed check (nil without -check).
func (x *extraFlags) prepare(o *sim.Options) (*CheckSpec, error) {
	if *x.config != "" {
		reg, err := registryWithConfig(*x.config)
		if err != nil {
			return nil, err
		}
		o.Registry = reg
	}
	if *x.check == "" {
		return nil, nil
	}
	spec, err := loadCheckSpec(*x.check)
	if err != nil {
		return nil, err
	}
	for _, p := range spec.policiesNeeded() {
		if !slices.Contains(o.Policies, p) {
			o.Policies = append(o.Policies, p)
		}
	}
	return spec, nil
}

// registryWithConfig returns the default registry with inferroute running
// the picker configuration in file path.
func registryWithConfig(path string) (*policy.Registry, error) {
	cfg, err := loadPickerConfig(path)
	if err != nil {
		return nil, err
	}
	def := policy.Default()
	reg := &policy.Registry{}
	for _, name := range def.Names() {
		f, _ := def.Lookup(name)
		if name == policy.Inferroute {
			f = func(env policy.Env) (policy.Policy, error) { return policy.NewPicker(policy.Inferroute, cfg, env) }
		}
		if err := reg.Register(name, f); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

func loadPickerConfig(path string) (picker.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return picker.Config{}, fmt.Errorf("-config: %w", err)
	}
	cfg, err := picker.ParseConfig(data)
	if err != nil {
		return picker.Config{}, fmt.Errorf("-config %s: %w", path, err)
	}
	// Build once to report a bad configuration before any simulation.
	if _, err := picker.New(cfg); err != nil {
		return picker.Config{}, fmt.Errorf("-config %s: %w", path, err)
	}
	return cfg, nil
}

// after writes the plots and runs the check once the suite's report is
// printed.
func (x *extraFlags) after(rep *sim.Report, spec *CheckSpec, stdout, stderr io.Writer) error {
	if *x.plots != "" {
		files, err := writePlots(*x.plots, rep)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "routebench: wrote %d plots into %s\n", len(files), *x.plots)
	}
	if spec != nil {
		return runCheck(spec, rep, stderr)
	}
	return nil
}

// mode runs -capacity or -tune instead of the suite. handled is false when
// neither was asked for.
func (x *extraFlags) mode(ctx context.Context, o sim.Options, stdout, stderr io.Writer, progress func(done, total int, label string)) (handled bool, err error) {
	switch {
	case *x.capacity && *x.tune:
		return true, errors.New("-capacity and -tune are separate runs: give one")
	case *x.capacity:
		return true, x.runCapacity(ctx, o, stdout, stderr, progress)
	case *x.tune:
		return true, x.runTune(ctx, o, stdout, stderr)
	}
	return false, nil
}

// scenariosFor resolves the scenario names (or the trace file) of o for the
// capacity and tuning modes; missing trace files skip their scenario with a
// message.
func scenariosFor(o sim.Options, stderr io.Writer) ([]sim.Scenario, error) {
	all := sim.DefaultScenarios()
	if o.TraceFile != "" {
		return []sim.Scenario{sim.TraceScenario(o.TraceFile, all[0].Pods)}, nil
	}
	names := o.Scenarios
	if names == nil {
		for _, s := range all {
			names = append(names, s.Name)
		}
	}
	var out []sim.Scenario
	for _, n := range names {
		i := slices.IndexFunc(all, func(s sim.Scenario) bool { return s.Name == n })
		if i < 0 {
			known := make([]string, len(all))
			for k, s := range all {
				known[k] = s.Name
			}
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", n, strings.Join(known, ", "))
		}
		sc := all[i]
		if _, err := sc.Build(sim.BuildEnv{N: 1, Seed: 1, TracesDir: o.TracesDir}); errors.Is(err, sim.ErrTraceMissing) {
			fmt.Fprintf(stderr, "routebench: skipped %s: %v\n", sc.Name, err)
			continue
		}
		out = append(out, sc)
	}
	if len(out) == 0 {
		return nil, errors.New("no scenario to run")
	}
	return out, nil
}
