package extproc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Names of the Gateway API Inference Extension endpoint-picker protocol
// (gateway-api-inference-extension, docs/proposals/004-endpoint-picker-protocol).
const (
	// HeaderDestination is the request header naming the picked endpoints,
	// primary first: "ip:port,ip:port,...".
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic-metadata namespace carrying the
	// picked endpoints under HeaderDestination, and the one where the data
	// plane reports KeyServed.
	MetadataNamespace = "envoy.lb"
	// SubsetNamespace is the filter-metadata namespace of the subset hint.
	SubsetNamespace = "envoy.lb.subset_hint"
	// KeySubset is the subset hint's key: the list of "ip:port" the picker
	// must choose from.
	KeySubset = "x-gateway-destination-endpoint-subset"
	// KeyServed is the key under which the data plane reports the endpoint
	// that actually served the request, in the response's metadata.
	KeyServed = "x-gateway-destination-endpoint-served"
)

// HealthServices are the service names that Health answers SERVING, as in
// the protocol: liveness, readiness and the ext_proc service itself (plus
// "", the whole server).
var HealthServices = []string{"", "liveness", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// Errors reported to the picker's Done.
var (
	// ErrStreamEnded: the ext_proc stream ended before the response did
	// (the client went away, or Envoy gave up on the upstream).
	ErrStreamEnded = errors.New("extproc: stream ended before the response completed")
	// ErrServedByFallback: the data plane reports that another endpoint
	// than the primary served the request, so the primary failed.
	ErrServedByFallback = errors.New("extproc: request served by a fallback endpoint")
	// ErrUpstreamStatus: the endpoint answered with an error status, 4xx or
	// 5xx, and did not serve the request. It is reported without a TTFT: the
	// first byte of an error body (a 400 for a prompt over the context
	// length, a 429 from an overloaded server) is no token's, and learning
	// from it would make the endpoint look as if it prefilled at once.
	ErrUpstreamStatus = errors.New("extproc: upstream error status")
	// ErrOutsideSubset: the picker chose an endpoint outside the subset
	// hint (its configuration lacks the subset filter, or fails open).
	ErrOutsideSubset = errors.New("extproc: picked endpoint is outside the subset hint")
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes = 4 << 20
	// DefaultChunkBytes is the size of the body chunks streamed back in
	// FULL_DUPLEX_STREAMED mode: Envoy recommends at most 64 KiB.
	DefaultChunkBytes = 64 << 10
	// DefaultRetryAfter is the Retry-After of a 429.
	DefaultRetryAfter = time.Second
)

// Options configures a Server. Table is required; the zero value of every
// other field means its default.
type Options struct {
	// Table maps the request's model to a pool and its picker.
	Table *router.Table
	// Hasher hashes prompts for the prefix index; nil means
	// prefix.NewHasher with default block sizes.
	Hasher *prefix.Hasher
	// Parse tunes the body and header parsing.
	Parse router.ParseOptions
	// RequestBodyMode and ResponseBodyMode are the body modes the Envoy
	// filter is configured with, used when Envoy does not announce them in
	// ProcessingRequest.protocol_config (an announced mode, NONE
	// included, overrides them). Defaults: FULL_DUPLEX_STREAMED for both,
	// as the inference extension deploys the filter.
	RequestBodyMode, ResponseBodyMode filterv3.ProcessingMode_BodySendMode
	// MaxBodyBytes caps the request body buffered for routing; a larger
	// one is answered 413. Default DefaultMaxBodyBytes. In BUFFERED mode
	// the gRPC server must accept messages this large: see
	// GRPCServerOptions.
	MaxBodyBytes int
	// ChunkBytes is the size of body chunks sent back in
	// FULL_DUPLEX_STREAMED mode. Default DefaultChunkBytes.
	ChunkBytes int
	// RetryAfter is sent with 429 answers. Default DefaultRetryAfter.
	RetryAfter time.Duration
	// Clock times the response for TTFT and latency. Default the system
	// clock.
	Clock signals.Clock
	// Logger logs failed streams. Default: discard.
	Logger *slog.Logger
}

// Server is an Envoy external processor (ext_proc v3) acting as the
// endpoint picker of the Gateway API Inference Extension: per HTTP request
// it parses the body, routes the model to a pool, picks an endpoint, and
// tells Envoy where to send the request; it then watches the response to
// report TTFT and the outcome through the pick's Done. It is safe for
// concurrent use: each ext_proc stream (one HTTP request) is handled by
// its own goroutine with its own state.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	opts   Options
	health *health.Server
	// prompts holds prefix.Prompts of opts.Hasher, so that a body's prompt
	// is rendered while it is parsed (router.ParseRequestPrompt).
	prompts sync.Pool
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// NewServer returns a Server. It fails without a routing table or with a
// request body mode it cannot route with (see Process).
func NewServer(opts Options) (*Server, error) {
	if opts.Table == nil {
		return nil, errors.New("extproc: Options.Table is required")
	}
	if opts.Hasher == nil {
		opts.Hasher = prefix.NewHasher(prefix.HashConfig{})
	}
	if opts.RequestBodyMode == filterv3.ProcessingMode_NONE {
		opts.RequestBodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if opts.ResponseBodyMode == filterv3.ProcessingMode_NONE {
		opts.ResponseBodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if err := checkRequestMode(opts.RequestBodyMode); err != nil {
		return nil, err
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = DefaultChunkBytes
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.Clock == nil {
		opts.Clock = signals.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Parse = opts.Parse.Canonical()
	s := &Server{opts: opts, health: health.NewServer()}
	for _, name := range HealthServices {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s, nil
}

// checkRequestMode rejects request body modes that cannot carry a routing
// decision taken from the body: in STREAMED mode Envoy waits for the
// headers response before it sends the body, and header mutations in body
// responses apply only in BUFFERED mode (ext_proc CommonResponse
// header_mutation), which also rules out BUFFERED_PARTIAL, whose body
// message may moreover hold only the part of the body that fit Envoy's
// buffer (ProcessingMode BUFFERED_PARTIAL). NONE, announced by Envoy,
// means no body is sent at all.
func checkRequestMode(m filterv3.ProcessingMode_BodySendMode) error {
	switch m {
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil
	}
	return fmt.Errorf("extproc: request body mode %v cannot route on the body; use BUFFERED or FULL_DUPLEX_STREAMED", m)
}

// messageOverhead is what a ProcessingRequest may carry besides its body
// (framing, metadata context, attributes), allowed on top of MaxBodyBytes
// by GRPCServerOptions.
const messageOverhead = 1 << 20

// GRPCServerOptions returns the options the grpc.Server that serves s
// needs. Its receive limit is MaxBodyBytes plus 1 MiB for the rest of the
// message, instead of gRPC's default 4 MiB: in BUFFERED mode Envoy sends
// the whole body in one message, so with the default a body of
// MaxBodyBytes (4 MiB by default) or more would fail the stream before
// the Server sees it, instead of being routed or answered 413. Envoy's
// buffer limit (per_connection_buffer_limit_bytes) bounds what it sends;
// a message over the receive limit still fails the stream.
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(s.opts.MaxBodyBytes + messageOverhead)}
}

// Register registers the ext_proc service and the gRPC health service
// (with the names in HealthServices) on gs.
func (s *Server) Register(gs *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
}

// Health returns the health server, to mark the services NOT_SERVING on
// shutdown (Health().Shutdown()) or while endpoints are not discovered yet.
func (s *Server) Health() *health.Server { return s.health }

// Process handles one ext_proc stream: one HTTP request and its response.
// It returns when Envoy closes the stream; the pick's Done has been called
// by then, exactly once.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv, reqMode: s.opts.RequestBodyMode, respMode: s.opts.ResponseBodyMode}
	defer st.finish(ErrStreamEnded)
	for {
		msg, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
				return nil
			}
			return err
		}
		if err := st.handle(msg); err != nil {
			s.opts.Logger.Warn("extproc: stream failed", "err", err)
			return err
		}
	}
}

// stream is the state of one ext_proc stream.
type stream struct {
	s        *Server
	srv      extprocv3.ExternalProcessor_ProcessServer
	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode

	header     http.Header // from the request headers; made empty by decide without them
	path       string
	gotHeaders bool // the request headers message came
	body       []byte
	tooLarge   bool
	subset     []string
	hasSubset  bool
	decided    bool // the request was answered (routed or rejected)

	// After a successful pick.
	res       picker.Result
	primary   string
	start     time.Time
	ttft      time.Duration
	status    int
	servedBy  string
	completed bool
}

func (st *stream) handle(msg *extprocv3.ProcessingRequest) error {
	if pc := msg.GetProtocolConfig(); pc != nil {
		// Envoy fills protocol_config from its filter configuration: a
		// request_body_mode NONE there means no body will come, which
		// checkRequestMode refuses like any mode that cannot route.
		st.reqMode = pc.GetRequestBodyMode()
		st.respMode = pc.GetResponseBodyMode()
		if err := checkRequestMode(st.reqMode); err != nil {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	st.readMetadata(msg.GetMetadataContext())
	switch r := msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.complete()
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return status.Errorf(codes.InvalidArgument, "extproc: unexpected message %T", msg.GetRequest())
}

// readMetadata takes the subset hint from the request's filter metadata
// and the served endpoint from the response's.
func (st *stream) readMetadata(md *corev3.Metadata) {
	fm := md.GetFilterMetadata()
	if hint, ok := fm[SubsetNamespace]; ok && !st.decided {
		if v, ok := hint.GetFields()[KeySubset]; ok {
			st.hasSubset = true
			st.subset = st.subset[:0]
			for _, item := range v.GetListValue().GetValues() {
				if a := strings.TrimSpace(item.GetStringValue()); a != "" {
					st.subset = append(st.subset, a)
				}
			}
			// A single string is accepted too, comma-separated.
			if s := v.GetStringValue(); s != "" {
				for a := range strings.SplitSeq(s, ",") {
					if a = strings.TrimSpace(a); a != "" {
						st.subset = append(st.subset, a)
					}
				}
			}
		}
	}
	if lb, ok := fm[MetadataNamespace]; ok {
		if v := lb.GetFields()[KeyServed].GetStringValue(); v != "" {
			st.servedBy = v
		}
	}
}

func (st *stream) requestHeaders(h *extprocv3.HttpHeaders) error {
	if st.gotHeaders || st.decided {
		// A protocol violation: deciding again would pick again, and lose
		// the first pick's Done.
		return status.Error(codes.FailedPrecondition, "extproc: request headers repeated or after the request was answered")
	}
	st.gotHeaders = true
	st.header = make(http.Header, len(h.GetHeaders().GetHeaders()))
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		if strings.HasPrefix(hv.GetKey(), ":") {
			if hv.GetKey() == ":path" {
				st.path, _, _ = strings.Cut(v, "?")
			}
			continue
		}
		st.header.Add(hv.GetKey(), v)
	}
	// Routing headers are ours to set: never trust a client's. These are
	// dropped from the routing decision here, and from the request sent
	// upstream by destinationMutation.
	st.header.Del(HeaderDestination)
	st.header.Del(KeySubset)
	if h.GetEndOfStream() {
		// No body (a GET): decide now, in the headers response.
		return st.decide(false, true)
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // hold the headers response until the body is in
	default: // BUFFERED: the body comes after this answer
		return st.send(&extprocv3.ProcessingResponse{Response: headersResponse(nil)})
	}
}

func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if st.decided {
		return status.Error(codes.FailedPrecondition, "extproc: request body after the request was answered")
	}
	if err := st.checkHeadersCame("body"); err != nil {
		return err
	}
	if len(st.body)+len(b.GetBody()) > st.s.opts.MaxBodyBytes {
		st.tooLarge = true
	} else {
		st.body = append(st.body, b.GetBody()...)
	}
	end := b.GetEndOfStream() || st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if !end {
		return nil
	}
	return st.decide(true, b.GetEndOfStream())
}

// checkHeadersCame refuses a request body or trailers that came without
// request headers (request_header_mode SKIP) in FULL_DUPLEX_STREAMED
// mode: the destination goes in the headers response in this mode (body
// responses' header mutations apply in BUFFERED mode only), and Envoy
// would take a headers response it did not ask for as a protocol error.
func (st *stream) checkHeadersCame(what string) error {
	if !st.gotHeaders && st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return status.Errorf(codes.FailedPrecondition,
			"extproc: request %s without request headers in FULL_DUPLEX_STREAMED mode; set request_header_mode SEND", what)
	}
	return nil
}

