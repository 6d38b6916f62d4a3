package pickergrpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	pickergrpc "github.com/inferroute/inferroute/examples/grpc"
	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// queueConfig scores by queue depth only; endpoints without metrics report
// their local in-flight count as their queue, so picks spread evenly.
const queueConfig = `
filters:
  - name: subset
scorers:
  - name: queue
    weight: 1
`

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// recorder is an observer that keeps every completion.
type recorder struct {
	mu   sync.Mutex
	reqs []*signals.Request
	outs []signals.Outcome
	eps  []*signals.Endpoint
}

func (r *recorder) Dispatched(*signals.Request, *signals.Endpoint) {}

func (r *recorder) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.outs = append(r.outs, out)
	r.eps = append(r.eps, ep)
}

func (r *recorder) completions() ([]signals.Outcome, []*signals.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]signals.Outcome(nil), r.outs...), append([]*signals.Endpoint(nil), r.eps...)
}

// rejectAll is an admitter that sheds every request.
type rejectAll struct{}

func (rejectAll) Admit(context.Context, *scorer.Input) (bool, string) { return false, "test sheds all" }

type harness struct {
	client pickerpb.PickerClient
	server *pickergrpc.Server
	picker *picker.Picker
	clock  *signalstest.Clock
	rec    *recorder
}

type setup struct {
	config  string
	eps     []*signals.Endpoint
	opts    pickergrpc.Options
	pickOpt []picker.Option
}

// newHarness serves a picker over an in-memory bufconn listener and
// returns a client connected to it.
func newHarness(t testing.TB, s setup) *harness {
	t.Helper()
	if s.config == "" {
		s.config = queueConfig
	}
	cfg, err := picker.ParseConfig([]byte(s.config))
	require.NoError(t, err)
	h := &harness{clock: signalstest.NewClock(t0), rec: &recorder{}}
	opts := append([]picker.Option{picker.WithClock(h.clock), picker.WithObservers(h.rec)}, s.pickOpt...)
	h.picker, err = picker.New(cfg, opts...)
	require.NoError(t, err)
	h.picker.SetEndpoints(s.eps)
	if s.opts.Clock == nil {
		s.opts.Clock = h.clock
	}
	h.server = pickergrpc.NewServer(h.picker, s.opts)

	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	pickerpb.RegisterPickerServer(gs, h.server)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
		h.server.Close()
	})
	h.client = pickerpb.NewPickerClient(conn)
	return h
}

func endpoints(names ...string) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, len(names))
	for i, n := range names {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: n, Address: n + ":8000"})
	}
	return eps
}

func TestPickErrors(t *testing.T) {
	tests := []struct {
		name     string
		config   string
		eps      []*signals.Endpoint
		pickOpt  []picker.Option
		opts     pickergrpc.Options
		holdOpen int
		want     codes.Code
	}{
		{name: "no endpoints", want: codes.Unavailable},
		{name: "shed", eps: endpoints("a"), pickOpt: []picker.Option{picker.WithAdmitter(rejectAll{})}, want: codes.ResourceExhausted},
		{name: "filtered out, fail closed", eps: endpoints("a"), config: queueConfig + "failClosed: true\n",
			want: codes.Unavailable},
		{name: "too many reservations", eps: endpoints("a"), opts: pickergrpc.Options{MaxReservations: 2}, holdOpen: 2,
			want: codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{config: tc.config, eps: tc.eps, opts: tc.opts, pickOpt: tc.pickOpt})
			ctx := context.Background()
			for range tc.holdOpen {
				_, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
				require.NoError(t, err)
			}
			req := &pickerpb.PickRequest{Headers: map[string]string{"x-gateway-destination-endpoint-subset": "nowhere:1"}}
			_, err := h.client.Pick(ctx, req)
			require.Error(t, err)
			assert.Equal(t, tc.want, status.Code(err), err.Error())
			assert.Equal(t, tc.holdOpen, h.server.Outstanding())
		})
	}
}

