package router

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/inferroute/inferroute/internal/canon"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Kind is the OpenAI API a request path belongs to.
type Kind uint8

// Request kinds.
const (
	// KindOther is any other path (health checks, /tokenize, …).
	KindOther Kind = iota
	// KindChat is /v1/chat/completions.
	KindChat
	// KindCompletions is /v1/completions.
	KindCompletions
	// KindEmbeddings is /v1/embeddings.
	KindEmbeddings
	// KindResponses is /v1/responses.
	KindResponses
	// KindModels is /v1/models, answered from the routing table.
	KindModels
)

// String returns the kind's path-like name, for logs and metric attributes.
func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat.completions"
	case KindCompletions:
		return "completions"
	case KindEmbeddings:
		return "embeddings"
	case KindResponses:
		return "responses"
	case KindModels:
		return "models"
	}
	return "other"
}

// KindOf classifies a request path. Trailing slashes are ignored; the /v1
// prefix is required.
func KindOf(path string) Kind {
	path = strings.TrimRight(path, "/")
	switch path {
	case "/v1/chat/completions":
		return KindChat
	case "/v1/completions":
		return KindCompletions
	case "/v1/embeddings":
		return KindEmbeddings
	case "/v1/responses":
		return KindResponses
	case "/v1/models":
		return KindModels
	}
	return KindOther
}

// Request headers read by ParseRequest.
const (
	// HeaderPriority carries the request's priority as an integer: negative
	// is sheddable, 0 the default, positive critical (signals.Request.Priority).
	HeaderPriority = "x-inferroute-priority"
	// HeaderSession carries a session key that groups a conversation's turns;
	// it takes precedence over the body's prompt_cache_key and user.
	HeaderSession = "x-session-id"
	// HeaderRequestID is copied to signals.Request.ID when present.
	HeaderRequestID = "x-request-id"
)

// The header names above in canonical form. http.Header.Get canonicalizes
// its key on every call, which for a lowercase name means allocating the
// canonical copy and for one already canonical a scan of it; the router
// reads them with internal/canon.Get, which does neither.
var (
	canonicalPriority  = http.CanonicalHeaderKey(HeaderPriority)
	canonicalSession   = http.CanonicalHeaderKey(HeaderSession)
	canonicalRequestID = http.CanonicalHeaderKey(HeaderRequestID)
)

// ErrMalformed is wrapped by ParseRequest's errors for a body that is not a
// well-formed JSON object or whose known fields have the wrong type; a
// router answers 400.
var ErrMalformed = errors.New("malformed request")

// ParseOptions tunes ParseRequest. The zero value is ready to use.
type ParseOptions struct {
	// SessionHeader names the session-key header; "" means HeaderSession.
	SessionHeader string
	// PriorityHeader names the priority header; "" means HeaderPriority.
	PriorityHeader string

	// canonical is set by Canonical: the names are in canonical form and
	// are looked up without canonicalizing them again.
	canonical bool
}

// Canonical returns o with its header names in canonical form. ParseRequest
// reads the same headers either way, but a name not in canonical form is
// canonicalized, which allocates, on every call: callers that parse many
// requests with one ParseOptions canonicalize it once (NewProxy does). The
// result is marked canonical and its names are looked up as they are: a
// name changed in it afterwards must be canonical too, or Canonical called
// again.
func (o ParseOptions) Canonical() ParseOptions {
	if o.SessionHeader != "" {
		o.SessionHeader = http.CanonicalHeaderKey(o.SessionHeader)
	}
	if o.PriorityHeader != "" {
		o.PriorityHeader = http.CanonicalHeaderKey(o.PriorityHeader)
	}
	o.canonical = true
	return o
}

