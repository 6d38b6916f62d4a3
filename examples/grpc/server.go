package pickergrpc

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Defaults of Options.
const (
	// DefaultReservationTimeout is how long a reservation waits for Done.
	// Long generations stream for minutes, so the default errs long: a
	// leaked reservation only overstates one endpoint's load until then.
	DefaultReservationTimeout = 10 * time.Minute
	// DefaultMaxReservations bounds the open reservations, so a client that
	// never calls Done cannot grow the server's memory without limit.
	DefaultMaxReservations = 1 << 16
)

// Errors reported to the picker's Done (and so to its observers) when the
// server releases a reservation itself.
var (
	// ErrReservationExpired: no Done came within the reservation timeout.
	ErrReservationExpired = errors.New("pickergrpc: reservation expired without Done")
	// ErrServerClosed: the server was closed with the reservation open.
	ErrServerClosed = errors.New("pickergrpc: server closed")
)

// Options configures a Server. The zero value of every field means its
// default.
type Options struct {
	// ReservationTimeout is how long a picked endpoint stays reserved
	// without Done before the server releases it, reporting
	// ErrReservationExpired to the picker. Default
	// DefaultReservationTimeout.
	ReservationTimeout time.Duration
	// MaxReservations bounds the open reservations, counting those that
	// concurrent Picks are making: a Pick that would exceed it answers
	// RESOURCE_EXHAUSTED without picking. Default DefaultMaxReservations.
	MaxReservations int
	// Clock tells the time for reservation deadlines. Default the system
	// clock. Deadlines are assumed to come in the order reservations are
	// made, which holds for any clock that does not go backwards.
	Clock signals.Clock
	// Rand is the entropy source of reservation ids. Default crypto/rand:
	// an id is a bearer token for one Done, so it should not be guessable.
	Rand io.Reader
	// Hasher turns PickRequest.prompt into prefix blocks. Default
	// prefix.NewHasher with default block sizes.
	Hasher *prefix.Hasher
	// Logger logs released reservations. Default: discard.
	Logger *slog.Logger
}

// Server implements pickerpb.PickerServer over a picker.Picker. It keeps
// one reservation per successful Pick, holding the picker's Result until
// Done, the reservation timeout, or Close. It is safe for concurrent use.
type Server struct {
	pickerpb.UnimplementedPickerServer

	p      *picker.Picker
	ttl    time.Duration
	max    int
	clock  signals.Clock
	rand   io.Reader
	hasher *prefix.Hasher
	log    *slog.Logger

	mu      sync.Mutex
	byID    map[string]*list.Element // of *reservation
	order   *list.List               // reservations, oldest (earliest deadline) first
	picking int                      // Picks holding a slot under max, not yet in byID
	closed  bool
}

var _ pickerpb.PickerServer = (*Server)(nil)

// reservation is one picked, not yet finished request.
type reservation struct {
	id       string
	deadline time.Time
	done     func(picker.DoneInfo)
	first    func() // the pick's FirstToken
	endpoint string
}