// gate is an admitter that admits every request, but only once the test
// opens it: each Admit reports its arrival on entered and then waits.
type gate struct {
	entered chan struct{}
	open    chan struct{}
}

func (g *gate) Admit(ctx context.Context, _ *scorer.Input) (bool, string) {
	g.entered <- struct{}{}
	select {
	case <-g.open:
		return true, ""
	case <-ctx.Done():
		return false, "canceled"
	}
}

// TestMaxReservationsUnderConcurrency holds concurrent Picks inside the
// picker until every Pick has either reached it or been refused, so that
// each Pick checks the bound while the others are in flight: exactly
// MaxReservations of them may get through.
func TestMaxReservationsUnderConcurrency(t *testing.T) {
	const limit, picks = 4, 64
	eps := endpoints("a", "b")
	g := &gate{entered: make(chan struct{}, picks), open: make(chan struct{})}
	h := newHarness(t, setup{eps: eps, opts: pickergrpc.Options{MaxReservations: limit},
		pickOpt: []picker.Option{picker.WithAdmitter(g)}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang
	defer cancel()

	type result struct {
		id  string
		err error
	}
	results := make(chan result, picks)
	for range picks {
		go func() {
			resp, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
			results <- result{resp.GetReservationId(), err}
		}()
	}
	var got []result
	entered := 0
	for entered+len(got) < picks {
		select {
		case <-g.entered:
			entered++
		case r := <-results:
			got = append(got, r)
		case <-ctx.Done():
			require.FailNow(t, "picks hang", "%d entered the picker, %d returned", entered, len(got))
		}
	}
	close(g.open)
	for len(got) < picks {
		got = append(got, <-results)
	}

	var ids []string
	for _, r := range got {
		if r.err == nil {
			ids = append(ids, r.id)
			continue
		}
		assert.Equal(t, codes.ResourceExhausted, status.Code(r.err), r.err.Error())
	}
	assert.Equal(t, limit, len(ids), "successful picks")
	assert.Equal(t, limit, entered, "picks that reached the picker")
	assert.Equal(t, len(ids), h.server.Outstanding())
	var inFlight int64
	var dispatched uint64
	for _, ep := range eps {
		inFlight += ep.InFlight()
		dispatched += ep.Counters().Dispatched
	}
	assert.Equal(t, int64(len(ids)), inFlight)
	assert.Equal(t, uint64(len(ids)), dispatched, "refused picks dispatch nothing")

	for _, id := range ids {
		_, err := h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: id})
		require.NoError(t, err)
	}
	assert.Zero(t, h.server.Outstanding())
	for _, ep := range eps {
		assert.Zero(t, ep.InFlight(), ep.Name)
	}
	// The freed slots are usable again.
	_, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
	require.NoError(t, err)
}

func TestPickInvalidArgument(t *testing.T) {
	tests := []struct {
		name    string
		in      *pickerpb.PickRequest
		wantMsg string
	}{
		{name: "negative prompt_tokens", in: &pickerpb.PickRequest{PromptTokens: -1}, wantMsg: "prompt_tokens: -1 is negative"},
		{name: "negative max_output_tokens", in: &pickerpb.PickRequest{MaxOutputTokens: -5},
			wantMsg: "max_output_tokens: -5 is negative"},
		{name: "negative ttft_slo", in: &pickerpb.PickRequest{TtftSlo: durationpb.New(-time.Second)},
			wantMsg: "ttft_slo: -1s is negative"},
		{name: "malformed ttft_slo", in: &pickerpb.PickRequest{TtftSlo: &durationpb.Duration{Seconds: 1, Nanos: -1}},
			wantMsg: "ttft_slo: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := endpoints("a")
			h := newHarness(t, setup{eps: eps})
			_, err := h.client.Pick(context.Background(), tc.in)
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), err.Error())
			assert.Contains(t, status.Convert(err).Message(), tc.wantMsg)
			assert.Zero(t, h.server.Outstanding())
			assert.Zero(t, eps[0].Counters().Dispatched, "nothing was picked")
		})
	}
	// Zero values are valid: every PickRequest field is optional.
	h := newHarness(t, setup{eps: endpoints("a")})
	_, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{TtftSlo: durationpb.New(0)})
	require.NoError(t, err)
}

