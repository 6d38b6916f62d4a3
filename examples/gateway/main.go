// Command gateway is an OpenAI-compatible inference gateway built on
// inferroute: one URL for many models, each request routed by its body's
// model to a pool of model servers and, within the pool, to the replica the
// picker scores best on live signals.
//
// Usage:
//
//	gateway -config gateway.yaml
//
// See README.md for the configuration and curl examples.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := mainErr(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func mainErr() error {
	path := flag.String("config", "gateway.yaml", "path of the YAML configuration")
	listen := flag.String("listen", "", "listen address, overriding the configuration's")
	flag.Parse()
	if *demoMode {
		return runDemoMain(*listen)
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	return run(ctx, cfg, ln, log)
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("logLevel: %w", err)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
