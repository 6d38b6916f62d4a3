// Command gateway is an OpenAI-compatible inference gateway built on
// inferroute: one URL for many models, each request routed by its body's
// model to a pool of model servers and, within the pool, to the replica the
// picker scores best on live signals.
//
// Usage:
//
//	gateway -config gateway.yaml [-listen addr] [-watch 10s] [-pprof addr] [-gogc 400]
//
// SIGHUP reloads the configuration file, and with -watch so does a change
// of its content or of the files it names (TLS certificate, API keys),
// checked that often: pools, models, endpoints, picker weights,
// admission, API keys and the log level change in place, all or nothing
// (see Gateway.Reload). SIGINT or SIGTERM drains and stops.
//
// The garbage collector runs at -gogc percent heap growth (400 by default,
// unless the GOGC environment variable is set): the gateway's live heap is
// small (pools, prefix index, metrics) and its garbage is per request, so
// the runtime's default of 100 collects several times as often for no
// memory saved that matters. In a container, set GOMEMLIMIT (for example to
// 90% of the memory limit) so the collector runs harder before memory runs
// out; the runtime reads it from the environment.
//
// -pprof serves net/http/pprof (CPU and heap profiles, goroutine dumps) on
// a separate address, never on the gateway's own listener; leave it off in
// production or bind it to loopback. See README.md for the configuration
// and curl examples.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"
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
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060); off when empty")
	gogc := flag.Int("gogc", 400, "garbage collection target percentage, unless GOGC is set in the environment")
	watch := flag.Duration("watch", 0, "check the configuration file this often and apply it when it changed (0: only on SIGHUP)")
	check := flag.Bool("check", false, "check the configuration (parse it, build every pool, picker and route, read the TLS files) and exit: 0 and a summary if it would start, 1 and the reason if not")
	flag.Parse()
	if *check {
		summary, err := checkConfig(*path, *listen)
		if err != nil {
			return err
		}
		fmt.Println(summary)
		return nil
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gogc)
	}
	if *pprofAddr != "" {
		if err := servePprof(*pprofAddr); err != nil {
			return err
		}
	}
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
	log, level, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	if *watch < 0 {
		return fmt.Errorf("-watch %v is negative", *watch)
	}
	ctx, stop := signalContext()
	defer stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	// SIGHUP reloads the configuration (Gateway.Reload) instead of ending
	// the process; so does a changed file with -watch.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	loads := make(chan configLoad)
	go watchConfig(ctx, *path, *watch, hup, func(c *Config) {
		if *listen != "" {
			c.Listen = *listen
		}
	}, loads)
	return run(ctx, cfg, ln, log, runOptions{level: level, reloads: loads})
}

// checkConfig builds the gateway the configuration file at path describes,
// as a start would but without listening, scraping or serving, and
// returns a summary of it, or the error that would stop the start (listen,
// when not "", stands for the configuration's, as -listen does): the
// -check flag, for a CI job or a deployment to run before a reload or a
// rollout (as nginx -t does).
func checkConfig(path, listen string) (string, error) {
	cfg, err := LoadConfig(path)
	if err != nil {
		return "", err
	}
	if listen != "" {
		cfg.Listen = listen
	}
	g, err := NewGateway(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	defer func() { _ = g.Close(context.Background()) }()
	models := 0
	for _, p := range cfg.Pools {
		models += len(p.Models) + len(p.Adapters) + len(p.Aliases)
	}
	return fmt.Sprintf("%s: configuration ok: %d pools, %d model names, %d endpoints, listen %s",
		path, len(cfg.Pools), models, len(*g.eps.Load()), cfg.Listen), nil
}

// signalContext returns a context that the first SIGINT or SIGTERM
// cancels, which starts the drain. After it a second one ends the process
// at once (the default action) rather than being swallowed while streams
// drain.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// newLogger returns the gateway's JSON logger on stderr at level, and the
// variable that sets its level, which a reload changes.
func newLogger(level string) (*slog.Logger, *slog.LevelVar, error) {
	v := new(slog.LevelVar)
	if err := v.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("logLevel: %w", err)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: v})), v, nil
}

// servePprof serves the runtime profiles of net/http/pprof on their own
// listener at addr, so that profiling never shares the gateway's mux.
func servePprof(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return nil
}