func (st *stream) requestTrailers() error {
	if !st.decided {
		if err := st.checkHeadersCame("trailers"); err != nil {
			return err
		}
		// In FULL_DUPLEX_STREAMED mode trailers mark the end of the body;
		// the body stream itself was not ended by Envoy.
		if err := st.decide(true, false); err != nil {
			return err
		}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// decide routes and picks, and answers: with the destination in a headers
// response (no body, or FULL_DUPLEX_STREAMED, followed by the body
// streamed back) or in a body response (BUFFERED), or with an immediate
// response. bodyEnded says whether Envoy's last body chunk had
// end_of_stream set (not so when trailers end the request), which the
// body streamed back repeats.
func (st *stream) decide(haveBody, bodyEnded bool) error {
	st.decided = true
	if st.header == nil {
		// No request headers message (request_header_mode SKIP).
		st.header = make(http.Header)
	}
	if st.tooLarge {
		return st.reject(&router.APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "request_too_large", Message: fmt.Sprintf("request body over %d bytes", st.s.opts.MaxBodyBytes)})
	}
	body := st.body
	dest, newBody, apiErr := st.pick(body)
	if apiErr != nil {
		return st.reject(apiErr)
	}
	mut := destinationMutation(dest)
	rewritten := newBody != nil
	if rewritten {
		body = newBody
		mut.SetHeaders = append(mut.SetHeaders, headerOption("content-length", fmt.Sprint(len(body))))
	}
	md := destinationMetadata(dest)
	switch {
	case !haveBody:
		return st.send(&extprocv3.ProcessingResponse{Response: headersResponse(mut), DynamicMetadata: md})
	case st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if err := st.send(&extprocv3.ProcessingResponse{Response: headersResponse(mut), DynamicMetadata: md}); err != nil {
			return err
		}
		return st.streamBody(body, bodyEnded)
	default: // BUFFERED: header mutations in a body response apply in this mode
		common := &extprocv3.CommonResponse{HeaderMutation: mut}
		if rewritten {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		}
		return st.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
			DynamicMetadata: md,
		})
	}
}