// NewServer returns a Server picking with p. The Server does not own p.
func NewServer(p *picker.Picker, opts Options) *Server {
	s := &Server{
		p:      p,
		ttl:    opts.ReservationTimeout,
		max:    opts.MaxReservations,
		clock:  opts.Clock,
		rand:   opts.Rand,
		hasher: opts.Hasher,
		log:    opts.Logger,
		byID:   make(map[string]*list.Element),
		order:  list.New(),
	}
	if s.ttl <= 0 {
		s.ttl = DefaultReservationTimeout
	}
	if s.max <= 0 {
		s.max = DefaultMaxReservations
	}
	if s.clock == nil {
		s.clock = signals.SystemClock{}
	}
	if s.rand == nil {
		s.rand = rand.Reader
	}
	if s.hasher == nil {
		s.hasher = prefix.NewHasher(prefix.HashConfig{})
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Pick chooses an endpoint for the request and reserves it until Done.
// Expired reservations are released first. It does not block on I/O.
//
// It answers INVALID_ARGUMENT, naming the field, for a request with a
// negative prompt_tokens or max_output_tokens or a negative or malformed
// ttft_slo, and RESOURCE_EXHAUSTED without picking when MaxReservations
// reservations are open or being made by concurrent Picks, so the bound
// holds under any concurrency.
//
// A Pick whose context is done (the caller went away or its deadline
// passed) reserves nothing, since no Done could ever come for a
// reservation id the caller never receives: if the context ends before
// the reservation is committed, the pick is released at once, reporting
// the context's error to the picker, and Pick answers CANCELED or
// DEADLINE_EXCEEDED.
func (s *Server) Pick(ctx context.Context, in *pickerpb.PickRequest) (*pickerpb.PickResponse, error) {
	if err := validate(in); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, pickStatus(err)
	}
	s.sweep(s.clock.Now())
	// Take a slot under the bound before picking: the check and the
	// count are one step, so concurrent Picks cannot overshoot it. The
	// slot becomes the reservation below, or is freed on failure.
	s.mu.Lock()
	if n := len(s.byID) + s.picking; n >= s.max {
		s.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "%d reservations are open or being made; call Done", n)
	}
	s.picking++
	s.mu.Unlock()
	slot := true
	defer func() {
		if slot {
			s.mu.Lock()
			s.picking--
			s.mu.Unlock()
		}
	}()

	req := s.request(in)
	res, err := s.p.Pick(ctx, req)
	if err != nil {
		return nil, pickStatus(err)
	}
	out := &pickerpb.PickResponse{
		Endpoint:           endpointPB(res.Endpoint),
		ReservationTimeout: durationpb.New(s.ttl),
	}
	for _, ep := range res.Fallbacks {
		out.Fallbacks = append(out.Fallbacks, endpointPB(ep))
	}
	if in.GetExplain() {
		out.Breakdown = breakdownPB(res.Breakdown)
	}
	// Everything read from res is copied above: from here on the
	// reservation may be released (and res.Done called) at any time.
	id, err := s.newID()
	if err != nil {
		res.Done(picker.DoneInfo{Err: err})
		return nil, status.Errorf(codes.Internal, "reservation id: %v", err)
	}
	out.ReservationId = id
	r := &reservation{id: id, deadline: s.clock.Now().Add(s.ttl), done: res.Done, first: res.FirstToken, endpoint: res.Endpoint.Name}
	s.mu.Lock()
	s.picking--
	slot = false
	if s.closed {
		s.mu.Unlock()
		res.Done(picker.DoneInfo{Err: ErrServerClosed})
		return nil, status.Error(codes.Unavailable, "server closed")
	}
	// The caller is gone: the reservation id cannot reach it, so no Done
	// would ever come. Checked last, under the lock, right before the
	// commit.
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		res.Done(picker.DoneInfo{Err: err})
		return nil, pickStatus(err)
	}
	s.byID[id] = s.order.PushBack(r)
	s.mu.Unlock()
	return out, nil
}

// Done releases the reservation named in the request with its outcome.
// It answers NOT_FOUND for a reservation never issued, already done, or
// expired.
func (s *Server) Done(_ context.Context, in *pickerpb.DoneRequest) (*pickerpb.DoneResponse, error) {
	now := s.clock.Now()
	s.sweep(now)
	s.mu.Lock()
	e, ok := s.byID[in.GetReservationId()]
	if ok {
		s.order.Remove(e)
		delete(s.byID, in.GetReservationId())
	}
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "reservation %q is unknown, done or expired", in.GetReservationId())
	}
	e.Value.(*reservation).done(outcome(in))
	return &pickerpb.DoneResponse{}, nil
}

// FirstToken reports that a reservation's first response byte arrived
// (picker.Result.FirstToken). The reservation stays open until Done.
func (s *Server) FirstToken(_ context.Context, in *pickerpb.FirstTokenRequest) (*pickerpb.FirstTokenResponse, error) {
	s.sweep(s.clock.Now())
	s.mu.Lock()
	e, ok := s.byID[in.GetReservationId()]
	var first func()
	if ok {
		first = e.Value.(*reservation).first
	}
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "reservation %q is unknown, done or expired", in.GetReservationId())
	}
	first() // a no-op if Done raced ahead of it
	return &pickerpb.FirstTokenResponse{}, nil
}

// Sweep releases every reservation whose deadline is at or before the
// clock's now, reporting ErrReservationExpired to the picker, and returns
// how many it released. Pick and Done sweep too; Run sweeps an idle server.
func (s *Server) Sweep() int { return s.sweep(s.clock.Now()) }

func (s *Server) sweep(now time.Time) int {
	var expired []*reservation
	s.mu.Lock()
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		r := e.Value.(*reservation)
		if r.deadline.After(now) {
			break
		}
		s.order.Remove(e)
		delete(s.byID, r.id)
		expired = append(expired, r)
	}
	s.mu.Unlock()
	for _, r := range expired {
		s.log.Warn("reservation expired without Done", "reservation", r.id, "endpoint", r.endpoint)
		r.done(picker.DoneInfo{Err: ErrReservationExpired})
	}
	return len(expired)
}

// DefaultSweepInterval is Run's interval when it is given none.
const DefaultSweepInterval = time.Second

