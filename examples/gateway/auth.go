package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inferroute/inferroute/router"
)

// AuthConfig turns on API keys: every request the proxy serves
// (/v1/models included) must carry one of the keys in KeysFile as
// "Authorization: Bearer <key>", the form OpenAI's SDKs send, or is
// answered 401 in OpenAI's error shape. /healthz, /readyz, /livez and
// /metrics stay open to probes and Prometheus. The client's Authorization
// is not forwarded: a pool's model servers get the pool's upstreamKeyFile
// credential, or none. A reload reads the files again, so keys are added
// and revoked without a restart.
type AuthConfig struct {
	// KeysFile is the file of the keys clients may present, one per line
	// as "name key" or "key" alone; blank lines and lines starting with #
	// are skipped. The name (for a lone key "line N") goes in the access
	// log as api_key, never the key. Keys are at least 16 characters of
	// visible ASCII, each given once, names too. Required.
	KeysFile string `yaml:"keysFile"`
	// Grants limits keys to some of the models, to a rate, or both, by
	// the key's name in KeysFile. A key without a grant may use every
	// model at any rate. A key whose grant lists models or pools may use
	// those and nothing else: /v1/models lists only those, and a request
	// for another model is answered 404 model_not_found, word for word as
	// for a model that does not exist (OpenAI answers a key without
	// access to a model so), so that a key cannot learn which models it
	// is denied. A request of such a key that names no model (a GET, a
	// non-JSON body), which would take the fallback pool, is allowed only
	// when the grant lists that pool, and answered 403 model_required
	// otherwise. Grant.RequestsPerMinute and Grant.TokensPerMinute limit
	// the key's rate. A grant
	// that names no key of KeysFile is logged as a warning rather than
	// refused, so that deleting a key's line revokes it whatever the
	// grants say.
	Grants map[string]Grant `yaml:"grants"`
}

// Grant is what one API key may use (AuthConfig.Grants): models or
// pools, a rate, or both; it must set one of them.
type Grant struct {
	// Models are client-facing names of the pools: models, adapters and
	// aliases. With neither Models nor Pools the key may use every model.
	Models []string `yaml:"models"`
	// Pools are pools every name of which the key may use, names added to
	// them later included.
	Pools []string `yaml:"pools"`
	// RequestsPerMinute, when positive, limits the requests the key may
	// make (listings included), as a token bucket of Burst requests
	// refilled evenly at this rate: a request over it is answered 429
	// rate_limit_exceeded with Retry-After, when the next one would be
	// taken. A reload that keeps a key's limit keeps what it has used.
	RequestsPerMinute int `yaml:"requestsPerMinute"`
	// Burst is how many requests the key may make at once after a quiet
	// spell; default a tenth of RequestsPerMinute (six seconds' worth),
	// at least 1.
	Burst int `yaml:"burst"`
	// TokensPerMinute, when positive, limits the model tokens the key may
	// use (prompt and completion, as the answers' usage reports them),
	// as a token bucket of a minute's worth refilled evenly: a request
	// is let through while the bucket holds a token, its answer's usage
	// is then taken from it, overdrawing it if need be, and a request
	// while it is empty is answered 429 rate_limit_exceeded (type
	// tokens) with Retry-After. Answers that report no usage (a stream
	// without stream_options.include_usage) spend nothing.
	TokensPerMinute int `yaml:"tokensPerMinute"`
}

// minKeyLen is the shortest API key taken: a shorter one could be guessed
// by trying keys against the gateway.
const minKeyLen = 16

// keySet is the API keys in force, by the SHA-256 of each key: a lookup
// compares digests, so its time tells nothing of how close a wrong key
// came to a right one, and the keys themselves are not kept.
type keySet struct {
	keys   map[[sha256.Size]byte]*apiKey
	byName map[string]*apiKey
	// stray are the names of AuthConfig.Grants that name no key, sorted:
	// the callers log them.
	stray    []string
	anyGrant bool // some key has a grant
}

