package main

import (
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals/signalstest"
)

// TestBucket: a bucket starts full, gives burst requests at once, then
// one per 60/perMinute seconds, and says when the next one is there.
func TestBucket(t *testing.T) {
	clock := signalstest.NewClock(time.Unix(1_800_000_000, 0))
	b := newBucket(60, 3) // one a second
	for i := range 3 {
		ok, _ := b.take(clock.Now())
		require.True(t, ok, "request %d of the burst", i)
	}
	ok, wait := b.take(clock.Now())
	assert.False(t, ok)
	assert.Equal(t, time.Second, wait)
	clock.Advance(400 * time.Millisecond)
	ok, wait = b.take(clock.Now())
	assert.False(t, ok)
	assert.Equal(t, 600*time.Millisecond, wait)
	clock.Advance(600 * time.Millisecond)
	ok, _ = b.take(clock.Now())
	assert.True(t, ok, "a token a second")
	ok, _ = b.take(clock.Now())
	assert.False(t, ok)

	clock.Advance(time.Hour)
	for i := range 3 {
		ok, _ := b.take(clock.Now())
		require.True(t, ok, "refilled up to the burst, request %d", i)
	}
	ok, _ = b.take(clock.Now())
	assert.False(t, ok, "and no further")

	// A clock that steps back gives nothing, then or on its way forward
	// again over the minute it had already counted.
	clock.Advance(-time.Minute)
	ok, _ = b.take(clock.Now())
	assert.False(t, ok)
	clock.Advance(time.Minute)
	ok, _ = b.take(clock.Now())
	assert.False(t, ok, "the minute is not counted twice")

	assert.Equal(t, 60, burstOf(Grant{RequestsPerMinute: 600}), "six seconds' worth")
	assert.Equal(t, 1, burstOf(Grant{RequestsPerMinute: 5}), "at least one")
	assert.Equal(t, 7, burstOf(Grant{RequestsPerMinute: 600, Burst: 7}))

	// A bucket of model tokens: used while it holds one, overdrawn by
	// what the answer spent.
	tb := newBucket(60, 60)
	ok, _ = tb.ready(clock.Now())
	assert.True(t, ok)
	tb.spend(clock.Now(), 100)
	ok, wait = tb.ready(clock.Now())
	assert.False(t, ok)
	assert.Equal(t, 41*time.Second, wait, "from -40 to 1 at one a second")
	clock.Advance(41 * time.Second)
	ok, _ = tb.ready(clock.Now())
	assert.True(t, ok)
	ok, _ = tb.ready(clock.Now())
	assert.True(t, ok, "ready takes nothing")

	huge := newBucket(1, 1)
	huge.spend(clock.Now(), math.MaxInt32)
	huge.spend(clock.Now(), math.MaxInt32)
	ok, wait = huge.ready(clock.Now())
	assert.False(t, ok)
	assert.Equal(t, time.Duration(1<<62), wait, "capped, not overflowed to a negative wait")
}