// Run sweeps expired reservations every interval (DefaultSweepInterval
// when interval ≤ 0) until ctx is done. It blocks: run it in its own
// goroutine.
func (s *Server) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Outstanding returns the number of open reservations.
func (s *Server) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Close releases every open reservation, reporting ErrServerClosed to the
// picker, and makes later Picks fail with UNAVAILABLE. It is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	var open []*reservation
	for e := s.order.Front(); e != nil; e = e.Next() {
		open = append(open, e.Value.(*reservation))
	}
	s.order.Init()
	clear(s.byID)
	s.mu.Unlock()
	for _, r := range open {
		r.done(picker.DoneInfo{Err: ErrServerClosed})
	}
}

func (s *Server) newID() (string, error) {
	var b [16]byte
	if _, err := io.ReadFull(s.rand, b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// validate checks the PickRequest fields that have invalid values: token
// counts and the TTFT objective cannot be negative.
func validate(in *pickerpb.PickRequest) error {
	if n := in.GetPromptTokens(); n < 0 {
		return status.Errorf(codes.InvalidArgument, "prompt_tokens: %d is negative", n)
	}
	if n := in.GetMaxOutputTokens(); n < 0 {
		return status.Errorf(codes.InvalidArgument, "max_output_tokens: %d is negative", n)
	}
	if d := in.GetTtftSlo(); d != nil {
		if err := d.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "ttft_slo: %v", err)
		}
		if d.AsDuration() < 0 {
			return status.Errorf(codes.InvalidArgument, "ttft_slo: %v is negative", d.AsDuration())
		}
	}
	return nil
}

// request converts a PickRequest. The Request is owned by the picker's
// Result until Done, so it is allocated per call.
func (s *Server) request(in *pickerpb.PickRequest) *signals.Request {
	req := &signals.Request{
		ID:              in.GetRequestId(),
		Model:           in.GetModel(),
		Adapter:         in.GetAdapter(),
		PromptTokens:    int(in.GetPromptTokens()),
		MaxOutputTokens: int(in.GetMaxOutputTokens()),
		Priority:        int(in.GetPriority()),
		SessionKey:      in.GetSessionKey(),
		PromptBlocks:    in.GetPromptBlocks(),
	}
	if d := in.GetTtftSlo(); d != nil {
		req.SLO.TTFT = d.AsDuration()
	}
	if len(in.GetHeaders()) > 0 {
		req.Headers = make(http.Header, len(in.GetHeaders()))
		for k, v := range in.GetHeaders() {
			req.Headers.Set(k, v)
		}
	}
	if len(req.PromptBlocks) == 0 && in.GetPrompt() != "" {
		req.PromptBlocks = s.hasher.HashText(nil, req.Model, req.Adapter, []byte(in.GetPrompt()))
	}
	return req
}

// pickStatus maps the picker's errors onto gRPC codes: shed requests are
// RESOURCE_EXHAUSTED (HTTP 429 through the gRPC-HTTP mapping), no endpoint
// is UNAVAILABLE (503).
func pickStatus(err error) error {
	switch {
	case errors.Is(err, picker.ErrSaturated):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, picker.ErrNoEndpoints):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func outcome(in *pickerpb.DoneRequest) picker.DoneInfo {
	out := picker.DoneInfo{
		ConnectError:     in.GetConnectError(),
		PromptTokens:     int(in.GetPromptTokens()),
		CachedTokens:     int(in.GetCachedTokens()),
		CompletionTokens: int(in.GetCompletionTokens()),
		Buffered:         in.GetBuffered(),
	}
	if in.GetError() != "" || in.GetConnectError() {
		msg := in.GetError()
		if msg == "" {
			msg = "connect error"
		}
		out.Err = &RemoteError{Message: msg}
	}
	if d := in.GetTtft(); d != nil {
		out.TTFT = d.AsDuration()
	}
	if d := in.GetLatency(); d != nil {
		out.Latency = d.AsDuration()
	}
	return out
}

// RemoteError is the error a client reported through Done.
type RemoteError struct {
	// Message is the client's error text.
	Message string
}

// Error implements error.
func (e *RemoteError) Error() string { return fmt.Sprintf("reported by client: %s", e.Message) }

func endpointPB(ep *signals.Endpoint) *pickerpb.Endpoint {
	return &pickerpb.Endpoint{Name: ep.Name, Address: ep.Address, Labels: ep.Labels}
}

// breakdownPB copies a Breakdown; it must run before the Result's Done.
func breakdownPB(b picker.Breakdown) *pickerpb.Breakdown {
	out := &pickerpb.Breakdown{Scorers: append([]string(nil), b.Scorers()...), Text: b.String()}
	chosen := b.Chosen()
	for i := 0; i < b.Len(); i++ {
		c := &pickerpb.Candidate{Name: b.Endpoint(i).Name, Total: b.Total(i), Chosen: i == chosen}
		for s := range out.Scorers {
			c.Contributions = append(c.Contributions, b.Contribution(s, i))
		}
		out.Candidates = append(out.Candidates, c)
	}
	return out
}
