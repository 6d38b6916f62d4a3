// Command e2ebench runs inferroute's end-to-end benchmarks over real HTTP
// on emulated vLLM pods (package benchmarks/e2e) and prints their figures:
//
//	go run ./benchmarks/e2e/cmd/e2ebench -run compare -requests 1500
//	go run ./benchmarks/e2e/cmd/e2ebench -run chaos -duration 60s
//	go run ./benchmarks/e2e/cmd/e2ebench -run overload -duration 30s
//
// Every server listens on 127.0.0.1 and stops by itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/inferroute/inferroute/benchmarks/e2e"
)

func main() {
	run := flag.String("run", "compare", "benchmark: compare, chaos or overload")
	requests := flag.Int("requests", 800, "compare: number of requests")
	load := flag.Float64("load", 0, "offered load as a fraction of capacity (0: the benchmark's default)")
	speed := flag.Float64("speed", 1, "compare: emulated pods' speed factor")
	duration := flag.Duration("duration", 0, "chaos, overload: span of the arrivals (0: the default, 60s / 20s)")
	seed := flag.Uint64("seed", 1, "seed")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := runBench(ctx, os.Stdout, *run, *requests, *load, *speed, *duration, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "e2ebench:", err)
		os.Exit(1)
	}
}

func runBench(ctx context.Context, w io.Writer, run string, requests int, load, speed float64, duration time.Duration, seed uint64) error {
	switch run {
	case "compare":
		r, err := e2e.Compare(ctx, e2e.CompareConfig{Requests: requests, Load: load, Speed: speed, Seed: seed})
		if err != nil {
			return err
		}
		return e2e.WriteCompare(w, r)
	case "chaos":
		r, err := e2e.Chaos(ctx, e2e.ChaosConfig{Duration: duration, Load: load, Seed: seed})
		if err != nil {
			return err
		}
		return e2e.WriteChaos(w, r)
	case "overload":
		r, err := e2e.Overload(ctx, e2e.OverloadConfig{Duration: duration, Load: load, Seed: seed})
		if err != nil {
			return err
		}
		return e2e.WriteOverload(w, r)
	}
	return fmt.Errorf("unknown benchmark %q (compare, chaos, overload)", run)
}