func TestPickThenDone(t *testing.T) {
	eps := endpoints("a", "b")
	h := newHarness(t, setup{eps: eps})
	ctx := context.Background()

	resp, err := h.client.Pick(ctx, &pickerpb.PickRequest{RequestId: "r1", Model: "m", PromptTokens: 100})
	require.NoError(t, err)
	require.Len(t, resp.GetReservationId(), 32)
	assert.Equal(t, pickergrpc.DefaultReservationTimeout, resp.GetReservationTimeout().AsDuration())
	chosen := byName(eps, resp.GetEndpoint().GetName())
	require.NotNil(t, chosen)
	assert.Equal(t, chosen.Address, resp.GetEndpoint().GetAddress())
	require.Len(t, resp.GetFallbacks(), 1)
	assert.NotEqual(t, chosen.Name, resp.GetFallbacks()[0].GetName())
	assert.Equal(t, int64(1), chosen.InFlight())
	assert.Equal(t, 1, h.server.Outstanding())
	n, tok := chosen.Prefilling()
	assert.Equal(t, int64(1), n)
	assert.Equal(t, int64(100), tok)

	// The first byte arrived: the request leaves the prefill queue but
	// stays reserved.
	_, err = h.client.FirstToken(ctx, &pickerpb.FirstTokenRequest{ReservationId: resp.GetReservationId()})
	require.NoError(t, err)
	n, tok = chosen.Prefilling()
	assert.Zero(t, n)
	assert.Zero(t, tok)
	assert.Equal(t, int64(1), chosen.InFlight())
	assert.Equal(t, 1, h.server.Outstanding())

	_, err = h.client.Done(ctx, &pickerpb.DoneRequest{
		ReservationId:    resp.GetReservationId(),
		Ttft:             durationpb.New(120 * time.Millisecond),
		Latency:          durationpb.New(900 * time.Millisecond),
		PromptTokens:     100,
		CompletionTokens: 20,
		Buffered:         true,
	})
	require.NoError(t, err)
	assert.Equal(t, int64(0), chosen.InFlight())
	assert.Equal(t, 0, h.server.Outstanding())
	outs, got := h.rec.completions()
	require.Len(t, outs, 1)
	assert.Same(t, chosen, got[0])
	assert.NoError(t, outs[0].Err)
	assert.Equal(t, 120*time.Millisecond, outs[0].TTFT)
	assert.Equal(t, 900*time.Millisecond, outs[0].Latency)
	assert.Equal(t, 100, outs[0].PromptTokens)
	assert.Equal(t, 20, outs[0].CompletionTokens)
	assert.True(t, outs[0].Buffered, "a whole body reaches the observers as such")

	_, err = h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: resp.GetReservationId()})
	assert.Equal(t, codes.NotFound, status.Code(err), "a second Done")
	_, err = h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: "never-issued"})
	assert.Equal(t, codes.NotFound, status.Code(err))
	_, err = h.client.FirstToken(ctx, &pickerpb.FirstTokenRequest{ReservationId: resp.GetReservationId()})
	assert.Equal(t, codes.NotFound, status.Code(err), "FirstToken after Done")
}