// TestAPIKeyRateLimit: a key over its requests per minute is answered
// 429 in OpenAI's shape with Retry-After, counted and logged with the
// key's name, and served again once its bucket has a token; other keys
// are not held back; a reload that keeps the limit keeps what was used,
// one that changes it starts afresh.
func TestAPIKeyRateLimit(t *testing.T) {
	pod, seen := headerPod(t, "Authorization")
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	const ci, other = "sk-ci-0123456789abcdef", "sk-other-0123456789abcdef"
	require.NoError(t, os.WriteFile(keys, []byte("ci "+ci+"\nother "+other+"\n"), 0o600))
	config := func(grant string) Config {
		t.Helper()
		cfg, err := ParseConfig([]byte(gatewayYAML(pod.Listener.Addr().String()) +
			"accessLog: true\nauth:\n  keysFile: " + keys + "\n  grants:\n    ci: " + grant + "\n"))
		require.NoError(t, err)
		return cfg
	}
	var access syncBuf
	g, err := newGateway(config("{requestsPerMinute: 30, burst: 2}"), slog.New(slog.DiscardHandler), &access)
	require.NoError(t, err)
	clock := signalstest.NewClock(time.Unix(1_800_000_000, 0))
	g.now = clock.Now
	startT(t, g)
	chat, served := chatAs(t, g, seen, "sql-lora")
	limited := func(retryAfter, reset string) {
		t.Helper()
		w := chat(ci)
		require.Equal(t, 429, w.Code)
		assert.JSONEq(t, `{"error":{"message":"rate limit reached for API key ci: 30 requests per minute; retry in `+reset+`","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, w.Body.String())
		assert.Equal(t, retryAfter, w.Header().Get("Retry-After"))
		assert.Equal(t, "30", w.Header().Get("X-Ratelimit-Limit-Requests"))
		assert.Equal(t, "0", w.Header().Get("X-Ratelimit-Remaining-Requests"))
		assert.Equal(t, reset, w.Header().Get("X-Ratelimit-Reset-Requests"))
		assert.Empty(t, seen, "not forwarded")
	}

	served(ci)
	served(ci) // the burst
	limited("2", "2s")
	line := lastAccessLine(t, &access)
	assert.Equal(t, "ci", line["api_key"])
	assert.Equal(t, 429.0, line["status"])
	for range 5 {
		served(other) // no limit of its own, and none of ci's
	}
	clock.Advance(1500 * time.Millisecond)
	limited("1", "500ms") // Retry-After in whole seconds, rounded up
	clock.Advance(500 * time.Millisecond)
	served(ci)
	limited("2", "2s")

	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	w := httptest.NewRecorder()
	g.Handler().ServeHTTP(w, r)
	assert.Regexp(t, `inferroute_gateway_rate_limited_total\{[^}]*api_key="ci"[^}]*\} 3\n`, w.Body.String())

	// The same limit through a reload: the bucket stays empty.
	require.NoError(t, g.Reload(config("{requestsPerMinute: 30, burst: 2, models: [sql-lora]}")))
	limited("2", "2s")
	// Another limit: a new, full bucket.
	require.NoError(t, g.Reload(config("{requestsPerMinute: 6}")))
	served(ci)
	w = chat(ci)
	require.Equal(t, 429, w.Code, "a burst of one: a tenth of 6, at least one")
	assert.Equal(t, "10", w.Header().Get("Retry-After"))
}

// TestAPIKeyTokens: every key's model tokens are counted from the
// answers' usage; a key over its tokens per minute is answered 429 (type
// tokens) until its bucket, overdrawn by the last answer, holds a token
// again.
func TestAPIKeyTokens(t *testing.T) {
	pod, seen := headerPod(t, "Authorization") // its answer: 12 prompt and 5 completion tokens
	keys := filepath.Join(t.TempDir(), "keys")
	const ci, other = "sk-ci-0123456789abcdef", "sk-other-0123456789abcdef"
	require.NoError(t, os.WriteFile(keys, []byte("ci "+ci+"\nother "+other+"\n"), 0o600))
	cfg, err := ParseConfig([]byte(gatewayYAML(pod.Listener.Addr().String()) +
		"auth:\n  keysFile: " + keys + "\n  grants:\n    ci: {tokensPerMinute: 30}\n"))
	require.NoError(t, err)
	g, err := newGateway(cfg, slog.New(slog.DiscardHandler), io.Discard)
	require.NoError(t, err)
	clock := signalstest.NewClock(time.Unix(1_800_000_000, 0))
	g.now = clock.Now
	startT(t, g)
	chat, served := chatAs(t, g, seen, "llama")
	served(ci) // 30 → 13
	served(ci) // 13 → -4: a request is let through while a token is left
	w := chat(ci)
	require.Equal(t, 429, w.Code)
	// 5 tokens short of one, at half a token a second.
	assert.JSONEq(t, `{"error":{"message":"rate limit reached for API key ci: 30 tokens per minute; retry in 10s","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`, w.Body.String())
	assert.Equal(t, "10", w.Header().Get("Retry-After"))
	assert.Equal(t, "30", w.Header().Get("X-Ratelimit-Limit-Tokens"))
	assert.Equal(t, "10s", w.Header().Get("X-Ratelimit-Reset-Tokens"))
	assert.Empty(t, seen, "not forwarded")
	served(other)
	clock.Advance(9 * time.Second)
	assert.Equal(t, 429, chat(ci).Code)
	clock.Advance(time.Second)
	served(ci)

	m := httptest.NewRecorder()
	g.Handler().ServeHTTP(m, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	metrics := m.Body.String()
	assert.Regexp(t, `inferroute_gateway_tokens_total\{[^}]*api_key="ci"[^}]*kind="prompt"[^}]*\} 36\n`, metrics)
	assert.Regexp(t, `inferroute_gateway_tokens_total\{[^}]*api_key="ci"[^}]*kind="completion"[^}]*\} 15\n`, metrics)
	assert.Regexp(t, `inferroute_gateway_tokens_total\{[^}]*api_key="other"[^}]*kind="prompt"[^}]*\} 12\n`, metrics)
	assert.Regexp(t, `inferroute_gateway_rate_limited_total\{[^}]*api_key="ci"[^}]*limit="tokens"[^}]*\} 2\n`, metrics)
}

// chatAs returns two ways to send g a chat completion for model as an API
// key: chat, which returns the answer, and served, which requires a 200
// and takes the pod's receipt from seen.
func chatAs(t *testing.T, g *Gateway, seen chan []string, model string) (
	chat func(key string) *httptest.ResponseRecorder, served func(key string)) {
	chat = func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		r.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		g.Handler().ServeHTTP(w, r)
		return w
	}
	served = func(key string) {
		t.Helper()
		w := chat(key)
		require.Equal(t, 200, w.Code, w.Body.String())
		<-seen
	}
	return chat, served
}
