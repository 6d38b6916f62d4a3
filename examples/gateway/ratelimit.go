package main

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/inferroute/inferroute/router"
)

// bucket is a token bucket of one API key: of its requests
// (Grant.RequestsPerMinute), each of which takes a token, or of its
// model tokens (Grant.TokensPerMinute), which a request may use when the
// bucket holds one and spends when its answer says how many it used,
// overdrawing it. It holds up to burst tokens and gains perMinute of
// them a minute, evenly. A bucket starts full.
type bucket struct {
	perMinute int
	burst     int

	mu     sync.Mutex
	tokens float64
	last   time.Time // when tokens was last brought up to date; zero before the first take
}

// newBucket returns a full bucket.
func newBucket(perMinute, burst int) *bucket {
	return &bucket{perMinute: perMinute, burst: burst, tokens: float64(burst)}
}

// take takes a token at now when there is one. Otherwise it reports how
// long until there is, when a retry would be taken.
func (b *bucket) take(now time.Time) (ok bool, wait time.Duration) {
	return b.check(now, 1)
}

// ready reports whether the bucket holds a token at now, taking none,
// or how long until it does.
func (b *bucket) ready(now time.Time) (ok bool, wait time.Duration) {
	return b.check(now, 0)
}

// check is take (cost 1) and ready (cost 0).
func (b *bucket) check(now time.Time, cost float64) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens -= cost
		return true, 0
	}
	// A bucket overdrawn by far more than its rate (tokensPerMinute: 1,
	// an answer of a million tokens) would wait past what a Duration
	// holds; 2^62 ns is 146 years.
	return false, time.Duration(math.Min(math.Ceil((1-b.tokens)/b.rate()), 1<<62))
}

// spend takes n tokens at now, overdrawing the bucket if need be.
func (b *bucket) spend(now time.Time, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.tokens -= float64(n)
}

// rate is the bucket's gain in tokens per nanosecond.
func (b *bucket) rate() float64 { return float64(b.perMinute) / float64(time.Minute) }

// refill brings the tokens up to date at now; b.mu is held.
func (b *bucket) refill(now time.Time) {
	if !b.last.IsZero() {
		if d := now.Sub(b.last); d > 0 {
			b.tokens = math.Min(float64(b.burst), b.tokens+float64(d)*b.rate())
		}
	}
	if now.After(b.last) {
		b.last = now
	}
}

// counts reports whether b counts perMinute with burst, so that a
// reload that keeps a key's limit keeps what the key has used of it.
func (b *bucket) counts(perMinute, burst int) bool {
	return b.perMinute == perMinute && b.burst == burst
}

// burstOf is gr's burst: Grant.Burst, or by default a tenth of the
// minute's requests (six seconds' worth), at least one.
func burstOf(gr Grant) int {
	if gr.Burst > 0 {
		return gr.Burst
	}
	return max(1, gr.RequestsPerMinute/10)
}

// The two limits of a key, as the rate_limited counter's limit attribute
// and OpenAI's x-ratelimit-* headers name them.
const (
	limitRequests = "requests"
	limitTokens   = "tokens"
)

// overLimit is the 429 of key k over the limit of b (what: limitRequests
// or limitTokens), in the shape of OpenAI's rate-limit errors (type
// "requests" or "tokens", code rate_limit_exceeded), with Retry-After;
// the x-ratelimit-* headers are those OpenAI's API sends, which some
// clients read.
func overLimit(w http.ResponseWriter, k *apiKey, b *bucket, what string, wait time.Duration) *router.APIError {
	h := w.Header()
	h.Set("X-Ratelimit-Limit-"+what, strconv.Itoa(b.perMinute))
	h.Set("X-Ratelimit-Remaining-"+what, "0")
	h.Set("X-Ratelimit-Reset-"+what, wait.Round(time.Millisecond).String())
	return &router.APIError{Status: http.StatusTooManyRequests, Type: what, Code: "rate_limit_exceeded",
		Message: fmt.Sprintf("rate limit reached for API key %s: %d %s per minute; retry in %s",
			k.name, b.perMinute, what, wait.Round(time.Millisecond)),
		RetryAfter: wait}
}