// apiKey is what a request's key is known by: the request's context
// carries it (apiKeyCtx) for the access log and the grant's check.
type apiKey struct {
	name   string
	grant  *grant  // nil: every model
	limit  *bucket // of requests; nil: no limit
	tokens *bucket // of model tokens; nil: no limit
	// The attributes of the key's series of the rate_limited (by limit)
	// and tokens (by kind) counters.
	overRequests, overTokens metric.AddOption
	promptBy, outputBy       metric.AddOption
}

// apiKeyCtx is the context key of a request's *apiKey, set whenever keys
// are on.
type apiKeyCtx struct{}

// grant is a Grant as sets.
type grant struct {
	models map[string]bool
	pools  map[string]bool
}

// allows reports whether the grant covers rt. The fallback route's
// ClientModel is "", which no grant lists (checkGrants).
func (g *grant) allows(rt router.Route) bool {
	return g.pools[rt.Pool.Name] || g.models[rt.ClientModel]
}

// loadKeys reads and checks the keys file of a and gives the keys their
// grants; nil when a is nil (keys off). The grants were checked with the
// configuration (checkGrants). A key of prev, the keys in force, whose
// rate limit stays keeps its bucket.
func loadKeys(a *AuthConfig, prev *keySet) (*keySet, error) {
	if a == nil {
		return nil, nil
	}
	b, err := os.ReadFile(a.KeysFile)
	if err != nil {
		return nil, fmt.Errorf("auth.keysFile: %w", err)
	}
	ks, err := parseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("auth.keysFile %s: %w", a.KeysFile, err)
	}
	ks.byName = make(map[string]*apiKey, len(ks.keys))
	for _, k := range ks.keys {
		ks.byName[k.name] = k
		set := func(kv ...attribute.KeyValue) metric.AddOption {
			return metric.WithAttributeSet(attribute.NewSet(append(kv, attribute.String("api_key", k.name))...))
		}
		k.overRequests, k.overTokens = set(attribute.String("limit", limitRequests)), set(attribute.String("limit", limitTokens))
		k.promptBy, k.outputBy = set(attribute.String("kind", "prompt")), set(attribute.String("kind", "completion"))
	}
	for name, gr := range a.Grants {
		k := ks.byName[name]
		if k == nil {
			ks.stray = append(ks.stray, name)
			continue
		}
		var was apiKey // the key of that name in force, if any
		if prev != nil && prev.byName[name] != nil {
			was = *prev.byName[name]
		}
		if gr.RequestsPerMinute > 0 {
			k.limit = keep(was.limit, gr.RequestsPerMinute, burstOf(gr))
		}
		if gr.TokensPerMinute > 0 {
			k.tokens = keep(was.tokens, gr.TokensPerMinute, gr.TokensPerMinute)
		}
		if len(gr.Models) == 0 && len(gr.Pools) == 0 {
			continue
		}
		ks.anyGrant = true
		k.grant = &grant{models: make(map[string]bool, len(gr.Models)), pools: make(map[string]bool, len(gr.Pools))}
		for _, m := range gr.Models {
			k.grant.models[m] = true
		}
		for _, p := range gr.Pools {
			k.grant.pools[p] = true
		}
	}
	slices.Sort(ks.stray)
	return ks, nil
}

// keep returns b, a bucket in force (nil when none), when it counts
// perMinute with burst, and a new one otherwise.
func keep(b *bucket, perMinute, burst int) *bucket {
	if b != nil && b.counts(perMinute, burst) {
		return b
	}
	return newBucket(perMinute, burst)
}

// logStray warns of the grants of ks that name no key: a key revoked
// whose grant stays, or a misspelt name, whose key may use every model.
func logStray(log *slog.Logger, ks *keySet) {
	if ks != nil && len(ks.stray) > 0 {
		log.Warn("auth.grants names keys that auth.keysFile does not have; a misspelt name leaves its key every model",
			"names", ks.stray)
	}
}

