package extproc_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
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
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferroute/inferroute/examples/extproc"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

const pickerConfig = `
filters:
  - name: subset
scorers:
  - name: queue
    weight: 1
`

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type recorder struct {
	mu   sync.Mutex
	outs []signals.Outcome
	eps  []*signals.Endpoint
	reqs []*signals.Request
}

func (r *recorder) Dispatched(*signals.Request, *signals.Endpoint) {}

func (r *recorder) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outs = append(r.outs, out)
	r.eps = append(r.eps, ep)
	r.reqs = append(r.reqs, req)
}

// waitCompleted waits until n completions were recorded: Done runs on the
// server's stream goroutine, after the client's last message.
func (r *recorder) waitCompleted(t *testing.T, n int) ([]signals.Outcome, []*signals.Endpoint) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a guard against a hang, not a measurement
	for {
		r.mu.Lock()
		if len(r.outs) >= n {
			outs, eps := append([]signals.Outcome(nil), r.outs...), append([]*signals.Endpoint(nil), r.eps...)
			r.mu.Unlock()
			return outs, eps
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			require.FailNowf(t, "Done never came", "want %d completions", n)
		}
		time.Sleep(time.Millisecond)
	}
}

type rejectAll struct{}

func (rejectAll) Admit(context.Context, *scorer.Input) (bool, string) { return false, "test sheds" }

type harness struct {
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
	eps    []*signals.Endpoint
	clock  *signalstest.Clock
	rec    *recorder
}

type setup struct {
	opts     extproc.Options
	noEPs    bool
	admitter scorer.Admitter
}

// newHarness serves an extproc.Server over bufconn with one pool
// ("llama-3-8b", adapter "sql-lora", alias "gpt-4o") of three endpoints.
func newHarness(t testing.TB, s setup) *harness {
	t.Helper()
	h := &harness{clock: signalstest.NewClock(t0), rec: &recorder{}}
	cfg, err := picker.ParseConfig([]byte(pickerConfig))
	require.NoError(t, err)
	popts := []picker.Option{picker.WithClock(h.clock), picker.WithObservers(h.rec)}
	if s.admitter != nil {
		popts = append(popts, picker.WithAdmitter(s.admitter))
	}
	p, err := picker.New(cfg, popts...)
	require.NoError(t, err)
	if !s.noEPs {
		for _, n := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			h.eps = append(h.eps, signals.NewEndpoint(signals.EndpointSpec{Address: n + ":8000", Model: "llama-3-8b"}))
		}
	}
	p.SetEndpoints(h.eps)
	table, err := router.NewTable(router.TableConfig{Pools: []router.PoolConfig{{
		Name: "llama", Picker: p, Models: []string{"llama-3-8b"},
		Adapters: map[string]string{"sql-lora": "llama-3-8b"},
		Aliases:  map[string]string{"gpt-4o": "llama-3-8b"},
	}}})
	require.NoError(t, err)
	s.opts.Table = table
	if s.opts.Clock == nil {
		s.opts.Clock = h.clock
	}
	srv, err := extproc.NewServer(s.opts)
	require.NoError(t, err)

	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(srv.GRPCServerOptions()...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	h.conn, err = grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = h.conn.Close()
		gs.Stop()
	})
	h.client = extprocv3.NewExternalProcessorClient(h.conn)
	return h
}

// envoy plays Envoy's side of one ext_proc stream.
type envoy struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
}

func (h *harness) open(t *testing.T) *envoy {
	st, err := h.client.Process(context.Background())
	require.NoError(t, err)
	return &envoy{t: t, stream: st}
}

func (e *envoy) send(m *extprocv3.ProcessingRequest) {
	e.t.Helper()
	require.NoError(e.t, e.stream.Send(m))
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	r, err := e.stream.Recv()
	require.NoError(e.t, err)
	return r
}

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func protocol(req, resp filterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
}

// requestHeaders is the first message: POST path, JSON, with optional
// extra headers and the protocol configuration.
func requestHeaders(pc *extprocv3.ProtocolConfiguration, eos bool, extra ...string) *extprocv3.ProcessingRequest {
	kv := append([]string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json"}, extra...)
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: pc,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(kv...), EndOfStream: eos}},
	}
}

func withSubset(m *extprocv3.ProcessingRequest, addrs ...string) *extprocv3.ProcessingRequest {
	vals := make([]any, len(addrs))
	for i, a := range addrs {
		vals[i] = a
	}
	hint, err := structpb.NewStruct(map[string]any{extproc.KeySubset: vals})
	if err != nil {
		panic(err)
	}
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: hint}}
	return m
}

func requestBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func responseHeaders(status string, eos bool, served string) *extprocv3.ProcessingRequest {
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", status), EndOfStream: eos}}}
	if served != "" {
		lb, _ := structpb.NewStruct(map[string]any{extproc.KeyServed: served})
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: lb}}
	}
	return m
}

func responseBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

const chatBody = `{"model":"llama-3-8b","messages":[{"role":"user","content":"Say hello to the gateway, please."}],"stream":true}`

// destination returns the destination header set by a mutation and checks
// that the envoy.lb metadata carries the same value.
func destination(t *testing.T, r *extprocv3.ProcessingResponse, mut *extprocv3.HeaderMutation) string {
	t.Helper()
	var hdr string
	for _, o := range mut.GetSetHeaders() {
		if o.GetHeader().GetKey() == extproc.HeaderDestination {
			hdr = string(o.GetHeader().GetRawValue())
			assert.Equal(t, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, o.GetAppendAction())
		}
	}
	require.NotEmpty(t, hdr, "destination header")
	md := r.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()
	assert.Equal(t, hdr, md[extproc.HeaderDestination].GetStringValue(), "metadata and header agree")
	return hdr
}

func (h *harness) byAddress(addr string) *signals.Endpoint {
	for _, ep := range h.eps {
		if ep.Address == addr {
			return ep
		}
	}
	return nil
}

func TestBufferedMode(t *testing.T) {
	h := newHarness(t, setup{})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false))
	r := e.recv()
	require.NotNil(t, r.GetRequestHeaders(), "headers are answered at once in BUFFERED mode")
	assert.Empty(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders())

	e.send(requestBody(chatBody, true))
	r = e.recv()
	br := r.GetRequestBody()
	require.NotNil(t, br, "the decision comes in the body response")
	assert.Nil(t, br.GetResponse().GetBodyMutation(), "the body is not changed")
	dest := destination(t, r, br.GetResponse().GetHeaderMutation())
	addrs := strings.Split(dest, ",")
	require.Len(t, addrs, 3, "primary and the default 2 fallbacks")
	assert.ElementsMatch(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, addrs)
	primary := h.byAddress(addrs[0])
	assert.Equal(t, int64(1), primary.InFlight())
	n, _ := primary.Prefilling()
	assert.Equal(t, int64(1), n, "prefilling until the first response byte")

	e.send(responseHeaders("200", false, ""))
	require.NotNil(t, e.recv().GetResponseHeaders())
	h.clock.Advance(150 * time.Millisecond)
	e.send(responseBody("data: {\"choices\":[]}\n\n", false))
	rb := e.recv().GetResponseBody()
	require.NotNil(t, rb)
	n, _ = primary.Prefilling()
	assert.Zero(t, n, "the first body byte ends the prefill (Result.FirstToken)")
	assert.Equal(t, int64(1), primary.InFlight(), "while the request still decodes")
	assert.Nil(t, rb.GetResponse().GetBodyMutation(), "STREAMED responses are not echoed")
	h.clock.Advance(time.Second)
	e.send(responseBody("data: [DONE]\n\n", true))
	require.NotNil(t, e.recv().GetResponseBody())

	outs, eps := h.rec.waitCompleted(t, 1)
	assert.Same(t, primary, eps[0])
	assert.NoError(t, outs[0].Err)
	assert.Equal(t, 150*time.Millisecond, outs[0].TTFT)
	assert.Equal(t, 1150*time.Millisecond, outs[0].Latency)
	assert.Equal(t, int64(0), primary.InFlight())
	require.NoError(t, e.stream.CloseSend())
}