// pick parses, routes and picks. It returns the destination list (primary
// first), the rewritten body if the route renames the model, or the error
// to answer with.
func (st *stream) pick(body []byte) (dest string, newBody []byte, apiErr *router.APIError) {
	s := st.s
	pr, _ := s.prompts.Get().(*prefix.Prompt)
	if pr == nil {
		pr = s.opts.Hasher.NewPrompt()
	}
	defer func() { // after Prepare, the last reader of pr
		pr.Reset()
		s.prompts.Put(pr)
	}()
	parsed, err := router.ParseRequestPrompt(st.path, st.header, body, s.opts.Parse, pr)
	if err != nil {
		return "", nil, &router.APIError{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Code: "invalid_request", Message: err.Error()}
	}
	route, err := s.opts.Table.Route(&parsed)
	if err != nil {
		return "", nil, &router.APIError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Param: "model", Code: "model_not_found", Message: err.Error()}
	}
	req := new(signals.Request) // owned by the pick until Done
	if err := router.Prepare(req, &parsed, route, body, st.header, s.opts.Hasher, nil); err != nil {
		return "", nil, &router.APIError{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Code: "invalid_request", Message: err.Error()}
	}
	p := route.Pool.Picker
	if st.hasSubset {
		if !anyInSubset(p.Endpoints(), st.subset) {
			return "", nil, noEndpoint("no endpoint of the subset hint is in the pool")
		}
		// The picker's subset filter reads the hint from this header.
		st.header.Set(KeySubset, strings.Join(st.subset, ","))
	}
	res, err := p.Pick(st.srv.Context(), req)
	switch {
	case errors.Is(err, picker.ErrSaturated):
		return "", nil, &router.APIError{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
			Message: "the model's endpoints are saturated; retry later (" + err.Error() + ")", RetryAfter: s.opts.RetryAfter}
	case errors.Is(err, picker.ErrNoEndpoints):
		return "", nil, noEndpoint(err.Error())
	case err != nil:
		return "", nil, &router.APIError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	}
	if st.hasSubset && !inList(st.subset, res.Endpoint.Address) {
		res.Done(picker.DoneInfo{Err: ErrOutsideSubset})
		return "", nil, noEndpoint("no endpoint of the subset hint is eligible")
	}
	// Fallbacks are valid only until Done: render them now.
	var b strings.Builder
	b.WriteString(res.Endpoint.Address)
	for _, fb := range res.Fallbacks {
		if !st.hasSubset || inList(st.subset, fb.Address) {
			b.WriteByte(',')
			b.WriteString(fb.Address)
		}
	}
	st.res, st.primary, st.start = res, res.Endpoint.Address, s.opts.Clock.Now()
	if route.Rewrites() && parsed.HasModel() {
		newBody = parsed.RewriteModel(body, route.Upstream)
	}
	return b.String(), newBody, nil
}

