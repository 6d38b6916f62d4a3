// Package pickergrpc serves an inferroute picker over gRPC, so that a
// gateway written in any language can use it as its endpoint picker.
//
// The service (pickerpb/picker.proto) has three calls. Pick chooses an
// endpoint and returns a reservation id; the gateway sends the request to
// the endpoint itself and then calls Done with the id and the outcome
// (error, time to first token, latency, token counts), which the server
// hands to the picker's Result.Done: it releases the endpoint's in-flight
// accounting and trains the signals. FirstToken, optional, reports the
// first response byte in between, taking the request out of the
// endpoint's prefill queue. A client that crashes or forgets Done
// would leave the endpoint looking busy for ever, so every reservation has
// a timeout after which the server releases it itself, reporting
// ErrReservationExpired as the outcome; a late Done then gets NOT_FOUND.
// A Pick whose caller went away (its context canceled or past its
// deadline) before the reservation is committed reserves nothing: the pick
// is released at once with the context's error as the outcome, and the
// answer is CANCELED or DEADLINE_EXCEEDED.
//
// The picker's errors map onto gRPC codes a gateway can turn into HTTP
// statuses: a shed request is RESOURCE_EXHAUSTED (429), no endpoint is
// UNAVAILABLE (503), an invalid request (a negative token count or TTFT
// objective) is INVALID_ARGUMENT (400).
//
// cmd/pickerd is a complete server (static endpoints, scraping, prefix
// index, gRPC health and server reflection) and cmd/pickclient a client that picks, optionally
// sends an OpenAI completion to the chosen endpoint while timing it, and
// reports Done.
package pickergrpc
