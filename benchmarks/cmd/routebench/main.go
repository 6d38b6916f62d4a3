// Command routebench runs inferroute's routing benchmark: a suite of
// scenarios on a discrete-event simulation of a fleet of vLLM-like pods,
// with the library's default picker and baseline policies side by side, in
// virtual time.
//
// Usage:
//
//	go run ./benchmarks/cmd/routebench [flags]
//
// The default suite (uniform, hetero, bursty, prefix, azure, each at 50%,
// 70% and 90% of the fleet's measured capacity) takes about 40 seconds on
// two cores (up to a few minutes on a slow or busy machine); -quick runs a
// scaled-down suite in about 15 seconds. The table goes to stdout (or JSON with -json), the progress bar to
// stderr. The trace scenarios read ../shared/traces (-traces); when a trace
// file is missing the scenario is skipped with a message.
//
// Flags:
//
//	-quick            scaled-down suite
//	-json             print the report as JSON instead of tables
//	-scenario LIST    comma-separated scenarios (uniform,hetero,bursty,prefix,azure)
//	-policies LIST    comma-separated policies (default: all of round-robin,random,least-request,
//	                  inferroute,llm-d,sglang-cache-aware,dynamo-kv,aibrix-prefix,sglang-least-load,oracle)
//	-loads LIST       comma-separated loads as fractions of capacity (default 0.5,0.7,0.9)
//	-seed N           seed of workloads, scrapes and policies (default 1)
//	-requests N       requests per run (default 6000, 2500 with -quick)
//	-trace FILE       replay your own trace (Mooncake .jsonl or Azure .csv) instead of the suite
//	-traces DIR       folder of the shared trace files (default ../shared/traces)
//	-pods N           resize every fleet to N pods
//	-profiles LIST    comma-separated hardware profiles repeated over the pods
//	-parallel N       runs simulated at once (default: GOMAXPROCS)
//	-progress=false   no progress bar
//	-config FILE      run the inferroute policy with this picker configuration (YAML/JSON)
//	-plots DIR        write PNG plots: TTFT CDF per scenario and load, TTFT through the bursts
//	-check SPEC       after the suite, check thresholds (built-in "targets" or "ci", or a
//	                  YAML/JSON file) and exit 1 naming scenario, policy and figure on a regression
//	-capacity         instead of the suite: per policy, the fewest pods meeting a p99 TTFT SLO
//	                  at a rate (-rate, -slo, -max-pods)
//	-tune             instead of the suite: search weights and thresholds on training traffic,
//	                  report before/after on held-out traffic, write the YAML (-tune-budget, -tune-out)
//
// Using it in your own CI, on your own trace and configuration:
//
//	go run github.com/inferroute/inferroute/benchmarks/cmd/routebench \
//	    -trace my-trace.jsonl -config my-picker.yaml -check my-thresholds.yaml -progress=false
//
// where my-thresholds.yaml holds rules such as
//
//	rules:
//	  - {figure: ttft_p99, versus: round-robin, max_ratio: 0.8}
//	  - {figure: ttft_mean, versus: best-peer, max_ratio: 1.0}
//
// The command exits with status 1 and lists every violated rule when one
// regresses.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "routebench:", err)
		os.Exit(1)
	}
}

// run parses args, runs the suite and writes the report to stdout and the
// progress to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("routebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		quick     = fs.Bool("quick", false, "run the scaled-down suite")
		asJSON    = fs.Bool("json", false, "print the report as JSON instead of tables")
		scenarios = fs.String("scenario", "", "comma-separated scenarios to run (default: all of uniform,hetero,bursty,prefix,azure)")
		policies  = fs.String("policies", strings.Join(policy.All(), ","), "comma-separated policies")
		loads     = fs.String("loads", "", "comma-separated loads as fractions of capacity (default 0.5,0.7,0.9)")
		seed      = fs.Uint64("seed", 1, "seed of workloads, scrapes and policies")
		requests  = fs.Int("requests", 0, fmt.Sprintf("requests per run (default %d, %d with -quick)", sim.DefaultRequests, sim.QuickRequests))
		trace     = fs.String("trace", "", "replay this trace file (Mooncake .jsonl or Azure .csv) instead of the suite")
		traces    = fs.String("traces", sim.DefaultTracesDir, "folder of the shared trace files")
		pods      = fs.Int("pods", 0, "resize every fleet to this many pods")
		profiles  = fs.String("profiles", "", "comma-separated hardware profiles repeated over the pods ("+strings.Join(sim.ProfileNames(), ",")+")")
		parallel  = fs.Int("parallel", 0, "runs simulated at once (default GOMAXPROCS)")
		progress  = fs.Bool("progress", true, "show a progress bar on stderr")
		unlabel   = fs.Bool("unlabelled", false, "give the pods no GPU label, as a fleet discovered without its hardware: the picker learns speeds from latencies alone")
	)
	extra := addExtraFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: routebench [flags]\n\n"+
			"Runs inferroute's routing benchmark: the default suite of scenarios on a simulated\n"+
			"fleet of vLLM-like pods, each at 50%%, 70%% and 90%% of the fleet's capacity, with the\n"+
			"default picker, the baselines, the peers' algorithms and the oracle. Tables go to stdout,\n"+
			"progress to stderr. -capacity sizes fleets, -tune searches picker configurations,\n"+
			"-plots draws PNGs and -check gates CI on thresholds.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := sim.Options{
		Quick:     *quick,
		Scenarios: splitList(*scenarios),
		Policies:  splitList(*policies),
		Seed:      *seed,
		Requests:  *requests,
		TracesDir: *traces,
		TraceFile: *trace,
		Pods:      *pods,
		Profiles:  splitList(*profiles),
		Parallel:  *parallel,
	}
	if l := splitList(*loads); l != nil {
		for _, s := range l {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return fmt.Errorf("-loads: bad load %q: want a positive fraction such as 0.7", s)
			}
			o.Loads = append(o.Loads, v)
		}
	}
	if *unlabel {
		c := sim.DefaultConfig(nil)
		c.Unlabelled = true
		o.Sim = &c
	}
	if *pods < 0 {
		return fmt.Errorf("-pods: %d is negative", *pods)
	}
	var bar *progressBar
	if *progress {
		bar = newProgressBar(stderr)
		o.Progress = bar.update
	}
	spec, err := extra.prepare(&o)
	if err != nil {
		return err
	}
	start := time.Now()
	if handled, err := extra.mode(ctx, o, stdout, stderr, o.Progress); handled {
		if bar != nil {
			bar.finish(time.Since(start))
		}
		return err
	}
	rep, err := sim.RunSuite(ctx, o)
	if bar != nil {
		bar.finish(time.Since(start))
	}
	if err != nil {
		return err
	}
	for _, s := range rep.Skipped {
		fmt.Fprintln(stderr, "routebench: skipped", s)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	return extra.after(rep, spec, stdout, stderr)
}

// splitList splits a comma-separated flag value, dropping empty items; nil
// for an empty value.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