// granted counts the keys of ks that have a grant of models or a limit.
func (ks *keySet) granted() int {
	n := 0
	for _, k := range ks.keys {
		if k.grant != nil || k.limit != nil || k.tokens != nil {
			n++
		}
	}
	return n
}

// checkGrants checks that every grant of a sets something, names only
// names (models, adapters, aliases) and pools of pools, and has no
// negative limit.
func checkGrants(a *AuthConfig, pools []PoolConfig) error {
	if a == nil {
		return nil
	}
	names := map[string]bool{}
	pool := map[string]bool{}
	for _, pc := range pools {
		pool[pc.Name] = true
		for _, m := range pc.Models {
			names[m] = true
		}
		for m := range pc.Adapters {
			names[m] = true
		}
		for m := range pc.Aliases {
			names[m] = true
		}
	}
	for _, key := range slices.Sorted(maps.Keys(a.Grants)) {
		gr := a.Grants[key]
		switch {
		case len(gr.Models) == 0 && len(gr.Pools) == 0 && gr.RequestsPerMinute == 0 && gr.TokensPerMinute == 0:
			return fmt.Errorf("auth.grants.%s: sets nothing (models, pools, requestsPerMinute or tokensPerMinute); to refuse the key, delete it from auth.keysFile", key)
		case gr.RequestsPerMinute < 0:
			return fmt.Errorf("auth.grants.%s.requestsPerMinute: %d is negative", key, gr.RequestsPerMinute)
		case gr.TokensPerMinute < 0:
			return fmt.Errorf("auth.grants.%s.tokensPerMinute: %d is negative", key, gr.TokensPerMinute)
		case gr.Burst < 0:
			return fmt.Errorf("auth.grants.%s.burst: %d is negative", key, gr.Burst)
		case gr.Burst > 0 && gr.RequestsPerMinute == 0:
			return fmt.Errorf("auth.grants.%s.burst: needs requestsPerMinute", key)
		}
		for _, m := range gr.Models {
			if !names[m] {
				return fmt.Errorf("auth.grants.%s.models: %q is no model, adapter or alias of any pool", key, m)
			}
		}
		for _, p := range gr.Pools {
			if !pool[p] {
				return fmt.Errorf("auth.grants.%s.pools: %q is not a pool", key, p)
			}
		}
	}
	return nil
}

// errModelRequired refuses a request without a model from a key whose
// grant does not list the fallback pool.
var errModelRequired = &router.APIError{Status: http.StatusForbidden, Type: "invalid_request_error", Param: "model",
	Code: "model_required", Message: `this API key may use only the models granted to it: name one in the request's "model" field`}

// allow is the proxy's router.Config.Allow: a request whose key has a
// grant takes only the routes the grant covers. A model outside it is
// refused with the error of an unknown model, word for word. Without
// grants in force it costs an atomic load.
func (g *Gateway) allow(r *http.Request, rt router.Route) error {
	if ks := g.keys.Load(); ks == nil || !ks.anyGrant {
		return nil
	}
	k, _ := r.Context().Value(apiKeyCtx{}).(*apiKey)
	switch {
	case k == nil || k.grant == nil || k.grant.allows(rt):
		return nil
	case rt.Fallback:
		return errModelRequired
	}
	return fmt.Errorf("%w: %q", router.ErrModelNotFound, rt.ClientModel)
}

