package scrape

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// flapTransport answers scrapes in memory. The first request to host
// "a" waits for release (or its context); every request records how many
// requests to its host were in flight at once.
type flapTransport struct {
	entered chan struct{} // closed when the first request to "a" arrives
	release chan struct{}

	mu       sync.Mutex
	inFlight map[string]int
	maxAt    map[string]int
	hits     map[string]int
}

func newFlapTransport() *flapTransport {
	return &flapTransport{
		entered: make(chan struct{}), release: make(chan struct{}),
		inFlight: map[string]int{}, maxAt: map[string]int{}, hits: map[string]int{},
	}
}

func (ft *flapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Hostname()
	ft.mu.Lock()
	ft.hits[host]++
	first := host == "a" && ft.hits[host] == 1
	ft.inFlight[host]++
	ft.maxAt[host] = max(ft.maxAt[host], ft.inFlight[host])
	ft.mu.Unlock()
	defer func() {
		ft.mu.Lock()
		ft.inFlight[host]--
		ft.mu.Unlock()
	}()
	if first {
		close(ft.entered)
		select {
		case <-ft.release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	page := "vllm:num_requests_running 1\n"
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/plain; version=0.0.4"}},
		Body:          io.NopCloser(strings.NewReader(page)),
		ContentLength: int64(len(page)), Request: req,
	}, nil
}

func (ft *flapTransport) maxInFlight(host string) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.maxAt[host]
}

// TestRelistedEndpointNotScrapedTwiceAtOnce: discovery drops an endpoint
// and lists it again (a readiness flap; kubediscovery reuses the
// *Endpoint) while a scrape of it hangs. The scraper must not start a
// second scrape of that endpoint next to the hanging one: two overlapping
// scrapes publish out of order and count the old one's failure after the
// new one's success. The hanging scrape's completion reschedules it.
func TestRelistedEndpointNotScrapedTwiceAtOnce(t *testing.T) {
	clock := newFakeClock()
	ft := newFlapTransport()
	// An hour's interval: the loop moves only when the test advances the
	// clock and pokes it with SetEndpoints.
	s := newTestScraper(t, Config{Interval: time.Hour, Jitter: -1, Timeout: time.Minute, Concurrency: 2},
		WithClock(clock), WithHTTPClient(&http.Client{Transport: ft}))
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "a", Address: "a:80"})
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "b", Address: "b:80"})
	scrapes := func(ep *signals.Endpoint) uint64 {
		st, _ := s.Status(ep)
		return st.Scrapes
	}
	tick := func(eps ...*signals.Endpoint) {
		clock.Advance(time.Hour) // everything in the set is due
		s.SetEndpoints(eps)      // and the loop wakes up
	}

	s.SetEndpoints([]*signals.Endpoint{a})
	require.NoError(t, s.Start(context.Background()))
	tick(a)
	<-ft.entered // a's first scrape hangs, holding one of the two slots

	s.SetEndpoints(nil)
	s.SetEndpoints([]*signals.Endpoint{a, b}) // a is back, b is new
	tick(a, b)
	eventually(t, func() bool { return scrapes(b) == 1 }, "b not scraped")
	// b's second scrape needs the second slot again: any scrape of a
	// started meanwhile has finished by the time it completes.
	tick(a, b)
	eventually(t, func() bool { return scrapes(b) == 2 }, "b not scraped twice")
	assert.Equal(t, 1, ft.maxInFlight("a"), "two scrapes of a in flight at once")

	close(ft.release)
	eventually(t, func() bool { return scrapes(a) >= 1 }, "a's hanging scrape not recorded")
	assert.Equal(t, known(1), a.Metrics().Running)
}

// TestBackoffDoesNotWrap: the backoff doubles the interval per failure up
// to MaxBackoff without overflowing: an interval of 2^34+1 ns (about
// 17.2 s) shifted left by 30 wraps around to 2^30 ns (about 1.07 s), and
// a failing endpoint must not be scraped more often after 30 failures than
// after one.
func TestBackoffDoesNotWrap(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	interval := time.Duration(1<<34 + 1)
	s := newTestScraper(t, Config{Interval: interval, MaxBackoff: time.Hour, Jitter: -1})
	for _, failures := range []int{1, 2, 7, 30, 31, 62, 63, 64, 1000} {
		want := time.Hour
		if failures <= 7 { // 2^7 × 17.2 s = 36.6 min, below the hour
			want = interval << failures
		}
		assert.Equal(t, want, s.nextScrape(base, failures).Sub(base), "%d failures", failures)
	}
}
