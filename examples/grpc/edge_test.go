package pickergrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pickergrpc "github.com/inferroute/inferroute/examples/grpc"
	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// cancelInside is an admitter that, on its first call, cancels the
// client's context and waits until the server sees the cancellation, then
// admits: the Pick succeeds on a call whose caller is already gone.
type cancelInside struct {
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelInside) Admit(ctx context.Context, _ *scorer.Input) (bool, string) {
	c.once.Do(func() {
		c.cancel()
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second): // a guard against a hang
		}
	})
	return true, ""
}

// TestPickForGoneCallerIsReleased: a Pick whose caller went away
// (deadline or cancel) while it was being served cannot deliver its
// reservation id, so no Done can ever come for it. The server releases
// the pick instead of committing a reservation: nothing stays open, and
// the endpoint has no request in flight, without waiting for the
// reservation timeout.
func TestPickForGoneCallerIsReleased(t *testing.T) {
	eps := endpoints("a")
	adm := &cancelInside{}
	h := newHarness(t, setup{eps: eps, pickOpt: []picker.Option{picker.WithAdmitter(adm)}})
	ctx, cancel := context.WithCancel(context.Background())
	adm.cancel = cancel
	_, err := h.client.Pick(ctx, &pickerpb.PickRequest{RequestId: "gone"})
	require.Equal(t, codes.Canceled, status.Code(err), "the caller never gets a reservation id")

	// The handler may still be finishing after the client gave up: wait
	// until it has picked, then let it return.
	deadline := time.Now().Add(10 * time.Second) // a guard against a hang
	for eps[0].Counters().Dispatched == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, uint64(1), eps[0].Counters().Dispatched, "the pick was made")
	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, h.server.Outstanding(), "a reservation nobody can Done is held open")
	assert.Zero(t, eps[0].InFlight(), "the endpoint counts a request that will never be Done")
}

// TestPickWithCanceledContext: Pick called with a context already done
// answers CANCELED and reserves nothing: the caller cannot use the answer.
func TestPickWithCanceledContext(t *testing.T) {
	eps := endpoints("a")
	h := newHarness(t, setup{eps: eps})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.server.Pick(ctx, &pickerpb.PickRequest{})
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Zero(t, h.server.Outstanding())
	assert.Zero(t, eps[0].InFlight())
}

// --- Reservation edge cases.

// TestDoneRacesSweepAndClose: Done, the reservation sweep and Close
// racing on the same reservations call the picker's Done exactly once
// each.
func TestDoneRacesSweepAndClose(t *testing.T) {
	const n = 200
	eps := endpoints("a", "b")
	h := newHarness(t, setup{eps: eps, opts: pickergrpc.Options{ReservationTimeout: time.Minute}})
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		resp, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
		require.NoError(t, err)
		ids[i] = resp.GetReservationId()
	}
	h.clock.Advance(time.Minute) // every reservation is due
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: id})
			if err != nil {
				assert.Equal(t, codes.NotFound, status.Code(err))
			}
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); h.server.Sweep() }()
	go func() { defer wg.Done(); h.server.Close() }()
	wg.Wait()
	outs, _ := h.rec.completions()
	assert.Len(t, outs, n, "exactly one Done per reservation")
	for _, ep := range eps {
		assert.Zero(t, ep.InFlight())
	}
}

// TestUnavailableAndSubset: no endpoint left after the subset filter
// (fail closed) is UNAVAILABLE, a subset of one IPv6 endpoint picks it.
func TestUnavailableAndSubset(t *testing.T) {
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "a", Address: "[fd00::1]:8000"})
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "b", Address: "[fd00::2]:8000"})
	h := newHarness(t, setup{eps: []*signals.Endpoint{a, b}, config: queueConfig + "failClosed: true\n"})
	resp, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{
		Headers: map[string]string{"x-gateway-destination-endpoint-subset": "[fd00::2]:8000"}})
	require.NoError(t, err)
	assert.Equal(t, "[fd00::2]:8000", resp.GetEndpoint().GetAddress())
	assert.Empty(t, resp.GetFallbacks(), "fallbacks stay inside the subset")
	_, err = h.client.Pick(context.Background(), &pickerpb.PickRequest{
		Headers: map[string]string{"x-gateway-destination-endpoint-subset": "10.0.0.9:1"}})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1, h.server.Outstanding())
}

// TestMalformedDurations: invalid ttft_slo durations are
// INVALID_ARGUMENT and reserve nothing.
func TestMalformedDurations(t *testing.T) {
	eps := endpoints("a")
	h := newHarness(t, setup{eps: eps})
	for _, d := range []*durationpb.Duration{
		{Seconds: -1, Nanos: 5},            // mixed signs
		{Seconds: 315576000001},            // out of range
		{Seconds: 0, Nanos: 1_000_000_000}, // nanos out of range
	} {
		_, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{TtftSlo: d})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", d)
	}
	assert.Zero(t, h.server.Outstanding())
	assert.Zero(t, eps[0].Counters().Dispatched)
}

// TestRunWithoutInterval: Run given no interval sweeps at
// DefaultSweepInterval instead of panicking in time.NewTicker, and
// returns when its context ends.
func TestRunWithoutInterval(t *testing.T) {
	h := newHarness(t, setup{eps: endpoints("a")})
	for _, interval := range []time.Duration{0, -time.Second} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.server.Run(ctx, interval)
		}()
		cancel()
		<-done
	}
}
