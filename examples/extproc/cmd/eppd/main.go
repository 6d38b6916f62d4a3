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
	"cmp"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	"github.com/inferroute/inferroute/examples/extproc"
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
	endpoints := flag.String("endpoints", "", "comma-separated endpoints, each name=host:port or host:port")
	engine := flag.String("engine", "vllm", "model server kind, for the metric names scraped")
	configPath := flag.String("config", "", "picker YAML configuration (default: the embedded picker.yaml)")
	scrapeOn := flag.Bool("scrape", true, "scrape the endpoints' /metrics pages")
	gpus := flag.String("gpus", "", "the endpoints' GPU, which gives the picker their speed: one name for all (h100), or comma-separated name=gpu pairs (a=h100,b=l4)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	eps, err := parseEndpoints(*endpoints, *gpus, *engine, *model)
	if err == nil {
		err = run(*listen, *model, *adapters, eps, *configPath, *scrapeOn, log)
	}
	if err != nil {
		log.Error("eppd", "err", err)
		os.Exit(1)
	}
}

// parseEndpoints reads -endpoints (name=host:port or host:port, comma
// separated) and -gpus: empty, one GPU name for every endpoint, or
// name=gpu pairs for named endpoints. A GPU signals.GPURelativeSpeed does
// not know, a pair naming no endpoint and a bad address are errors.
func parseEndpoints(list, gpus, engine, model string) ([]*signals.Endpoint, error) {
	if model == "" {
		return nil, errors.New("-model is required")
	}
	type spec struct{ name, addr string }
	var specs []spec
	names := map[string]bool{}
	for item := range strings.SplitSeq(list, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok {
			name, addr = "", item
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("endpoint %q: %w", item, err)
		}
		specs = append(specs, spec{name, addr})
		names[name] = true
	}
	if len(specs) == 0 {
		return nil, errors.New("no endpoints: pass -endpoints host:port[,host:port]")
	}
	known := func(gpu string) error {
		if _, ok := signals.GPURelativeSpeed(gpu); !ok {
			return fmt.Errorf("-gpus: %q is not a GPU the picker knows (h100, h200, a100, l40s, l40, a10, l4, or their MIG slices)", gpu)
		}
		return nil
	}
	all := ""                     // one GPU for every endpoint
	byName := map[string]string{} // or one per named endpoint
	if g := strings.TrimSpace(gpus); g != "" && !strings.Contains(g, "=") {
		if err := known(g); err != nil {
			return nil, err
		}
		all = g
	} else {
		for item := range strings.SplitSeq(gpus, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			name, gpu, ok := strings.Cut(item, "=")
			name, gpu = strings.TrimSpace(name), strings.TrimSpace(gpu)
			if !ok || name == "" || !names[name] {
				return nil, fmt.Errorf("-gpus: %q names no endpoint (want name=gpu, with name as in -endpoints name=host:port)", item)
			}
			if err := known(gpu); err != nil {
				return nil, err
			}
			byName[name] = gpu
		}
	}
	eps := make([]*signals.Endpoint, 0, len(specs))
	for _, s := range specs {
		sp := signals.EndpointSpec{Name: s.name, Address: s.addr, Engine: engine, Model: model}
		if gpu := cmp.Or(byName[s.name], all); gpu != "" {
			sp.Labels = map[string]string{signals.LabelGPU: gpu}
		}
		eps = append(eps, signals.NewEndpoint(sp))
	}
	return eps, nil
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
