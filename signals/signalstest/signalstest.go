// Package signalstest provides helpers for testing code built on package
// signals: a manual clock and a builder of endpoints with given metrics.
package signalstest

import (
	"sync"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// Clock is a signals.Clock that only moves when told to. The zero value
// reads as the Unix epoch. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		return time.Unix(0, 0)
	}
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = time.Unix(0, 0)
	}
	c.now = c.now.Add(d)
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Load describes an endpoint's scraped state for Endpoint. Negative counts
// and NaN fractions mean "not reported".
type Load struct {
	Running, Waiting float64
	KV               float64
	ScrapedAt        time.Time
}

// Endpoint returns a new endpoint named name at address name:8000, with a
// Metrics snapshot built from l already published (scraped at
// l.ScrapedAt, with the endpoint's current counters as baseline).
func Endpoint(name string, l Load) *signals.Endpoint {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: name, Address: name + ":8000"})
	m := &signals.Metrics{ScrapedAt: l.ScrapedAt, Baseline: ep.Counters()}
	if l.Running >= 0 {
		m.Running = signals.Known(l.Running)
	}
	if l.Waiting >= 0 {
		m.Waiting = signals.Known(l.Waiting)
	}
	if l.KV == l.KV { // not NaN
		m.KVCacheUtilization = signals.Known(l.KV)
	}
	ep.SetMetrics(m)
	return ep
}
