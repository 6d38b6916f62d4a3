// Package router puts inferroute's picker behind one OpenAI-compatible URL
// for many models: it reads the model (and prompt) from the request body,
// maps the model to a pool of endpoints through a routing Table, lets the
// pool's picker choose the endpoint, and forwards the request.
//
// # Reading requests
//
// ParseRequest reads /v1/chat/completions, /v1/completions, /v1/embeddings
// and /v1/responses bodies with a hand-written scanner that skips whatever
// routing does not need (one pass, no maps, cost linear in the body). It
// takes the model, stream flags, output limit and session keys from the
// body and the priority, session and SLO headers. Prepare then renders and
// hashes the prompt (signals/prefix) for the prefix index and estimates its
// tokens. ParseRequestPrompt renders the prompt during the parse instead
// (prefix.Prompt), so that Prepare only hashes it once the route names the
// model and adapter: the body is read once, which is what the Proxy and the
// Middleware do. All are usable on their own, for example in an Envoy
// ext_proc server.
//
// # Routing table
//
// A Table maps model names to Routes: served models, LoRA adapters (routed
// to their base model's pool with the adapter set) and aliases (the body's
// model is rewritten to the served name and, by the Proxy, the response's
// "model" back, in JSON and in every SSE chunk). Requests without a model,
// with a non-JSON body, and GET or HEAD requests whatever their body take
// the fallback route (by default the default pool), never an error; GET
// /v1/models is answered from the table, and so is GET /v1/models/{model}
// (OpenAI's retrieve-model call: the model's entry, or 404 model_not_found),
// which a model server could not answer for an alias.
//
// # Proxy
//
// Proxy is an http.Handler. It streams SSE responses with a flush per event
// and measures the time to the first response body byte (TTFT), which it
// reports with the response's token usage through the picker's Done,
// exactly once per pick, on every path; an answer with an error status
// (4xx or 5xx) is reported as a failure without a TTFT, since its first
// byte is no token's, and so is a stream whose first data event is the
// model server's own error event (ErrStreamErrorEvent; relayed as it
// came, and reported failed with its TTFT when tokens came first). On a connect error, a malformed response head
// (ErrUpstreamProtocol), a 5xx status or a 429 (a model server turning
// the request away, overloaded) before any byte reached the client it
// retries on the pick's fallbacks (bounded by
// Config.MaxRetries), and when every
// endpoint tried failed to connect it asks the picker once more (not when
// MaxRetries is negative). Each attempt is accounted by the pool's picker
// (picker.Picker.Assign for a fallback) and gets its own Done with its own
// outcome, so the signals learn of the retry as of a pick: the prefix
// index records the prompt where it was served, the latency model times
// the fallback's first token. A connect error marks the endpoint down at
// once; malformed responses and 5xx answers do only when they come in a
// row (signals.Endpoint.ReportProtocolError and ReportServerError), so
// that a pod whose engine died behind a live HTTP server, which answers
// 500 at once and so looks the least loaded, stops drawing traffic, while
// one bad answer does not
// cost a pod its place and its prefix-cache affinity. A stream
// that breaks off after it began, or that sends nothing for
// Config.StreamIdleTimeout when that is set, ends with an SSE error event; any other
// body that breaks off is answered 502 when none of it was sent and
// aborted (the client's connection reset) when some was, so that a client
// never takes a truncated answer for a whole one. A client
// that goes away cancels the upstream request (at once, except during an
// exchange's first 50–100 ms through the built-in client, where it is
// noticed when that period ends: see below). Hop-by-hop headers and
// client-supplied routing headers (HeaderDestination and
// Config.StripHeaders, whatever the case of their keys) are removed before
// picking and forwarding; a request that could not be forwarded verbatim
// (a header or method with control characters) is answered 400. The
// upstream request carries a Via naming the router (RFC 9110 section
// 7.6.3, a random pseudonym per Proxy), and a request that comes back
// with it, through an endpoint that leads to the gateway itself, is
// answered 508 loop_detected (ErrLoop) instead of being forwarded again.
//
// Upstream requests go through a built-in HTTP/1.1 client unless
// Config.Transport is set: the handler's goroutine writes the request in
// one write (one writev for a large body, which is never copied) and reads
// the response itself, over a keep-alive pool per endpoint, so a request
// costs no goroutine hand-offs (net/http.Transport's read and write loops)
// and about half the allocations. It registers with the request's context
// (context.AfterFunc) only once an exchange outlives an I/O deadline 50 to
// 100 ms ahead, so that the many short exchanges of a busy gateway do not
// pay for it. Model servers speak HTTP/1.1 on plain TCP behind a gateway;
// for endpoints that serve HTTPS set Config.UpstreamScheme to "https" (the
// Proxy then sends through NewTransport, or through Config.Transport when
// set, for a private CA or client certificates), and for HTTP/2 set
// Config.Transport to a transport that speaks it.
//
// Errors use OpenAI's shape {"error":{"message","type","param","code"}}:
// 400 malformed JSON or headers, 404 model_not_found, 413 body over
// Config.MaxBodyBytes (4 MiB by default; a gzip-coded body, which is
// decoded, routed by its content and forwarded plain, is held to it once
// decoded), 415 unsupported_content_encoding for a request coding other
// than gzip, 429 with Retry-After when the
// picker sheds the request (picker.ErrSaturated), 503 when no endpoint is
// ready (picker.ErrNoEndpoints, or every endpoint tried was marked down
// before the request arrived and failed to connect again), 504 when the
// upstream does not answer within Config.UpstreamTimeout, 502 when no
// endpoint can be reached although some was up. A malformed body's message
// gives the byte where reading stopped. The messages of upstream failures
// say what happened, never which address: a network error's addresses
// are left out, and the gateway's log has them.
//
// # Per-client access
//
// Config.Allow decides, per request and once its route is known, whether
// the client may use it. A refusal is answered before anything is
// picked; one wrapping ErrModelNotFound is the 404 of an unknown model,
// word for word, as OpenAI answers a key without access to a model. The
// listings show each client only what it may use. Config.Completed hands
// each answered request's route, status and token usage to the server,
// with the request (and so its context), for accounting per client. The
// example gateway builds its per-key model grants, rate limits and token
// counts on the two.
//
// # Observing requests
//
// Config.MeterProvider records the router's OpenTelemetry metrics
// (requests by pool, model and status, their duration, TTFT, retries).
// Config.AccessLog writes one log line per answered request (pool,
// endpoint, attempts, TTFT, tokens, error). Config.TracerProvider records
// a server span per request, in the client's trace (W3C traceparent),
// with the picker's span under it and its context sent to the model
// server. Config.RequestID gives a
// request without an x-request-id one (NewRequestID), sent to the model
// server and returned in the response, so that the access log, the
// client and the model server's logs name the same request.
//
// # Serving
//
// Any net/http server serves the Proxy. On Linux the Proxy's upstream
// connections read and write with raw system calls that the Go runtime
// does not count as system calls, which spares a gateway at a moderate
// load the runtime's thread hand-offs after each idle gap; RawListener
// does the same for the server's own connections, the clients'.
//
// # Middleware
//
// Middleware does the routing and picking for gateways that own their
// proxy: the Decision is in the request context (FromContext), optionally
// named in a header for the next hop, and its Done reports the outcome.
package router
