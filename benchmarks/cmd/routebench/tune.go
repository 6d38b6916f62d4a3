package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/tune"
	"github.com/inferroute/inferroute/picker"
)

// runTune is the -tune mode: it searches from the default picker
// configuration (or -config) on the selected scenarios (or -trace), prints
// the before/after table on held-out traffic and writes the best
// configuration as YAML to -tune-out.
func (x *extraFlags) runTune(ctx context.Context, o sim.Options, stdout, stderr io.Writer) error {
	scs, err := scenariosFor(o, stderr)
	if err != nil {
		return err
	}
	base := picker.DefaultConfig()
	if *x.config != "" {
		if base, err = loadPickerConfig(*x.config); err != nil {
			return err
		}
	}
	to := tune.Options{
		Base: base, Scenarios: scs, Loads: o.Loads, Requests: o.Requests, Budget: *x.tuneBudget,
		Seed: o.Seed, TracesDir: o.TracesDir, Parallel: o.Parallel, Unlabelled: o.Sim != nil && o.Sim.Unlabelled,
	}
	if o.Progress != nil {
		to.Progress = func(done, budget int, best float64) {
			o.Progress(done, budget, fmt.Sprintf("tune best %.3f", best))
		}
	}
	res, err := tune.Tune(ctx, to)
	if err != nil {
		return err
	}
	if err := res.WriteTable(stdout); err != nil {
		return err
	}
	data, err := res.Config.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*x.tuneOut, data, 0o644); err != nil {
		return fmt.Errorf("-tune-out: %w", err)
	}
	fmt.Fprintf(stdout, "best configuration written to %s:\n%s", *x.tuneOut, data)
	return nil
}