func TestDoneOutcomes(t *testing.T) {
	tests := []struct {
		name        string
		done        *pickerpb.DoneRequest
		wantErr     string
		wantHealthy bool
	}{
		{name: "success", done: &pickerpb.DoneRequest{}, wantHealthy: true},
		{name: "request error", done: &pickerpb.DoneRequest{Error: "HTTP 500"},
			wantErr: "reported by client: HTTP 500", wantHealthy: true},
		{name: "connect error", done: &pickerpb.DoneRequest{Error: "dial refused", ConnectError: true},
			wantErr: "reported by client: dial refused", wantHealthy: false},
		{name: "connect error without text", done: &pickerpb.DoneRequest{ConnectError: true},
			wantErr: "reported by client: connect error", wantHealthy: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := endpoints("a")
			h := newHarness(t, setup{eps: eps})
			resp, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{})
			require.NoError(t, err)
			tc.done.ReservationId = resp.GetReservationId()
			_, err = h.client.Done(context.Background(), tc.done)
			require.NoError(t, err)
			outs, _ := h.rec.completions()
			require.Len(t, outs, 1)
			if tc.wantErr == "" {
				assert.NoError(t, outs[0].Err)
			} else {
				var re *pickergrpc.RemoteError
				require.ErrorAs(t, outs[0].Err, &re)
				assert.EqualError(t, outs[0].Err, tc.wantErr)
			}
			assert.Equal(t, tc.done.GetConnectError(), outs[0].ConnectError)
			assert.Equal(t, tc.wantHealthy, eps[0].Healthy())
		})
	}
}

func TestSequentialPicksSpreadLoad(t *testing.T) {
	eps := endpoints("a", "b", "c")
	h := newHarness(t, setup{eps: eps})
	for range 9 {
		_, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{})
		require.NoError(t, err)
	}
	// The queue scorer sees each endpoint's in-flight count: every pick
	// goes to one of the least loaded, so 9 picks give 3 each.
	for _, ep := range eps {
		assert.Equal(t, int64(3), ep.InFlight(), ep.Name)
	}
	assert.Equal(t, 9, h.server.Outstanding())
}

func TestConcurrentPicks(t *testing.T) {
	const workers, perWorker = 16, 25
	eps := endpoints("a", "b", "c", "d")
	h := newHarness(t, setup{eps: eps})
	ctx := context.Background()

	// Phase 1: every worker holds its picks open, then all are released.
	var mu sync.Mutex
	ids := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				resp, err := h.client.Pick(ctx, &pickerpb.PickRequest{RequestId: strings.Repeat("x", w%3+i%2)})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ids[resp.GetReservationId()] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, ids, workers*perWorker, "reservation ids are unique")
	assert.Equal(t, workers*perWorker, h.server.Outstanding())
	var inFlight int64
	for _, ep := range eps {
		inFlight += ep.InFlight()
	}
	assert.Equal(t, int64(workers*perWorker), inFlight)

	// Phase 2: concurrent Dones, some of them failures.
	idList := make(chan string, len(ids))
	for id := range ids {
		idList <- id
	}
	close(idList)
	doneErrs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range idList {
				d := &pickerpb.DoneRequest{ReservationId: id}
				if w%4 == 0 {
					d.Error = "upstream 500"
				}
				if _, err := h.client.Done(ctx, d); err != nil {
					doneErrs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(doneErrs)
	for err := range doneErrs {
		require.NoError(t, err)
	}
	assert.Equal(t, 0, h.server.Outstanding())
	var dispatched, completed uint64
	for _, ep := range eps {
		assert.Equal(t, int64(0), ep.InFlight(), ep.Name)
		c := ep.Counters()
		dispatched += c.Dispatched
		completed += c.Completed
	}
	assert.Equal(t, uint64(workers*perWorker), dispatched)
	assert.Equal(t, uint64(workers*perWorker), completed)
	outs, _ := h.rec.completions()
	assert.Len(t, outs, workers*perWorker)
}

func TestReservationTimeout(t *testing.T) {
	const ttl = 30 * time.Second
	eps := endpoints("a")
	h := newHarness(t, setup{eps: eps, opts: pickergrpc.Options{ReservationTimeout: ttl}})
	ctx := context.Background()
	ep := eps[0]

	first, err := h.client.Pick(ctx, &pickerpb.PickRequest{RequestId: "never-done"})
	require.NoError(t, err)
	assert.Equal(t, ttl, first.GetReservationTimeout().AsDuration())
	h.clock.Advance(20 * time.Second)
	second, err := h.client.Pick(ctx, &pickerpb.PickRequest{RequestId: "done-late"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), ep.InFlight())

	t.Run("nothing expires before the deadline", func(t *testing.T) {
		h.clock.Advance(10*time.Second - time.Nanosecond) // first is 30s-1ns old
		assert.Equal(t, 0, h.server.Sweep())
		assert.Equal(t, 2, h.server.Outstanding())
	})
	t.Run("the never-done pick is released at its deadline", func(t *testing.T) {
		h.clock.Advance(time.Nanosecond) // first is exactly 30s old, second 10s
		assert.Equal(t, 1, h.server.Sweep())
		assert.Equal(t, 1, h.server.Outstanding())
		assert.Equal(t, int64(1), ep.InFlight())
		outs, _ := h.rec.completions()
		require.Len(t, outs, 1)
		assert.ErrorIs(t, outs[0].Err, pickergrpc.ErrReservationExpired)
		h.rec.mu.Lock()
		assert.Equal(t, "never-done", h.rec.reqs[0].ID)
		h.rec.mu.Unlock()
	})
	t.Run("a Done after expiry is NOT_FOUND", func(t *testing.T) {
		_, err := h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: first.GetReservationId()})
		assert.Equal(t, codes.NotFound, status.Code(err))
	})
	t.Run("Pick sweeps without Run", func(t *testing.T) {
		h.clock.Advance(25 * time.Second) // second is 35s old
		third, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
		require.NoError(t, err)
		assert.Equal(t, 1, h.server.Outstanding(), "only the new pick is open")
		assert.Equal(t, int64(1), ep.InFlight())
		_, err = h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: second.GetReservationId()})
		assert.Equal(t, codes.NotFound, status.Code(err))
		_, err = h.client.Done(ctx, &pickerpb.DoneRequest{ReservationId: third.GetReservationId()})
		require.NoError(t, err)
		assert.Equal(t, int64(0), ep.InFlight())
		outs, _ := h.rec.completions()
		require.Len(t, outs, 3)
		assert.ErrorIs(t, outs[1].Err, pickergrpc.ErrReservationExpired)
		assert.NoError(t, outs[2].Err)
	})
}