// Parsed is what ParseRequest read from one request. Its spans point into
// the body it was parsed from, which must stay unchanged while the Parsed is
// used.
type Parsed struct {
	// Kind is the API the path belongs to.
	Kind Kind
	// JSON reports whether the body was parsed as a JSON object. False for
	// empty and non-JSON bodies, which carry no model.
	JSON bool
	// Model is the body's "model" string; "" when absent or null.
	Model string
	// Stream is the body's "stream" flag.
	Stream bool
	// IncludeUsage is stream_options.include_usage: the last SSE chunk will
	// carry token usage.
	IncludeUsage bool
	// MaxOutputTokens is max_completion_tokens, else max_tokens, else
	// max_output_tokens, whichever is present and not null first in that
	// order; 0 if none.
	MaxOutputTokens int
	// SessionKey is the session header, else prompt_cache_key, else user,
	// else safety_identifier; "" if none.
	SessionKey string
	// Priority is the priority header's value, 0 if absent.
	Priority int
	// SLO holds the objectives of the x-slo-ttft-ms / x-slo-tpot-ms headers.
	SLO signals.SLO
	// RequestID is the x-request-id header.
	RequestID string

	// modelStart and modelEnd delimit the model value, quotes included, so
	// that it can be rewritten in place; both 0 when there is none.
	modelStart, modelEnd int
	// prompt is the prompt rendered by ParseRequestPrompt; nil after
	// ParseRequest.
	prompt *prefix.Prompt
}

// ParseRequest reads the routing-relevant fields of an OpenAI-style request:
// the body's model, stream flag and options, output limit and session keys
// (user, prompt_cache_key, safety_identifier), and the priority, session and
// SLO headers. Unknown fields are skipped without being decoded. It does not
// retain body or header beyond the returned Parsed's spans.
//
// A body whose first non-blank byte is not '{' is not JSON: the result has
// JSON false and no error, and the request goes to the fallback route. A
// body that starts as an object but is malformed, or whose known fields
// have the wrong type, is an error wrapping ErrMalformed, as is a bad SLO
// or priority header. The whole body is checked in one pass without
// allocating (except for the strings returned), so the cost grows linearly
// with its size: its structure (objects, arrays, where each string ends,
// literals), every key and the fields read here are checked and decoded as
// encoding/json would ("mod\u0065l" is the key model; of a repeated key
// the last value counts; invalid UTF-8 in a string read becomes U+FFFD);
// the escapes and
// characters inside the strings it skips and the digits of the numbers it
// skips are not, which leaves them to the model server's own JSON reader
// and its 400 (FuzzParseRequest holds it to this).
//
// The prompt is not read here: Prepare renders and hashes it once the route
// (model and adapter) is known. ParseRequestPrompt reads it in the same pass.
func ParseRequest(path string, header http.Header, body []byte, opts ParseOptions) (Parsed, error) {
	return parseRequest(path, header, body, opts, nil)
}

// ParseRequestPrompt is ParseRequest that also renders the body's prompt
// into pr (prefix.Prompt.Read) in the same pass over the body, so that
// Prepare only hashes it, under the route's model and adapter, instead of
// reading the body again: for a long prompt this halves the router's work
// per byte. A prompt field of the wrong shape (say "messages" that is not an
// array) is then an error wrapping ErrMalformed here rather than in Prepare.
//
// The returned Parsed refers to pr: pr must not be read again, reset or used
// concurrently until Prepare has returned, and Prepare uses pr only when it
// is given pr's Hasher (otherwise it reads the body as after ParseRequest).
// A nil pr makes it ParseRequest.
func ParseRequestPrompt(path string, header http.Header, body []byte, opts ParseOptions, pr *prefix.Prompt) (Parsed, error) {
	return parseRequest(path, header, body, opts, pr)
}