func noEndpoint(msg string) *router.APIError {
	return &router.APIError{Status: http.StatusServiceUnavailable, Type: "server_error",
		Code: "no_endpoint_available", Message: msg}
}

func anyInSubset(eps []*signals.Endpoint, subset []string) bool {
	for _, ep := range eps {
		if inList(subset, ep.Address) {
			return true
		}
	}
	return false
}

func inList(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// streamBody sends the request body back in FULL_DUPLEX_STREAMED mode:
// the data plane forwards only what the processor returns. The last chunk
// has end_of_stream set only if end, that is if Envoy's last body chunk
// had it (ext_proc StreamedBodyResponse.end_of_stream): when trailers end
// the request, the body stream stays open for them. An empty body is sent
// as one empty chunk if it ends the stream, else not at all.
func (st *stream) streamBody(body []byte, end bool) error {
	n := st.s.opts.ChunkBytes
	for first := true; len(body) > 0 || (first && end); first = false {
		chunk := body[:min(n, len(body))]
		body = body[len(chunk):]
		if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: end && len(body) == 0},
				}},
			}},
		}}); err != nil {
			return err
		}
	}
	return nil
}

// reject answers the request with an OpenAI-shaped error.
func (st *stream) reject(e *router.APIError) error {
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{headerOption("content-type", "application/json")}}
	if e.RetryAfter > 0 {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		mut.SetHeaders = append(mut.SetHeaders, headerOption("retry-after", fmt.Sprint(secs)))
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: mut,
			Body:    e.AppendJSON(nil),
			Details: e.Code,
		},
	}})
}