func TestCloseReleasesReservations(t *testing.T) {
	eps := endpoints("a", "b")
	h := newHarness(t, setup{eps: eps})
	ctx := context.Background()
	for range 3 {
		_, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
		require.NoError(t, err)
	}
	h.server.Close()
	assert.Equal(t, 0, h.server.Outstanding())
	assert.Equal(t, int64(0), eps[0].InFlight()+eps[1].InFlight())
	outs, _ := h.rec.completions()
	require.Len(t, outs, 3)
	for _, o := range outs {
		assert.ErrorIs(t, o.Err, pickergrpc.ErrServerClosed)
	}
	_, err := h.client.Pick(ctx, &pickerpb.PickRequest{})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, int64(0), eps[0].InFlight()+eps[1].InFlight(), "the refused pick was released")
	h.server.Close() // idempotent
}

func TestExplainBreakdown(t *testing.T) {
	clk := signalstest.NewClock(t0)
	// a: 4 waiting, 20% KV; b: empty queue, 60% KV; scraped now.
	a := signalstest.Endpoint("a", signalstest.Load{Running: 0, Waiting: 4, KV: 0.2, ScrapedAt: t0})
	b := signalstest.Endpoint("b", signalstest.Load{Running: 0, Waiting: 0, KV: 0.6, ScrapedAt: t0})
	h := newHarness(t, setup{
		eps:    []*signals.Endpoint{a, b},
		config: "scorers:\n  - {name: queue, weight: 2}\n  - {name: kv-cache, weight: 1}\n",
		opts:   pickergrpc.Options{Clock: clk},
	})
	resp, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{Explain: true})
	require.NoError(t, err)
	bd := resp.GetBreakdown()
	require.NotNil(t, bd)
	assert.Equal(t, []string{"queue", "kv-cache"}, bd.GetScorers())
	require.Len(t, bd.GetCandidates(), 2)
	// queue: min-max inverted over {4, 0} gives a 0, b 1, weighted by 2;
	// kv-cache: 1 − utilisation gives a 0.8, b 0.4, weighted by 1.
	want := map[string]struct {
		total  float64
		contrs []float64
		chosen bool
	}{
		"a": {total: 0.8, contrs: []float64{0, 0.8}},
		"b": {total: 2.4, contrs: []float64{2, 0.4}, chosen: true},
	}
	for _, c := range bd.GetCandidates() {
		w, ok := want[c.GetName()]
		require.True(t, ok, c.GetName())
		assert.InDelta(t, w.total, c.GetTotal(), 1e-9, c.GetName())
		assert.InDeltaSlice(t, w.contrs, c.GetContributions(), 1e-9, c.GetName())
		assert.Equal(t, w.chosen, c.GetChosen(), c.GetName())
	}
	assert.Equal(t, "b", resp.GetEndpoint().GetName())
	assert.Contains(t, bd.GetText(), "kv-cache")

	noExplain, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{})
	require.NoError(t, err)
	assert.Nil(t, noExplain.GetBreakdown())
}

