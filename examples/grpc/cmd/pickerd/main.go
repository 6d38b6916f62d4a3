// Command pickerd serves an inferroute picker over gRPC (the
// inferroute.picker.v1.Picker service and grpc.health.v1.Health, with
// server reflection so that tools such as grpcurl need no .proto files)
// for a static list of model-server endpoints, scraping their metrics
// pages.
//
//	pickerd -listen :9002 -endpoints pod-a=10.0.0.1:8000,pod-b=10.0.0.2:8000 -gpus pod-a=h100,pod-b=l4
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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	pickergrpc "github.com/inferroute/inferroute/examples/grpc"
	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	"github.com/inferroute/inferroute/examples/internal/endpointflag"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals/prefix"
	"github.com/inferroute/inferroute/signals/scrape"
)

//go:embed picker.yaml
var defaultConfig []byte

func main() {
	listen := flag.String("listen", ":9002", "gRPC listen address")
	endpoints := flag.String("endpoints", "", endpointflag.EndpointsUsage)
	gpus := flag.String("gpus", "", endpointflag.GPUUsage)
	engine := flag.String("engine", "vllm", "model server kind, for the metric names scraped")
	model := flag.String("model", "", "base model every endpoint serves (empty: any)")
	configPath := flag.String("config", "", "picker YAML configuration (default: the embedded picker.yaml)")
	scrapeOn := flag.Bool("scrape", true, "scrape the endpoints' /metrics pages")
	ttl := flag.Duration("reservation-timeout", pickergrpc.DefaultReservationTimeout, "release a pick without Done after this long")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *endpoints, *gpus, *engine, *model, *configPath, *scrapeOn, *ttl, log); err != nil {
		log.Error("pickerd", "err", err)
		os.Exit(1)
	}
}

func run(listen, list, gpus, engine, model, configPath string, scrapeOn bool, ttl time.Duration, log *slog.Logger) error {
	eps, err := endpointflag.Parse(list, gpus, engine, model)
	if err != nil {
		return err
	}
	data := defaultConfig
	if configPath != "" {
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

	srv := pickergrpc.NewServer(p, pickergrpc.Options{ReservationTimeout: ttl, Logger: log})
	defer srv.Close()
	go srv.Run(ctx, time.Second)

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	hs := health.NewServer()
	gs := newGRPCServer(srv, hs)
	go func() {
		<-ctx.Done()
		hs.Shutdown()
		gs.GracefulStop()
	}()
	log.Info("pickerd serving", "addr", lis.Addr().String(), "endpoints", len(eps))
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// newGRPCServer returns a gRPC server with the picker service, the health
// service (reporting the picker SERVING) and server reflection registered.
func newGRPCServer(srv pickerpb.PickerServer, hs *health.Server) *grpc.Server {
	gs := grpc.NewServer()
	pickerpb.RegisterPickerServer(gs, srv)
	hs.SetServingStatus(pickerpb.Picker_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs
}
