// Package extproc makes inferroute the endpoint picker of Envoy-based
// gateways (Envoy Gateway, Istio, kgateway): an Envoy external processor
// (ext_proc v3) that speaks the Gateway API Inference Extension's
// endpoint-picker protocol
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol).
//
// Per HTTP request, Envoy streams the request headers and body to the
// Server. It parses the body and renders its prompt in one pass with
// router.ParseRequestPrompt, routes the model to a pool with a
// router.Table, prepares the request (prompt hashing, token estimate) with
// router.Prepare, and lets the pool's picker choose. The
// answer names the endpoints, primary first and fallbacks after,
// comma-separated, in both the x-gateway-destination-endpoint request
// header and the envoy.lb dynamic metadata; an ORIGINAL_DST cluster keyed
// on that header (envoy.yaml) sends the request there. A subset hint in the
// request's filter metadata (envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset) restricts the choice; a request
// that cannot be served is answered at once, OpenAI-shaped: 429 when the
// picker sheds it, 503 when no endpoint is ready or eligible, 404 for an
// unknown model, 400 for a malformed body, 413 for one over the limit.
//
// The Server then watches the response: the first non-empty body chunk
// gives the time to first token, the end of the body the latency, a 5xx
// status an error, and the served-endpoint metadata a failed primary; all
// go to the pick's Done, which is called exactly once per pick, also when
// the stream breaks off.
//
// Body modes: BUFFERED (the destination goes in the body response's header
// mutation, which Envoy applies in this mode only; the request headers may
// be skipped, request_header_mode SKIP) and FULL_DUPLEX_STREAMED (the
// inference extension's mode: the request headers are required, their
// response is held until the body is in, then the body is streamed back in
// chunks of at most 64 KiB, its end marked only if Envoy's body ended, not
// when trailers end the request). Envoy announces its mode in
// protocol_config; Options says what to assume otherwise. STREAMED and
// BUFFERED_PARTIAL request bodies, an announced NONE (no body sent) and any
// other mode cannot carry a body-based decision and are refused with
// FailedPrecondition, as are repeated request headers.
//
// The gRPC health service answers SERVING for "", liveness, readiness and
// envoy.service.ext_proc.v3.ExternalProcessor.
package extproc
