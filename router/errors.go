package router

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/inferroute/inferroute/picker"
)

// Sentinel errors reported through Done and in logs.
var (
	// ErrUpstreamTimeout: the endpoint did not send response headers within
	// Config.UpstreamTimeout. The client gets 504.
	ErrUpstreamTimeout = errors.New("upstream timeout")
	// ErrUpstreamStatus: the endpoint answered with an error status, 4xx or
	// 5xx: it did not serve the request (see failedStatus). A 5xx or a 429
	// is retried on a fallback while no byte reached the client; the last
	// answer is relayed as it came.
	ErrUpstreamStatus = errors.New("upstream error status")
	// ErrUpstreamProtocol: the endpoint answered with a response head that
	// is not valid HTTP/1.1 (a malformed status line or header field,
	// conflicting Content-Length values, an unsupported transfer coding,
	// headers over the limit). Reported by the built-in client only (a
	// Config.Transport's errors count as connect errors). Like a 5xx, the
	// request is retried on a fallback while no byte reached the client,
	// and the client gets 502 when none is left; the endpoint stays in
	// rotation until signals.ProtocolErrorThreshold of them come in a row
	// (signals.Endpoint.ReportProtocolError).
	ErrUpstreamProtocol = errors.New("upstream protocol error")
	// ErrStreamErrorEvent: an SSE stream carried the model server's own
	// error event (a data line whose JSON object starts with "error"). The
	// event is relayed to the client as it came; the request is reported
	// failed, and without a TTFT when no other data event came before it.
	ErrStreamErrorEvent = errors.New("upstream stream error event")
	// ErrStreamBroken: the response broke off after its first byte, or an
	// SSE stream ended without its terminating "data: [DONE]".
	ErrStreamBroken = errors.New("upstream stream broken")
	// ErrStreamIdle: an SSE stream sent nothing for Config.StreamIdleTimeout
	// (a model server whose engine hung behind a live HTTP server); it is
	// reported wrapped in ErrStreamBroken, and the client gets the stream's
	// error event.
	ErrStreamIdle = errors.New("upstream stream idle")
	// ErrBodyTooLarge: the request body is over Config.MaxBodyBytes. The
	// client gets 413.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrLoop: the request has already passed through this Proxy (its Via
	// names it): an endpoint that leads back to the router, such as a
	// gateway listed as its own model server. The request is answered 508
	// instead of being forwarded again, which would go on until the
	// process ran out of file descriptors.
	ErrLoop = errors.New("request loop: it has already passed through this router")
)

// APIError is an error in OpenAI's shape, {"error":{"message","type",
// "param","code"}}, with the HTTP status it is sent with. The shape follows
// the Error schema of the OpenAI OpenAPI specification (all four fields
// required; param and code may be null), see
// shared/fixtures/openai/openai-openapi/error-response.schema.json.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Message is the human-readable message.
	Message string
	// Type is the error type, e.g. "invalid_request_error".
	Type string
	// Param names the offending request field; "" is sent as null.
	Param string
	// Code is a machine-readable code such as "model_not_found"; "" is sent
	// as null.
	Code string
	// RetryAfter, when positive, is sent as a Retry-After header in seconds
	// (rounded up).
	RetryAfter time.Duration
}

// Error implements error.
func (e *APIError) Error() string { return e.Message }

// AppendJSON appends the error's JSON body to dst.
func (e *APIError) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	dst = appendNullable(dst, e.Param)
	dst = append(dst, `,"code":`...)
	dst = appendNullable(dst, e.Code)
	return append(dst, "}}"...)
}

func appendNullable(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, s)
}

// WriteError writes e as a JSON response. It must be called before anything
// else was written to w.
func WriteError(w http.ResponseWriter, e *APIError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(e.AppendJSON(make([]byte, 0, 160+len(e.Message))), '\n'))
}

// withoutAddresses returns err's message for a client: a network error's
// local and remote addresses (those of a *net.OpError in err's chain) are
// left out, since they are the fleet's, and what happened is kept
// ("read: connection reset by peer").
func withoutAddresses(err error) string {
	msg := err.Error()
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		what := op.Err.Error() // "read: connection reset by peer", "i/o timeout"
		if !strings.HasPrefix(what, op.Op+":") {
			what = op.Op + ": " + what
		}
		msg = strings.Replace(msg, op.Error(), what, 1)
	}
	return msg
}

// errorFor maps the errors of the request path to OpenAI-shaped errors:
// malformed bodies and headers 400, unknown model 404, body over the limit
// 413, shedding (picker.ErrSaturated) 429 with Retry-After, no endpoint
// (picker.ErrNoEndpoints) 503, upstream timeout 504, a malformed or
// unreachable upstream 502. The messages of upstream failures say what
// happened, not where: no model server's address reaches the client.
func errorFor(err error, retryAfter time.Duration) *APIError {
	var ae *APIError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, ErrModelNotFound):
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
			Code: "model_not_found", Message: err.Error()}
	case errors.Is(err, ErrMalformed):
		return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param(err),
			Code: "invalid_request", Message: err.Error()}
	case errors.Is(err, ErrBodyTooLarge):
		return &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "request_too_large", Message: err.Error()}
	case errors.Is(err, picker.ErrSaturated):
		return &APIError{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
			Message: "the model's endpoints are saturated; retry later (" + err.Error() + ")", RetryAfter: retryAfter}
	case errors.Is(err, picker.ErrNoEndpoints):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_endpoint_available",
			Message: err.Error()}
	case errors.Is(err, ErrUpstreamTimeout):
		return &APIError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: "the model server did not answer in time"}
	case errors.Is(err, ErrLoop):
		return &APIError{Status: http.StatusLoopDetected, Type: "server_error", Code: "loop_detected",
			Message: err.Error() + "; an endpoint of the pool leads back to the gateway"}
	case errors.Is(err, ErrUpstreamProtocol):
		return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_protocol_error",
			Message: "the model server sent a malformed response: " + withoutAddresses(err)}
	}
	// The cause names a model server's address (a dial error, a status
	// from an address): the gateway logs it; the client is not told the
	// fleet's addresses.
	return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
		Message: "no model server could be reached"}
}

// failedStatus reports whether an upstream status means that the endpoint
// did not serve the request: 4xx and 5xx. Such an answer is reported
// through Done with ErrUpstreamStatus and no TTFT. Its first byte is an
// error body's, which the server sends before (or instead of) prefill: a
// 400 for a prompt over the context length, a 404 for an adapter it does
// not hold, a 429 when its queue is full (TGI past --max-concurrent-requests)
// come back in a millisecond. Reported as served, they would teach the
// latency predictor that the endpoint prefills any prompt at once, and the
// prefix index that it caches prompts it rejected.
func failedStatus(code int) bool { return code >= 400 }

// retryStatus reports whether an upstream status is retried on a fallback
// while no byte reached the client: a 5xx, or 429, with which an
// overloaded model server turns a request away unserved.
func retryStatus(code int) bool { return code >= 500 || code == http.StatusTooManyRequests }
