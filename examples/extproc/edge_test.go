package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferroute/inferroute/examples/extproc"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// scriptedStream is an in-process ExternalProcessor_ProcessServer: it feeds
// the scripted requests to Process, then io.EOF, and records the
// responses. Calling Process directly lets a test recover a panic of the
// stream goroutine (over gRPC it would kill the whole process).
type scriptedStream struct {
	grpc.ServerStream
	ctx context.Context
	mu  sync.Mutex
	in  []*extprocv3.ProcessingRequest
	out []*extprocv3.ProcessingResponse
}

func (s *scriptedStream) Context() context.Context { return s.ctx }

func (s *scriptedStream) Send(r *extprocv3.ProcessingResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out = append(s.out, r)
	return nil
}

func (s *scriptedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.in) == 0 {
		return nil, io.EOF
	}
	m := s.in[0]
	s.in = s.in[1:]
	return m, nil
}

// directServer builds an extproc.Server directly (no gRPC) over one pool of
// the given addresses, with a recorder observing the picks.
func directServer(t *testing.T, opts extproc.Options, addrs ...string) (*extproc.Server, []*signals.Endpoint, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg, err := picker.ParseConfig([]byte(pickerConfig))
	require.NoError(t, err)
	p, err := picker.New(cfg, picker.WithClock(signalstest.NewClock(t0)), picker.WithObservers(rec))
	require.NoError(t, err)
	var eps []*signals.Endpoint
	for _, a := range addrs {
		eps = append(eps, signals.NewEndpoint(signals.EndpointSpec{Address: a, Model: "llama-3-8b"}))
	}
	p.SetEndpoints(eps)
	table, err := router.NewTable(router.TableConfig{Pools: []router.PoolConfig{{
		Name: "llama", Picker: p, Models: []string{"llama-3-8b"}}}})
	require.NoError(t, err)
	opts.Table = table
	if opts.Clock == nil {
		opts.Clock = signalstest.NewClock(t0)
	}
	srv, err := extproc.NewServer(opts)
	require.NoError(t, err)
	return srv, eps, rec
}

// runProcess runs Process over a scripted stream and returns the
// responses, the value of a recovered panic (nil if none) and Process's
// error.
func runProcess(t *testing.T, srv *extproc.Server, msgs ...*extprocv3.ProcessingRequest) (out []*extprocv3.ProcessingResponse, panicked any, err error) {
	t.Helper()
	st := &scriptedStream{ctx: context.Background(), in: msgs}
	func() {
		defer func() { panicked = recover() }()
		err = srv.Process(st)
	}()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.out, panicked, err
}

func sumInFlight(eps []*signals.Endpoint) (inFlight int64, dispatched, completed uint64) {
	for _, ep := range eps {
		inFlight += ep.InFlight()
		c := ep.Counters()
		dispatched += c.Dispatched
		completed += c.Completed
	}
	return
}

// TestSubsetHintWithoutRequestHeaders: Envoy sends no request_headers
// message when the filter's request_header_mode is SKIP. In BUFFERED mode
// the request is then routed on the body alone, the destination going in
// the body response, and a subset hint in the body message's metadata
// still restricts the pick; the pick is released when the stream ends.
func TestSubsetHintWithoutRequestHeaders(t *testing.T) {
	srv, eps, _ := directServer(t, extproc.Options{}, "10.0.0.1:8000", "10.0.0.2:8000")
	body := requestBody(chatBody, true)
	body.ProtocolConfig = protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE)
	body = withSubset(body, "10.0.0.2:8000")

	out, panicked, err := runProcess(t, srv, body)
	require.Nil(t, panicked, "Process panicked: %v", panicked)
	require.NoError(t, err)
	require.Len(t, out, 1)
	r := out[0]
	dest := destination(t, r, r.GetRequestBody().GetResponse().GetHeaderMutation())
	assert.Equal(t, "10.0.0.2:8000", dest)
	inFlight, _, _ := sumInFlight(eps)
	assert.Zero(t, inFlight, "the stream ended: Done was called")
}

// TestSecondRequestHeadersDoNotLeakAPick: a request_headers message
// arriving after the request was already routed is a protocol violation
// the server refuses without picking again: every pick gets exactly one
// Done, and no endpoint is left with a request in flight.
func TestSecondRequestHeadersDoNotLeakAPick(t *testing.T) {
	srv, eps, rec := directServer(t, extproc.Options{}, "10.0.0.1:8000", "10.0.0.2:8000")
	get := func() *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{
			ProtocolConfig: protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED),
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: headerMap(":method", "GET", ":path", "/v1/models"), EndOfStream: true}},
		}
	}
	out, panicked, err := runProcess(t, srv, get(), get())
	require.Nil(t, panicked)
	assert.Len(t, out, 1, "only the first request headers are answered")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "the repeated request headers are refused")
	inFlight, dispatched, completed := sumInFlight(eps)
	assert.Equal(t, uint64(1), dispatched, "one pick")
	assert.Zero(t, inFlight, "every pick was released once the stream ended")
	assert.Equal(t, dispatched, completed, "one Done per pick (dispatched %d, completed %d)", dispatched, completed)
	rec.mu.Lock()
	assert.Len(t, rec.outs, int(dispatched))
	rec.mu.Unlock()
}

