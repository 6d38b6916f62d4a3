package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/inferroute/inferroute/benchmarks/emulator"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
)

// demoMode is the --demo flag: start emulated pods in-process and route to
// them, no configuration file needed.
var demoMode = flag.Bool("demo", false, "start emulated vLLM pods of mixed GPUs in-process and route to them (no config file)")

// demoLifetime bounds a demo run: the pods and the gateway stop by
// themselves after it.
const demoLifetime = 30 * time.Minute

// demoProfiles are the demo fleet's GPUs: one fast, one middle, two slow
// cards, so the default picker's preference for the fast ones shows.
var demoProfiles = []string{"h100-llama3-8b", "a100-llama3-8b", "l4-llama3-8b", "l4-llama3-8b"}

// demoAdapters are the LoRA adapters every demo pod has loaded.
var demoAdapters = []string{"sql-lora", "chat-lora"}

// runDemoMain runs the demo until SIGINT/SIGTERM or demoLifetime, on listen
// ("" means 127.0.0.1:8080), logging to stderr and printing the
// instructions to stdout.
func runDemoMain(listen string) error {
	if listen == "" {
		listen = "127.0.0.1:8080"
	}
	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, demoLifetime)
	defer cancel()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return runDemo(ctx, ln, os.Stdout, log)
}

// runDemo starts the emulated fleet on loopback ports, prints how to use
// it to out, and serves the gateway on ln until ctx ends, then drains it
// as run does; the pods stop after the drain, so that the streams they
// serve can finish. Every 10 s it logs how many requests each pod
// received, when that changed.
func runDemo(ctx context.Context, ln net.Listener, out io.Writer, log *slog.Logger) error {
	opts := make([]emulator.Options, len(demoProfiles))
	for i, p := range demoProfiles {
		opts[i] = emulator.Options{
			Name:     fmt.Sprintf("%s-%d", strings.SplitN(p, "-", 2)[0], i),
			Profile:  p,
			Adapters: demoAdapters,
			MaxLoRAs: 2,
			Lifetime: demoLifetime,
		}
	}
	// Not ctx: a pod stopped with it would cut the streams the gateway is
	// draining. The deferred Close stops the fleet once run has returned.
	fleet, err := emulator.StartFleet(context.WithoutCancel(ctx), opts)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer fleet.Close()
	cfg := demoConfig(fleet, ln.Addr().String())
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "inferroute demo: %d emulated vLLM pods serving %s (adapters %s):\n",
		len(fleet.Pods), emulator.DefaultModel, strings.Join(demoAdapters, ", "))
	for _, p := range fleet.Pods {
		fmt.Fprintf(out, "  %-8s %-16s %s\n", p.Name(), p.Profile(), p.URL())
	}
	fmt.Fprintf(out, "gateway on %s. Try:\n", url)
	fmt.Fprintf(out, "  curl -si %s/v1/completions -H 'Content-Type: application/json' \\\n"+
		"    -d '{\"model\":\"llama\",\"prompt\":\"Say hello\",\"max_tokens\":8}'\n", url)
	fmt.Fprintf(out, "  curl -sN %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"+
		"    -d '{\"model\":\"sql-lora\",\"messages\":[{\"role\":\"user\",\"content\":\"Count users by country\"}],\"stream\":true,\"max_tokens\":5}'\n", url)
	fmt.Fprintln(out, "The X-Inference-Pod response header names the pod that served the request. Ctrl-C stops the demo.")

	go reportPods(ctx, fleet, log)
	return run(ctx, cfg, ln, log, runOptions{})
}

// demoConfig is the gateway configuration for the demo fleet: one pool
// serving the base model (alias "llama") and its adapters, with the
// default picker.
func demoConfig(f *emulator.Fleet, listen string) Config {
	model := f.Pods[0].Model()
	adapters := map[string]string{}
	for _, a := range demoAdapters {
		adapters[a] = model
	}
	pool := PoolConfig{
		Name:     "llama",
		Models:   []string{model},
		Adapters: adapters,
		Aliases:  map[string]string{"llama": model},
	}
	for _, p := range f.Pods {
		s := p.Spec()
		pool.Endpoints = append(pool.Endpoints, EndpointConfig{
			Name: s.Name, Address: s.Address, Engine: s.Engine, Model: s.Model, Adapters: s.Adapters,
			Labels: map[string]string{signals.LabelGPU: p.Profile()},
		})
	}
	cfg := Config{
		Listen:       listen,
		DrainTimeout: picker.Duration(5 * time.Second),
		Scrape:       ScrapeConfig{Interval: picker.Duration(50 * time.Millisecond)},
		Pools:        []PoolConfig{pool},
	}
	cfg.defaults()
	return cfg
}

// reportPods logs the requests each pod received every 10 s while the
// counts change.
func reportPods(ctx context.Context, f *emulator.Fleet, log *slog.Logger) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var total int64
		attrs := make([]any, 0, len(f.Pods))
		for _, p := range f.Pods {
			n := p.Received()
			total += n
			attrs = append(attrs, slog.Int64(p.Name(), n))
		}
		if total != last {
			last = total
			log.Info("requests per pod", attrs...)
		}
	}
}
