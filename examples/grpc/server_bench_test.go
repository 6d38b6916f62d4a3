package pickergrpc_test

import (
	"context"
	"testing"

	pickergrpc "github.com/inferroute/inferroute/examples/grpc"
	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	"github.com/inferroute/inferroute/picker"
)

// BenchmarkPickDone measures one Pick and its Done over 8 endpoints: "direct"
// calls the Server's methods (the service's own overhead on top of the
// picker), "bufconn" goes through gRPC over an in-memory connection.
func BenchmarkPickDone(b *testing.B) {
	eps := endpoints("a", "b", "c", "d", "e", "f", "g", "h")
	cfg, err := picker.ParseConfig([]byte(queueConfig))
	if err != nil {
		b.Fatal(err)
	}
	p, err := picker.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p.SetEndpoints(eps)
	req := &pickerpb.PickRequest{Model: "m", PromptTokens: 100}
	ctx := context.Background()

	b.Run("direct", func(b *testing.B) {
		srv := pickergrpc.NewServer(p, pickergrpc.Options{})
		b.ReportAllocs()
		for b.Loop() {
			resp, err := srv.Pick(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := srv.Done(ctx, &pickerpb.DoneRequest{ReservationId: resp.GetReservationId()}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bufconn", func(b *testing.B) {
		h := newHarness(b, setup{eps: eps})
		b.ReportAllocs()
		for b.Loop() {
			resp, err := h.client.Pick(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: resp.GetReservationId()}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