// TestFullDuplexBodyWithoutRequestHeadersIsRefused: in
// FULL_DUPLEX_STREAMED mode the destination can only go in the request
// headers response, so a body that comes without request headers
// (request_header_mode SKIP) is refused with FailedPrecondition, without
// picking and without an unsolicited headers response.
func TestFullDuplexBodyWithoutRequestHeadersIsRefused(t *testing.T) {
	srv, eps, _ := directServer(t, extproc.Options{}, "10.0.0.1:8000")
	body := requestBody(chatBody, true)
	body.ProtocolConfig = protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	out, panicked, err := runProcess(t, srv, body)
	require.Nil(t, panicked)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Empty(t, out)
	_, dispatched, _ := sumInFlight(eps)
	assert.Zero(t, dispatched)
}

// TestFullDuplexTrailersKeepBodyOpen: in FULL_DUPLEX_STREAMED mode a
// request with trailers has every body chunk sent with end_of_stream
// false, the trailers marking the end. StreamedBodyResponse.end_of_stream
// is to be set only "if it has received a body request with end_of_stream
// set to true" (ext_proc v3 API): the body streamed back is whole, and
// none of its chunks ends the body stream, which stays open for the
// trailers.
func TestFullDuplexTrailersKeepBodyOpen(t *testing.T) {
	h := newHarness(t, setup{})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false))
	e.send(requestBody(chatBody, false))
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{}}})
	require.NotNil(t, e.recv().GetRequestHeaders())
	var got strings.Builder
	for {
		r := e.recv()
		if r.GetRequestTrailers() != nil {
			break
		}
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		require.NotNil(t, sr, "%v", r)
		got.Write(sr.GetBody())
		assert.False(t, sr.GetEndOfStream(),
			"Envoy never sent a body chunk with end_of_stream: the trailers end this request, not the body")
	}
	assert.Equal(t, chatBody, got.String())
}

// TestAnnouncedRequestBodyModeNone: Envoy fills protocol_config from
// its filter configuration on the first message; request_body_mode NONE
// there means the body will never be sent, so the request cannot be
// routed on it. The server answers at once, refusing the stream with
// FailedPrecondition as for the other modes it cannot route with, rather
// than holding the headers response for a body that never comes.
func TestAnnouncedRequestBodyModeNone(t *testing.T) {
	h := newHarness(t, setup{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := h.client.Process(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(requestHeaders(protocol(filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false)))
	got := make(chan error, 1)
	go func() {
		r, err := st.Recv()
		if err == nil && r == nil {
			err = fmt.Errorf("nil response")
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			assert.Equal(t, codes.FailedPrecondition, status.Code(err), err.Error())
		}
	case <-time.After(2 * time.Second):
		assert.Fail(t, "no answer to the request headers although Envoy announced it sends no request body")
	}
}

// --- Contract paths not covered by server_test.go.

// TestIPv6Destination: IPv6 endpoints go out bracketed, header and
// metadata alike, and a bracketed subset hint selects them.
func TestIPv6Destination(t *testing.T) {
	srv, _, _ := directServer(t, extproc.Options{}, "[fd00::1]:8000", "[fd00::2]:8000")
	hdrs := withSubset(requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false),
		"[fd00::2]:8000")
	out, panicked, err := runProcess(t, srv, hdrs, requestBody(chatBody, true))
	require.Nil(t, panicked)
	require.NoError(t, err)
	require.NotEmpty(t, out)
	dest := destination(t, out[0], out[0].GetRequestHeaders().GetResponse().GetHeaderMutation())
	assert.Equal(t, "[fd00::2]:8000", dest)
}

// TestSubsetHintAsString: the hint given as one comma-separated string.
func TestSubsetHintAsString(t *testing.T) {
	srv, _, _ := directServer(t, extproc.Options{}, "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")
	hdrs := requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false)
	hint, err := structpb.NewStruct(map[string]any{extproc.KeySubset: " 10.0.0.3:8000 , 10.9.9.9:1"})
	require.NoError(t, err)
	hdrs.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: hint}}
	out, panicked, err := runProcess(t, srv, hdrs, requestBody(chatBody, true))
	require.Nil(t, panicked)
	require.NoError(t, err)
	dest := destination(t, out[0], out[0].GetRequestHeaders().GetResponse().GetHeaderMutation())
	assert.Equal(t, "10.0.0.3:8000", dest)
}