func parseRequest(path string, header http.Header, body []byte, opts ParseOptions, pr *prefix.Prompt) (Parsed, error) {
	p := Parsed{Kind: KindOf(path)}
	if err := p.headers(header, opts); err != nil {
		return p, err
	}
	if i := skipBlanks(body, 0); i >= len(body) || body[i] != '{' {
		return p, nil
	}
	p.JSON = true
	var user, cacheKey, safety string
	// The output limits, -1 when absent or null, in their order of
	// precedence: max_completion_tokens replaces the deprecated max_tokens
	// of chat completions; max_output_tokens is the responses API's. A
	// repeated key takes its last value here as everywhere, as
	// encoding/json does.
	limits := [...]int{-1, -1, -1}
	// A value of the wrong type is an error unless a later value of the
	// same key replaces it: typeErrs holds the model's, the stream flag's
	// and each limit's (at typeLimits+i).
	const typeModel, typeStream, typeLimits = 0, 1, 2
	var typeErrs [typeLimits + len(limits)]error
	field := func(key []byte, v0, v1 int) error {
		v := body[v0:v1]
		switch string(key) {
		case "model":
			typeErrs[typeModel] = nil
			if string(v) == "null" { // no model, as encoding/json reads it
				p.Model, p.modelStart, p.modelEnd = "", 0, 0
				break
			}
			m, ok := stringValue(v)
			if !ok {
				p.Model, p.modelStart, p.modelEnd = "", 0, 0
				typeErrs[typeModel] = fieldErr("model", "a string")
				break
			}
			p.Model, p.modelStart, p.modelEnd = m, v0, v1
		case "stream":
			typeErrs[typeStream] = nil
			switch string(v) {
			case "true":
				p.Stream = true
			case "false", "null":
				p.Stream = false
			default:
				typeErrs[typeStream] = fieldErr("stream", "a boolean")
			}
		case "stream_options":
			a, b, ok := lastField(v, "include_usage")
			p.IncludeUsage = ok && string(v[a:b]) == "true"
		case "max_completion_tokens", "max_tokens", "max_output_tokens":
			n := -1
			var terr error
			if string(v) != "null" {
				var ok bool
				if n, ok = intValue(v); !ok || n < 0 {
					n, terr = -1, fieldErr(string(key), "a non-negative integer")
				}
			}
			i := 2 // max_output_tokens
			switch string(key) {
			case "max_completion_tokens":
				i = 0
			case "max_tokens":
				i = 1
			}
			limits[i], typeErrs[typeLimits+i] = n, terr
		case "user":
			user, _ = stringValue(v)
		case "prompt_cache_key":
			cacheKey, _ = stringValue(v)
		case "safety_identifier":
			safety, _ = stringValue(v)
		}
		return nil
	}
	var end int
	var err error
	if pr != nil {
		end, err = pr.Read(body, field)
	} else {
		end, err = prefix.Fields(body, field)
	}
	if err != nil {
		var se *prefix.SyntaxError
		if errors.As(err, &se) {
			return p, &syntaxError{se}
		}
		return p, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if end = skipBlanks(body, end); end != len(body) {
		return p, fmt.Errorf("%w: %w at byte %d: data after the object", ErrMalformed, errSyntax, end)
	}
	for _, err := range typeErrs {
		if err != nil {
			return p, err
		}
	}
	if p.SessionKey == "" {
		p.SessionKey = firstNonEmpty(cacheKey, user, safety)
	}
	for _, n := range limits {
		if n >= 0 {
			p.MaxOutputTokens = n
			break
		}
	}
	p.prompt = pr
	return p, nil
}

func (p *Parsed) headers(h http.Header, opts ParseOptions) error {
	if h == nil {
		return nil
	}
	sh, ph, pname := opts.SessionHeader, opts.PriorityHeader, opts.PriorityHeader
	if sh == "" {
		sh = canonicalSession
	}
	if ph == "" {
		ph, pname = canonicalPriority, HeaderPriority
	}
	get := canon.Get
	if !opts.canonical && (opts.SessionHeader != "" || opts.PriorityHeader != "") {
		get = http.Header.Get
	}
	p.SessionKey = get(h, sh)
	p.RequestID = canon.Get(h, canonicalRequestID)
	if v := strings.TrimSpace(get(h, ph)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%w: header %s: %q is not an integer", ErrMalformed, pname, v)
		}
		p.Priority = n
	}
	slo, err := latency.ParseSLOHeaders(h)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	p.SLO = slo
	return nil
}

// syntaxError is a body that is not JSON, as a client reads it: the
// message gives the byte offset without the name of the package that found
// it ("malformed request: malformed JSON at byte 9"), and errors.Is finds
// ErrMalformed and prefix.ErrBadBody.
type syntaxError struct{ err *prefix.SyntaxError }

