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

// bucket is the token bucket of one API key's requests
// (Grant.RequestsPerMinute): it holds up to burst tokens, gains
// perMinute of them a minute, evenly, and each request takes one. A
// bucket starts full.
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
	rate := float64(b.perMinute) / float64(time.Minute) // tokens per nanosecond
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		if d := now.Sub(b.last); d > 0 {
			b.tokens = math.Min(float64(b.burst), b.tokens+float64(d)*rate)
		}
	}
	if now.After(b.last) {
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration(math.Ceil((1 - b.tokens) / rate))
}

// sameLimit reports whether b counts the limit of gr, so that a reload
// that keeps a key's limit keeps what the key has used of it.
func (b *bucket) sameLimit(gr Grant) bool {
	return b.perMinute == gr.RequestsPerMinute && b.burst == burstOf(gr)
}

// burstOf is gr's burst: Grant.Burst, or by default a tenth of the
// minute's requests (six seconds' worth), at least one.
func burstOf(gr Grant) int {
	if gr.Burst > 0 {
		return gr.Burst
	}
	return max(1, gr.RequestsPerMinute/10)
}

// overLimit is the 429 of a key over its requests per minute, in the shape
// of OpenAI's rate-limit errors (type "requests", code
// rate_limit_exceeded), with Retry-After; the x-ratelimit-* headers are
// those OpenAI's API sends, which some clients read.
func overLimit(w http.ResponseWriter, k *apiKey, wait time.Duration) *router.APIError {
	h := w.Header()
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(k.limit.perMinute))
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	h.Set("X-Ratelimit-Reset-Requests", wait.Round(time.Millisecond).String())
	return &router.APIError{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
		Message: fmt.Sprintf("rate limit reached for API key %s: %d requests per minute; retry in %s",
			k.name, k.limit.perMinute, wait.Round(time.Millisecond)),
		RetryAfter: wait}
}
