// Command kubepickerd is the gRPC picker service of examples/grpc with its
// endpoints discovered in Kubernetes: the EndpointSlices selected by
// -selector feed the picker, the metrics scraper and the prefix index.
// Each pod's GPU is read from its node's labels (-gpu-node-labels), so a
// fleet of mixed GPUs is routed by speed from the first request.
//
//	kubepickerd -namespace inference -selector kubernetes.io/service-name=vllm-llama
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	pickergrpc "github.com/inferroute/inferroute/examples/grpc"
	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	kubediscovery "github.com/inferroute/inferroute/examples/kubernetes"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/scrape"
)

func main() {
	var cfg kubediscovery.Config
	flag.StringVar(&cfg.Namespace, "namespace", "", "namespace to watch (empty: all)")
	flag.StringVar(&cfg.Selector, "selector", "", "label selector on EndpointSlices, e.g. kubernetes.io/service-name=vllm")
	flag.StringVar(&cfg.PortName, "port-name", "", "slice port requests go to (empty: the first)")
	flag.StringVar(&cfg.MetricsPortName, "metrics-port-name", "", "slice port serving /metrics (empty: the request port)")
	flag.StringVar(&cfg.Engine, "engine", "vllm", "model server kind of slices without the inferroute.io/engine label")
	gpuLabels := flag.String("gpu-node-labels", strings.Join(kubediscovery.DefaultGPUNodeLabels(), ","),
		"comma-separated node labels naming each pod's GPU, which gives the picker its speed; needs list/watch on nodes (empty: nodes are not read)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (empty: in-cluster configuration)")
	listen := flag.String("listen", ":9002", "gRPC listen address")
	configPath := flag.String("config", "", "picker YAML configuration (empty: picker.DefaultConfig)")
	flag.Parse()
	for _, l := range strings.Split(*gpuLabels, ",") {
		if l = strings.TrimSpace(l); l != "" {
			cfg.GPUNodeLabels = append(cfg.GPUNodeLabels, l)
		}
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Logger = log
	if err := run(cfg, *kubeconfig, *listen, *configPath, log); err != nil {
		log.Error("kubepickerd", "err", err)
		os.Exit(1)
	}
}

func run(cfg kubediscovery.Config, kubeconfig, listen, configPath string, log *slog.Logger) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	pcfg := picker.DefaultConfig()
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err != nil {
			return err
		}
		if pcfg, err = picker.ParseConfig(data); err != nil {
			return err
		}
	}
	index, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		return err
	}
	defer index.Close()
	p, err := picker.New(pcfg, picker.WithLogger(log), picker.WithPrefixMatcher(index))
	if err != nil {
		return err
	}
	sc, err := scrape.New(scrape.Config{}, scrape.WithLogger(log))
	if err != nil {
		return err
	}
	defer sc.Stop()
	d, err := kubediscovery.New(client, cfg, p, sc, kubediscovery.SinkFunc(index.Retain))
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := sc.Start(ctx); err != nil {
		return err
	}
	discovered := make(chan error, 1)
	go func() { discovered <- d.Run(ctx) }()

	srv := pickergrpc.NewServer(p, pickergrpc.Options{Logger: log})
	defer srv.Close()
	go srv.Run(ctx, time.Second)
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	pickerpb.RegisterPickerServer(gs, srv)
	// Not serving until discovery has published the first endpoint set:
	// before it every Pick would fail with no endpoints.
	hs := health.NewServer()
	setServing := func(st healthpb.HealthCheckResponse_ServingStatus) {
		for _, name := range []string{"", pickerpb.Picker_ServiceDesc.ServiceName} { // overall and the Picker's
			hs.SetServingStatus(name, st)
		}
	}
	setServing(healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go func() {
		select {
		case <-d.Synced():
			setServing(healthpb.HealthCheckResponse_SERVING)
			log.Info("endpoints discovered", "count", len(d.Endpoints()))
		case <-ctx.Done():
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
		case err := <-discovered:
			if err != nil {
				log.Error("discovery stopped", "err", err)
			}
		}
		hs.Shutdown()
		gs.GracefulStop()
	}()
	log.Info("kubepickerd serving", "addr", lis.Addr().String(), "namespace", cfg.Namespace, "selector", cfg.Selector)
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