// parseKeys parses a keys file (AuthConfig.KeysFile). Its errors name the
// line, never the key.
func parseKeys(b []byte) (*keySet, error) {
	ks := &keySet{keys: map[[sha256.Size]byte]*apiKey{}}
	keyLine := map[[sha256.Size]byte]int{}
	nameLine := map[string]int{}
	for i, line := range strings.Split(string(b), "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		var name, key string
		switch f := strings.Fields(line); len(f) {
		case 1:
			name, key = "line "+strconv.Itoa(n), f[0]
		case 2:
			name, key = f[0], f[1]
		default:
			return nil, fmt.Errorf("line %d: want \"name key\" or a key alone, found %d fields", n, len(f))
		}
		if len(key) < minKeyLen {
			return nil, fmt.Errorf("line %d: the key is shorter than %d characters", n, minKeyLen)
		}
		if !visibleASCII(key) {
			return nil, fmt.Errorf("line %d: the key has a character that is not visible ASCII", n)
		}
		sum := sha256.Sum256([]byte(key))
		if m, dup := keyLine[sum]; dup {
			return nil, fmt.Errorf("line %d: the key of line %d again", n, m)
		}
		if m, dup := nameLine[name]; dup {
			return nil, fmt.Errorf("line %d: name %q is also line %d's", n, name, m)
		}
		keyLine[sum], nameLine[name] = n, n
		ks.keys[sum] = &apiKey{name: name}
	}
	if len(ks.keys) == 0 {
		return nil, errors.New("no keys: every request would be refused")
	}
	return ks, nil
}

// Reasons a request is refused, the reason attribute of
// inferroute_gateway_unauthorized_total.
const (
	authMissing = "missing" // no Authorization header with a Bearer credential
	authInvalid = "invalid" // a Bearer credential that is no key of the set
)

// check returns the key r presents, or why it has none that counts.
func (ks *keySet) check(r *http.Request) (k *apiKey, reason string) {
	v := r.Header["Authorization"]
	if len(v) != 1 {
		return nil, authMissing // none, or two: which one would be meant?
	}
	const scheme = "bearer " // RFC 6750 section 2.1; the scheme is case-insensitive (RFC 9110 section 11.1)
	h := v[0]
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return nil, authMissing
	}
	key := strings.TrimLeft(h[len(scheme):], " ")
	k, ok := ks.keys[sha256.Sum256([]byte(key))]
	if !ok {
		return nil, authInvalid
	}
	return k, ""
}

// unauthorized is the 401 of each reason, in OpenAI's error shape (an
// invalid_request_error of code invalid_api_key, which OpenAI's SDKs raise
// as an authentication error). The messages never echo the key.
var unauthorized = map[string]*router.APIError{
	authMissing: {Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: `no API key: send one in the Authorization header as "Bearer <key>"`},
	authInvalid: {Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "invalid API key"},
}

// authorize checks r's API key when keys are on, and the key's rate
// limits when it has any. It returns the request to serve, carrying the
// key (apiKeyCtx: for the access log, allow and completed); or false
// after answering 401 or 429.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	ks := g.keys.Load()
	if ks == nil {
		return r, true
	}
	var start time.Time
	logged := g.accessOn.Load()
	if logged {
		start = time.Now()
	}
	k, reason := ks.check(r)
	if reason != "" {
		g.refused.Add(r.Context(), 1, g.refusedBy[reason])
		w.Header().Set("WWW-Authenticate", `Bearer realm="inferroute"`)
		g.refuse(w, r, unauthorized[reason], start, logged)
		return nil, false
	}
	r = r.WithContext(context.WithValue(r.Context(), apiKeyCtx{}, k))
	if k.tokens != nil {
		if ok, wait := k.tokens.ready(g.now()); !ok {
			g.limited.Add(r.Context(), 1, k.overTokens)
			g.refuse(w, r, overLimit(w, k, k.tokens, limitTokens, wait), start, logged)
			return nil, false
		}
	}
	if k.limit != nil {
		if ok, wait := k.limit.take(g.now()); !ok {
			g.limited.Add(r.Context(), 1, k.overRequests)
			g.refuse(w, r, overLimit(w, k, k.limit, limitRequests, wait), start, logged)
			return nil, false
		}
	}
	return r, true
}