func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) error {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			v := hv.GetValue()
			if len(hv.GetRawValue()) > 0 {
				v = string(hv.GetRawValue())
			}
			st.status, _ = strconv.Atoi(v)
		}
	}
	if h.GetEndOfStream() || st.respMode == filterv3.ProcessingMode_NONE {
		// No body will be seen: the headers are the first and last byte.
		st.markFirstByte()
		st.complete()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{}}})
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if len(b.GetBody()) > 0 {
		st.markFirstByte()
	}
	if b.GetEndOfStream() {
		st.complete()
	}
	resp := &extprocv3.BodyResponse{}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		resp.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: b.GetBody(), EndOfStream: b.GetEndOfStream(),
			}},
		}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}})
}

func (st *stream) markFirstByte() {
	if st.res.Endpoint != nil && st.ttft == 0 {
		st.ttft = max(st.s.opts.Clock.Now().Sub(st.start), time.Nanosecond)
		st.res.FirstToken() // the prompt is prefilled: out of the pod's prefill queue
	}
}

// complete reports the finished response through Done.
func (st *stream) complete() {
	if st.res.Endpoint == nil || st.completed {
		return
	}
	st.completed = true
	out := picker.DoneInfo{TTFT: st.ttft, Latency: st.s.opts.Clock.Now().Sub(st.start)}
	switch {
	case st.servedBy != "" && st.servedBy != st.primary:
		out = picker.DoneInfo{Err: fmt.Errorf("%w: %s", ErrServedByFallback, st.servedBy)}
	case st.status >= 400:
		out.Err = fmt.Errorf("%w %d", ErrUpstreamStatus, st.status)
		out.TTFT = 0
	}
	st.res.Done(out)
}

// finish calls Done with err if the response never completed.
func (st *stream) finish(err error) {
	if st.res.Endpoint == nil || st.completed {
		return
	}
	st.completed = true
	st.res.Done(picker.DoneInfo{Err: err, TTFT: st.ttft})
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error { return st.srv.Send(r) }

func headersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse_RequestHeaders {
	return &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: mut}}}
}

// destinationMutation sets the destination header, overwriting a
// client's, and removes a client-sent subset header, so that the request
// reaches the model server with the picker's routing headers only.
func destinationMutation(dest string) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{
		SetHeaders:    []*corev3.HeaderValueOption{headerOption(HeaderDestination, dest)},
		RemoveHeaders: []string{KeySubset},
	}
}

func headerOption(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationMetadata is {"envoy.lb": {"x-gateway-destination-endpoint": dest}}:
// the same value as the header, as the protocol requires.
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}