func TestFullDuplexStreamedMode(t *testing.T) {
	h := newHarness(t, setup{opts: extproc.Options{ChunkBytes: 40}})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false))
	// The headers are held until the body is complete: send it in pieces.
	e.send(requestBody(chatBody[:30], false))
	e.send(requestBody(chatBody[30:70], false))
	e.send(requestBody(chatBody[70:], true))

	r := e.recv()
	hr := r.GetRequestHeaders()
	require.NotNil(t, hr, "the headers response comes first")
	dest := destination(t, r, hr.GetResponse().GetHeaderMutation())
	primary := h.byAddress(strings.Split(dest, ",")[0])
	require.NotNil(t, primary)

	// The body comes back in chunks of at most 40 bytes, the last marked.
	var got strings.Builder
	chunks := 0
	for {
		br := e.recv().GetRequestBody()
		require.NotNil(t, br)
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		require.NotNil(t, sr)
		assert.LessOrEqual(t, len(sr.GetBody()), 40)
		got.Write(sr.GetBody())
		chunks++
		if sr.GetEndOfStream() {
			break
		}
	}
	assert.Equal(t, chatBody, got.String())
	assert.Equal(t, (len(chatBody)+39)/40, chunks)

	// The response is echoed chunk by chunk.
	e.send(responseHeaders("200", false, primary.Address))
	require.NotNil(t, e.recv().GetResponseHeaders())
	h.clock.Advance(80 * time.Millisecond)
	e.send(responseBody("data: first\n\n", false))
	sr := e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	assert.Equal(t, "data: first\n\n", string(sr.GetBody()))
	assert.False(t, sr.GetEndOfStream())
	h.clock.Advance(20 * time.Millisecond)
	e.send(responseBody("", true))
	sr = e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	assert.True(t, sr.GetEndOfStream())

	outs, _ := h.rec.waitCompleted(t, 1)
	assert.NoError(t, outs[0].Err)
	assert.Equal(t, 80*time.Millisecond, outs[0].TTFT)
	assert.Equal(t, 100*time.Millisecond, outs[0].Latency)
}

func TestFullDuplexTrailersEndTheBody(t *testing.T) {
	h := newHarness(t, setup{})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), false))
	e.send(requestBody(chatBody, false))
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{}}})
	r := e.recv()
	require.NotNil(t, r.GetRequestHeaders())
	destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
	require.NotNil(t, e.recv().GetRequestBody())
	require.NotNil(t, e.recv().GetRequestTrailers())
}

func TestSubsetHint(t *testing.T) {
	tests := []struct {
		name       string
		subset     []string
		wantDest   string
		wantStatus int
	}{
		{name: "one endpoint", subset: []string{"10.0.0.3:8000"}, wantDest: "10.0.0.3:8000"},
		{name: "two endpoints, fallbacks stay inside", subset: []string{"10.0.0.2:8000", "10.0.0.3:8000", "10.9.9.9:1"}},
		{name: "none in the pool", subset: []string{"10.9.9.9:1"}, wantStatus: 503},
		{name: "empty list", subset: []string{}, wantStatus: 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			e := h.open(t)
			e.send(withSubset(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false), tc.subset...))
			require.NotNil(t, e.recv().GetRequestHeaders())
			e.send(requestBody(chatBody, true))
			r := e.recv()
			if tc.wantStatus != 0 {
				ir := r.GetImmediateResponse()
				require.NotNil(t, ir)
				assert.Equal(t, tc.wantStatus, int(ir.GetStatus().GetCode()))
				for _, ep := range h.eps {
					assert.Equal(t, int64(0), ep.InFlight())
				}
				return
			}
			dest := destination(t, r, r.GetRequestBody().GetResponse().GetHeaderMutation())
			if tc.wantDest != "" {
				assert.Equal(t, tc.wantDest, dest)
			}
			for _, a := range strings.Split(dest, ",") {
				assert.Contains(t, tc.subset, a)
			}
		})
	}
}

// TestClientRoutingHeadersAreDropped checks that client-sent routing
// headers neither steer the pick nor reach the model server: the
// destination header is overwritten (destination checks the action) and
// the subset header removed.
func TestClientRoutingHeadersAreDropped(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness(t, setup{})
			// Load 10.0.0.1 so the queue scorer avoids it, then have the
			// client ask for it through the headers: the pick must not follow.
			h.eps[0].Dispatch(0)
			h.eps[0].Dispatch(0)
			e := h.open(t)
			e.send(requestHeaders(protocol(mode, filterv3.ProcessingMode_STREAMED), false,
				extproc.KeySubset, "10.0.0.1:8000", extproc.HeaderDestination, "10.0.0.1:8000"))
			var mut *extprocv3.HeaderMutation
			var r *extprocv3.ProcessingResponse
			if mode == filterv3.ProcessingMode_BUFFERED {
				e.recv()
				e.send(requestBody(chatBody, true))
				r = e.recv()
				mut = r.GetRequestBody().GetResponse().GetHeaderMutation()
			} else {
				e.send(requestBody(chatBody, true))
				r = e.recv()
				mut = r.GetRequestHeaders().GetResponse().GetHeaderMutation()
			}
			dest := destination(t, r, mut)
			assert.NotEqual(t, "10.0.0.1:8000", strings.Split(dest, ",")[0])
			assert.Equal(t, []string{extproc.KeySubset}, mut.GetRemoveHeaders())
		})
	}
}

