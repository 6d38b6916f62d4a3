// Command eppd is an Envoy ext_proc endpoint picker for one pool of model
// servers: it speaks the Gateway API Inference Extension protocol on
// -listen (with gRPC health) and scrapes the endpoints' metrics.
//
//	eppd -listen :9002 -model llama-3-8b -endpoints 10.0.0.1:8000,10.0.0.2:8000
//
// -gpus names each endpoint's GPU (signals.LabelGPU), which gives the
// picker its speed: one name for the whole pool ("-gpus h100"), or
// name=gpu pairs for named endpoints ("-endpoints a=10.0.0.1:8000,b=10.0.0.2:8000
// -gpus a=h100,b=l4").
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	"github.com/inferroute/inferroute/examples/extproc"
	"github.com/inferroute/inferroute/examples/internal/endpointflag"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/scrape"
)

//go:embed picker.yaml
var defaultConfig []byte

func main() {
	listen := flag.String("listen", ":9002", "gRPC listen address (ext_proc and health)")
	model := flag.String("model", "", "the model the pool serves (required)")
	adapters := flag.String("adapters", "", "comma-separated LoRA adapters the pool serves")
	endpoints := flag.String("endpoints", "", endpointflag.EndpointsUsage)
	engine := flag.String("engine", "vllm", "model server kind, for the metric names scraped")
	configPath := flag.String("config", "", "picker YAML configuration (default: the embedded picker.yaml)")
	scrapeOn := flag.Bool("scrape", true, "scrape the endpoints' /metrics pages")
	gpus := flag.String("gpus", "", endpointflag.GPUUsage)
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	eps, err := endpointflag.Parse(*endpoints, *gpus, *engine, *model)
	if *model == "" {
		err = errors.New("-model is required")
	}
	if err == nil {
		err = run(*listen, *model, *adapters, eps, *configPath, *scrapeOn, log)
	}
	if err != nil {
		log.Error("eppd", "err", err)
		os.Exit(1)
	}
}

func run(listen, model, adapters string, eps []*signals.Endpoint, configPath string, scrapeOn bool, log *slog.Logger) error {
	data := defaultConfig
	if configPath != "" {
		var err error
		if data, err = os.ReadFile(configPath); err != nil {
			return err
		}
	}
	cfg, err := picker.ParseConfig(data)
	if err != nil {
		return err
	}
	index, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		return err
	}
	defer index.Close()
	p, err := picker.New(cfg, picker.WithLogger(log), picker.WithPrefixMatcher(index))
	if err != nil {
		return err
	}
	p.SetEndpoints(eps)
	pool := router.PoolConfig{Name: model, Picker: p, Models: []string{model}, Adapters: map[string]string{}}
	for a := range strings.SplitSeq(adapters, ",") {
		if a = strings.TrimSpace(a); a != "" {
			pool.Adapters[a] = model
		}
	}
	table, err := router.NewTable(router.TableConfig{Pools: []router.PoolConfig{pool}})
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if scrapeOn {
		sc, err := scrape.New(scrape.Config{}, scrape.WithLogger(log))
		if err != nil {
			return err
		}
		sc.SetEndpoints(eps)
		if err := sc.Start(ctx); err != nil {
			return err
		}
		defer sc.Stop()
	}

	srv, err := extproc.NewServer(extproc.Options{Table: table, Logger: log})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(srv.GRPCServerOptions()...)
	srv.Register(gs)
	go func() {
		<-ctx.Done()
		srv.Health().Shutdown()
		gs.GracefulStop()
	}()
	log.Info("eppd serving ext_proc", "addr", lis.Addr().String(), "model", model, "endpoints", len(eps))
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