// refuse answers r with ae and, when logged, writes its access log line,
// timed from start.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, ae *router.APIError, start time.Time, logged bool) {
	router.WriteError(w, ae)
	if logged {
		attrs := []slog.Attr{slog.String("method", clip(r.Method)), slog.String("path", clip(r.URL.Path)),
			slog.Int("status", ae.Status), slog.Duration("duration", time.Since(start))}
		if r.RemoteAddr != "" {
			attrs = append(attrs, slog.String("client", r.RemoteAddr))
		}
		attrs = append(attrs, slog.String("error", ae.Message))
		g.access.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	}
}

// initAuthMetrics registers inferroute_gateway_unauthorized_total{reason},
// the requests refused for their API key: a rise of "invalid" is someone
// trying keys, or a client left with a revoked one.
func (g *Gateway) initAuthMetrics() error {
	var err error
	if g.refused, err = g.meter.Int64Counter("inferroute.gateway.unauthorized",
		metric.WithDescription("Requests answered 401 for their API key (auth.keysFile), by reason: missing or invalid.")); err != nil {
		return err
	}
	g.refusedBy = map[string]metric.AddOption{}
	for _, reason := range []string{authMissing, authInvalid} {
		g.refusedBy[reason] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))
	}
	if g.limited, err = g.meter.Int64Counter("inferroute.gateway.rate_limited",
		metric.WithDescription("Requests answered 429 for their API key's requestsPerMinute or tokensPerMinute (auth.grants), by the key's name and the limit.")); err != nil {
		return err
	}
	g.tokens, err = g.meter.Int64Counter("inferroute.gateway.tokens",
		metric.WithDescription("Model tokens used by each API key (auth.keysFile), as the answers' usage reports them, by kind: prompt or completion."))
	return err
}

// completed is the proxy's router.Config.Completed: with keys on, it
// counts the tokens of the request's key and takes them from its
// tokensPerMinute.
func (g *Gateway) completed(r *http.Request, c router.Completion) {
	if g.keys.Load() == nil || c.PromptTokens+c.CompletionTokens == 0 {
		return // keys off: an atomic load
	}
	k, _ := r.Context().Value(apiKeyCtx{}).(*apiKey)
	if k == nil {
		return
	}
	ctx := r.Context()
	g.tokens.Add(ctx, int64(c.PromptTokens), k.promptBy)
	g.tokens.Add(ctx, int64(c.CompletionTokens), k.outputBy)
	if k.tokens != nil {
		k.tokens.spend(g.now(), c.PromptTokens+c.CompletionTokens)
	}
}

// maxLogValue bounds each client-chosen value of an access log line the
// gateway writes itself, as the router bounds its own.
const maxLogValue = 512

// clip returns s cut to maxLogValue bytes, on a rune boundary, marked with
// an ellipsis when cut.
func clip(s string) string {
	if len(s) <= maxLogValue {
		return s
	}
	i := maxLogValue
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// upstreamHeader is the router.PoolConfig.Header of pc: Authorization
// with the pool's upstreamKeyFile credential, or, with API keys on and no
// such file, no Authorization at all, so that a client's key stays at the
// gateway. nil when neither applies (the client's header is forwarded).
func upstreamHeader(pc PoolConfig, auth *AuthConfig) (http.Header, error) {
	if pc.UpstreamKeyFile == "" {
		if auth != nil {
			return http.Header{"Authorization": nil}, nil
		}
		return nil, nil
	}
	b, err := os.ReadFile(pc.UpstreamKeyFile)
	if err != nil {
		return nil, fmt.Errorf("upstreamKeyFile: %w", err)
	}
	key := string(bytes.TrimSpace(b))
	if key == "" {
		return nil, fmt.Errorf("upstreamKeyFile %s: empty", pc.UpstreamKeyFile)
	}
	if !visibleASCII(key) {
		return nil, fmt.Errorf("upstreamKeyFile %s: the key is not one line of visible ASCII", pc.UpstreamKeyFile)
	}
	return http.Header{"Authorization": {"Bearer " + key}}, nil
}

// visibleASCII reports whether s is all visible ASCII (0x21–0x7E): a key
// that fits a header value as it is, with no space or control character.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