func (e *syntaxError) Error() string {
	return fmt.Sprintf("%v: %v at byte %d", ErrMalformed, errSyntax, e.err.Offset)
}

func (e *syntaxError) Unwrap() []error { return []error{ErrMalformed, errSyntax, e.err} }

// fieldError is a body field of the wrong type.
type fieldError struct{ field, want string }

func (e *fieldError) Error() string {
	return fmt.Sprintf("%v: '%s' must be %s", ErrMalformed, e.field, e.want)
}

func (e *fieldError) Unwrap() error { return ErrMalformed }

func fieldErr(field, want string) error { return &fieldError{field: field, want: want} }

// param returns the body field an error is about, for the OpenAI error's
// "param"; "" when none.
func param(err error) string {
	var fe *fieldError
	if errors.As(err, &fe) {
		return fe.field
	}
	return ""
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// HasModel reports whether the body carried a model field.
func (p *Parsed) HasModel() bool { return p.modelEnd > p.modelStart }

// RewriteModel returns body with its model value replaced by to (JSON
// quoted). It returns body itself when there is no model field or the value
// is already to. body must be the one p was parsed from. The result is a new
// slice owned by the caller when a rewrite happened.
func (p *Parsed) RewriteModel(body []byte, to string) []byte {
	if !p.HasModel() || p.Model == to {
		return body
	}
	return splice(body, p.modelStart, p.modelEnd, to)
}

// splice returns b with b[start:end] replaced by the JSON string of s.
func splice(b []byte, start, end int, s string) []byte {
	q := appendJSONString(make([]byte, 0, len(s)+2), s)
	out := make([]byte, 0, len(b)-(end-start)+len(q))
	out = append(out, b[:start]...)
	out = append(out, q...)
	return append(out, b[end:]...)
}

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"':
			dst = append(dst, '\\', '"')
		case r == '\\':
			dst = append(dst, '\\', '\\')
		case r < 0x20:
			dst = fmt.Appendf(dst, "\\u%04x", r)
		default:
			dst = append(dst, string(r)...)
		}
	}
	return append(dst, '"')
}

// Prepare fills req for the picker from a parsed request and its route:
// model and adapter from the route, the prompt's chained block hashes
// (appended to blocks[:0], which may be nil) and token estimate from
// h.HashBody, and the parsed output limit, priority, session, SLO and ID.
// The token estimate is the rendered prompt's bytes over
// prefix.BytesPerToken (chars/4, the rule of thumb of OpenAI's tokenizer
// guide; exact for token-id prompts, which count 4 bytes per id). A nil h
// skips hashing and the estimate. req.Headers is set to header.
//
// When p comes from ParseRequestPrompt with a Prompt of h, the prompt read
// then is hashed and body is not read again; the blocks are the same.
//
// It returns an error wrapping ErrMalformed when the prompt fields have the
// wrong shape.
func Prepare(req *signals.Request, p *Parsed, rt Route, body []byte, header http.Header, h *prefix.Hasher, blocks []uint64) error {
	*req = signals.Request{
		ID:              p.RequestID,
		Model:           rt.Model,
		Adapter:         rt.Adapter,
		MaxOutputTokens: p.MaxOutputTokens,
		Priority:        p.Priority,
		SessionKey:      p.SessionKey,
		SLO:             p.SLO,
		Headers:         header,
	}
	if h == nil || !p.JSON {
		return nil
	}
	if pr := p.prompt; pr != nil && pr.Ok() && pr.Hasher() == h {
		req.PromptBlocks = pr.Hash(blocks[:0], rt.Model, rt.Adapter)
		req.PromptTokens = pr.Bytes() / prefix.BytesPerToken
		return nil
	}
	hs, n, err := h.HashBody(blocks[:0], rt.Model, rt.Adapter, body)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	req.PromptBlocks = hs
	req.PromptTokens = n / prefix.BytesPerToken
	return nil
}