func TestImmediateResponses(t *testing.T) {
	tests := []struct {
		name       string
		setup      setup
		body       string
		wantStatus int
		wantCode   string
		wantRetry  string
	}{
		{name: "shed", setup: setup{admitter: rejectAll{}}, body: chatBody, wantStatus: 429,
			wantCode: "rate_limit_exceeded", wantRetry: "1"},
		{name: "no endpoints", setup: setup{noEPs: true}, body: chatBody, wantStatus: 503, wantCode: "no_endpoint_available"},
		{name: "unknown model", body: `{"model":"nope","prompt":"x"}`, wantStatus: 404, wantCode: "model_not_found"},
		{name: "malformed", body: `{"model":"llama-3-8b",`, wantStatus: 400, wantCode: "invalid_request"},
		{name: "too large", setup: setup{opts: extproc.Options{MaxBodyBytes: 16}}, body: chatBody, wantStatus: 413,
			wantCode: "request_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.setup)
			e := h.open(t)
			e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false))
			e.recv()
			e.send(requestBody(tc.body, true))
			ir := e.recv().GetImmediateResponse()
			require.NotNil(t, ir)
			assert.Equal(t, tc.wantStatus, int(ir.GetStatus().GetCode()))
			var body struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(ir.GetBody(), &body), string(ir.GetBody()))
			assert.Equal(t, tc.wantCode, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			hdrs := map[string]string{}
			for _, o := range ir.GetHeaders().GetSetHeaders() {
				hdrs[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
			}
			assert.Equal(t, "application/json", hdrs["content-type"])
			assert.Equal(t, tc.wantRetry, hdrs["retry-after"])
		})
	}
}

func TestOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		play    func(e *envoy, h *harness, primary, fallback string)
		wantErr error
	}{
		{name: "5xx", wantErr: extproc.ErrUpstreamStatus, play: func(e *envoy, _ *harness, _, _ string) {
			e.send(responseHeaders("503", false, ""))
			e.recv()
			e.send(responseBody("overloaded", true))
			e.recv()
		}},
		{name: "4xx", wantErr: extproc.ErrUpstreamStatus, play: func(e *envoy, _ *harness, _, _ string) {
			e.send(responseHeaders("400", false, ""))
			e.recv()
			e.send(responseBody(`{"error":{"message":"maximum context length is 8192 tokens"}}`, true))
			e.recv()
		}},
		{name: "served by a fallback", wantErr: extproc.ErrServedByFallback, play: func(e *envoy, _ *harness, _, fb string) {
			e.send(responseHeaders("200", false, fb))
			e.recv()
			e.send(responseBody("ok", true))
			e.recv()
		}},
		{name: "stream ends before the response", wantErr: extproc.ErrStreamEnded, play: func(e *envoy, _ *harness, _, _ string) {
			e.send(responseHeaders("200", false, ""))
			e.recv()
			require.NoError(e.t, e.stream.CloseSend())
			_, err := e.stream.Recv()
			assert.Error(e.t, err)
		}},
		{name: "headers-only response", play: func(e *envoy, _ *harness, p, _ string) {
			e.send(responseHeaders("204", true, p))
			e.recv()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			e := h.open(t)
			e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false))
			e.recv()
			e.send(requestBody(chatBody, true))
			r := e.recv()
			addrs := strings.Split(destination(t, r, r.GetRequestBody().GetResponse().GetHeaderMutation()), ",")
			tc.play(e, h, addrs[0], addrs[1])
			outs, eps := h.rec.waitCompleted(t, 1)
			assert.Equal(t, addrs[0], eps[0].Address, "Done is the primary's")
			if tc.wantErr == nil {
				assert.NoError(t, outs[0].Err)
			} else {
				assert.ErrorIs(t, outs[0].Err, tc.wantErr)
			}
			if errors.Is(tc.wantErr, extproc.ErrUpstreamStatus) {
				assert.Zero(t, outs[0].TTFT, "an error body's first byte is no token's")
			}
			assert.False(t, outs[0].ConnectError)
			for _, ep := range h.eps {
				assert.Equal(t, int64(0), ep.InFlight(), ep.Address)
			}
			h.rec.mu.Lock()
			assert.Len(t, h.rec.outs, 1, "Done exactly once")
			h.rec.mu.Unlock()
		})
	}
}