// TestImmediateResponsesFullDuplex: the errors of the contract in
// the inference extension's own mode, with the body in several chunks, and
// never a pick left open.
func TestImmediateResponsesFullDuplex(t *testing.T) {
	tests := []struct {
		name       string
		opts       extproc.Options
		noEPs      bool
		chunks     []string
		wantStatus int
		wantCode   string
	}{
		{name: "malformed", chunks: []string{`{"model":"llama-3-8b",`, `"messages":[}`}, wantStatus: 400, wantCode: "invalid_request"},
		{name: "wrong model type", chunks: []string{`{"model":42,"prompt":"x"}`}, wantStatus: 400, wantCode: "invalid_request"},
		{name: "unknown model", chunks: []string{`{"model":"no`, `pe","prompt":"x"}`}, wantStatus: 404, wantCode: "model_not_found"},
		{name: "too large over chunks", opts: extproc.Options{MaxBodyBytes: 64},
			chunks: []string{chatBody[:40], chatBody[40:80], chatBody[80:]}, wantStatus: 413, wantCode: "request_too_large"},
		{name: "no endpoints", noEPs: true, chunks: []string{chatBody}, wantStatus: 503, wantCode: "no_endpoint_available"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var addrs []string
			if !tc.noEPs {
				addrs = []string{"10.0.0.1:8000", "10.0.0.2:8000"}
			}
			srv, eps, _ := directServer(t, tc.opts, addrs...)
			msgs := []*extprocv3.ProcessingRequest{requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false)}
			for i, c := range tc.chunks {
				msgs = append(msgs, requestBody(c, i == len(tc.chunks)-1))
			}
			out, panicked, err := runProcess(t, srv, msgs...)
			require.Nil(t, panicked)
			require.NoError(t, err)
			require.Len(t, out, 1)
			ir := out[0].GetImmediateResponse()
			require.NotNil(t, ir, "%v", out[0])
			assert.Equal(t, tc.wantStatus, int(ir.GetStatus().GetCode()))
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(ir.GetBody(), &body), string(ir.GetBody()))
			require.NotNil(t, body.Error.Code)
			assert.Equal(t, tc.wantCode, *body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			assert.NotEmpty(t, body.Error.Type)
			inFlight, dispatched, _ := sumInFlight(eps)
			assert.Zero(t, inFlight)
			assert.Zero(t, dispatched)
		})
	}
}

// TestStreamEndsAtEveryStep: Envoy closes the stream after each step
// of a FULL_DUPLEX_STREAMED exchange; Done comes exactly once for a pick
// and never without one.
func TestStreamEndsAtEveryStep(t *testing.T) {
	all := []*extprocv3.ProcessingRequest{
		requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false,
			extproc.HeaderDestination, "10.6.6.6:1"),
		requestBody(chatBody[:50], false),
		requestBody(chatBody[50:], true),
		responseHeaders("200", false, ""),
		responseBody("data: x\n\n", false),
		responseBody("data: [DONE]\n\n", true),
	}
	for n := 1; n <= len(all); n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			srv, eps, rec := directServer(t, extproc.Options{}, "10.0.0.1:8000", "10.0.0.2:8000")
			_, panicked, err := runProcess(t, srv, all[:n]...)
			require.Nil(t, panicked)
			require.NoError(t, err)
			inFlight, dispatched, completed := sumInFlight(eps)
			assert.Zero(t, inFlight)
			assert.Equal(t, dispatched, completed)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			assert.Len(t, rec.outs, int(dispatched))
			if n >= 3 {
				require.Len(t, rec.outs, 1)
				if n < len(all) {
					assert.ErrorIs(t, rec.outs[0].Err, extproc.ErrStreamEnded)
				} else {
					assert.NoError(t, rec.outs[0].Err)
				}
			}
		})
	}
}

// TestSpoofedDestinationOnGet: a client's destination header never
// survives, also on a body-less request decided in the headers response.
func TestSpoofedDestinationOnGet(t *testing.T) {
	srv, _, _ := directServer(t, extproc.Options{}, "10.0.0.1:8000")
	out, _, err := runProcess(t, srv, &extprocv3.ProcessingRequest{
		ProtocolConfig: protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED),
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":method", "GET", ":path", "/v1/models", extproc.HeaderDestination, "10.6.6.6:1",
				extproc.KeySubset, "10.6.6.6:1"), EndOfStream: true}},
	})
	require.NoError(t, err)
	mut := out[0].GetRequestHeaders().GetResponse().GetHeaderMutation()
	assert.Equal(t, "10.0.0.1:8000", destination(t, out[0], mut))
	assert.Contains(t, mut.GetRemoveHeaders(), extproc.KeySubset)
}
