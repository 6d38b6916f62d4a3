package sim

import (
	"time"

	"github.com/inferroute/inferroute/signals"
)

// Epoch is the wall-clock instant that virtual time zero maps to. It is not
// the Unix epoch on purpose: the library treats a zero Unix timestamp as
// "never" in places (signals.Endpoint's adapter recency), and a simulated
// dispatch at time zero must count.
var Epoch = time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)

// Clock is a virtual clock: Now returns Epoch plus the simulator's current
// virtual time. The simulator advances it between events, so the library
// code it drives reads virtual time. A Clock is not safe for concurrent use
// with Set; the simulator reads and sets it from one goroutine.
type Clock struct {
	now time.Duration
}

var _ signals.Clock = (*Clock)(nil)

// Now returns Epoch + the virtual time.
func (c *Clock) Now() time.Time { return Epoch.Add(c.now) }

// Elapsed returns the virtual time since the start of the run.
func (c *Clock) Elapsed() time.Duration { return c.now }

// Set moves the clock to virtual time d.
func (c *Clock) Set(d time.Duration) { c.now = d }