func TestGetWithoutBody(t *testing.T) {
	h := newHarness(t, setup{})
	e := h.open(t)
	e.send(&extprocv3.ProcessingRequest{
		ProtocolConfig: protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED),
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":method", "GET", ":path", "/v1/models?x=1"), EndOfStream: true}},
	})
	r := e.recv()
	require.NotNil(t, r.GetRequestHeaders(), "decided in the headers response")
	destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
}

func TestModelAliasRewritesBody(t *testing.T) {
	h := newHarness(t, setup{})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false))
	e.recv()
	e.send(requestBody(`{"model":"gpt-4o","prompt":"hi"}`, true))
	r := e.recv()
	common := r.GetRequestBody().GetResponse()
	want := `{"model":"llama-3-8b","prompt":"hi"}`
	assert.Equal(t, want, string(common.GetBodyMutation().GetBody()))
	var cl string
	for _, o := range common.GetHeaderMutation().GetSetHeaders() {
		if o.GetHeader().GetKey() == "content-length" {
			cl = string(o.GetHeader().GetRawValue())
		}
	}
	assert.Equal(t, "36", cl, "len(%s)", want)
}

// TestUnsupportedRequestModesAreRefused covers the request body modes in
// which the destination cannot be set from the body: STREAMED, and
// BUFFERED_PARTIAL (body responses' header mutations are ignored, and the
// body may be cut at Envoy's buffer limit).
func TestUnsupportedRequestModesAreRefused(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{
		filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_GRPC,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			_, err := extproc.NewServer(extproc.Options{Table: &router.Table{}, RequestBodyMode: mode})
			require.Error(t, err)
			assert.Contains(t, err.Error(), mode.String())

			h := newHarness(t, setup{})
			e := h.open(t)
			e.send(requestHeaders(protocol(mode, filterv3.ProcessingMode_STREAMED), false))
			_, err = e.stream.Recv()
			assert.Equal(t, codes.FailedPrecondition, status.Code(err))
			for _, ep := range h.eps {
				assert.Zero(t, ep.Counters().Dispatched, "nothing was picked")
			}
		})
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t, setup{})
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range extproc.HealthServices {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err, svc)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus(), svc)
	}
}

func TestConcurrentStreams(t *testing.T) {
	const n = 24
	h := newHarness(t, setup{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := h.client.Process(context.Background())
			if !assert.NoError(t, err) {
				return
			}
			steps := []*extprocv3.ProcessingRequest{
				requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false),
				requestBody(chatBody, true),
				responseHeaders("200", false, ""),
				responseBody("data: [DONE]\n\n", true),
			}
			for _, m := range steps {
				if !assert.NoError(t, st.Send(m)) {
					return
				}
				if _, err := st.Recv(); !assert.NoError(t, err) {
					return
				}
			}
			assert.NoError(t, st.CloseSend())
		}()
	}
	wg.Wait()
	outs, _ := h.rec.waitCompleted(t, n)
	assert.Len(t, outs, n)
	var dispatched uint64
	for _, ep := range h.eps {
		assert.Equal(t, int64(0), ep.InFlight())
		dispatched += ep.Counters().Dispatched
	}
	assert.Equal(t, uint64(n), dispatched)
}

// TestCustomParseHeaders reads the session and priority from header names
// configured in lowercase, as Envoy sends them; the server canonicalizes
// the names once, at NewServer.
func TestCustomParseHeaders(t *testing.T) {
	h := newHarness(t, setup{opts: extproc.Options{Parse: router.ParseOptions{
		SessionHeader: "x-conversation", PriorityHeader: "x-tier"}}})
	e := h.open(t)
	e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false,
		"x-conversation", "conv-42", "x-tier", "2"))
	require.NotNil(t, e.recv().GetRequestHeaders())
	e.send(requestBody(chatBody, true))
	require.NotNil(t, e.recv().GetRequestBody())
	e.send(responseHeaders("200", false, ""))
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody("data: [DONE]\n\n", true))
	require.NotNil(t, e.recv().GetResponseBody())
	h.rec.waitCompleted(t, 1)
	h.rec.mu.Lock()
	req := h.rec.reqs[0]
	h.rec.mu.Unlock()
	assert.Equal(t, "conv-42", req.SessionKey)
	assert.Equal(t, 2, req.Priority)
	require.NoError(t, e.stream.CloseSend())
}