func TestRequestFields(t *testing.T) {
	eps := endpoints("a", "b", "c")
	h := newHarness(t, setup{eps: eps})
	tests := []struct {
		name       string
		in         *pickerpb.PickRequest
		wantEP     string
		wantBlocks int
		check      func(t *testing.T, req *signals.Request)
	}{
		{
			name:   "subset hint in headers",
			in:     &pickerpb.PickRequest{Headers: map[string]string{"x-gateway-destination-endpoint-subset": "c:8000"}},
			wantEP: "c",
		},
		{
			// 200 bytes of prompt are 3 full 64-byte blocks.
			name:       "prompt is hashed into blocks",
			in:         &pickerpb.PickRequest{Model: "m", Prompt: strings.Repeat("p", 200)},
			wantBlocks: 3,
		},
		{
			name:       "precomputed blocks win over the prompt",
			in:         &pickerpb.PickRequest{Prompt: strings.Repeat("p", 200), PromptBlocks: []uint64{7, 8}},
			wantBlocks: 2,
		},
		{
			name: "scalar fields",
			in: &pickerpb.PickRequest{RequestId: "id", Model: "m", Adapter: "lora1", PromptTokens: 10,
				MaxOutputTokens: 20, Priority: -1, SessionKey: "s", TtftSlo: durationpb.New(time.Second)},
			check: func(t *testing.T, req *signals.Request) {
				assert.Equal(t, signals.Request{ID: "id", Model: "m", Adapter: "lora1", PromptTokens: 10,
					MaxOutputTokens: 20, Priority: -1, SessionKey: "s", SLO: signals.SLO{TTFT: time.Second}}, *req)
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.client.Pick(context.Background(), tc.in)
			require.NoError(t, err)
			if tc.wantEP != "" {
				assert.Equal(t, tc.wantEP, resp.GetEndpoint().GetName())
			}
			_, err = h.client.Done(context.Background(), &pickerpb.DoneRequest{ReservationId: resp.GetReservationId()})
			require.NoError(t, err)
			h.rec.mu.Lock()
			req := h.rec.reqs[i]
			h.rec.mu.Unlock()
			assert.Len(t, req.PromptBlocks, tc.wantBlocks)
			if tc.check != nil {
				tc.check(t, req)
			}
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("entropy exhausted") }

func TestReservationIDFailureReleasesPick(t *testing.T) {
	eps := endpoints("a")
	h := newHarness(t, setup{eps: eps, opts: pickergrpc.Options{Rand: failingReader{}}})
	_, err := h.client.Pick(context.Background(), &pickerpb.PickRequest{})
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Equal(t, int64(0), eps[0].InFlight())
	assert.Equal(t, 0, h.server.Outstanding())
}

func byName(eps []*signals.Endpoint, name string) *signals.Endpoint {
	for _, ep := range eps {
		if ep.Name == name {
			return ep
		}
	}
	return nil
}
