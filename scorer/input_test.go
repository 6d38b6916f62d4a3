package scorer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

func TestInputLoadMemo(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	hl := 2 * time.Second
	a := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "b"})
	c := signals.NewEndpoint(signals.EndpointSpec{Name: "c"})

	// A hand-built Input memoises nothing: every call reads afresh.
	hand := &scorer.Input{Endpoints: []*signals.Endpoint{a}, Now: now}
	assert.Zero(t, hand.Load(0, hl).InFlight)
	a.Dispatch(10)
	assert.EqualValues(t, 1, hand.Load(0, hl).InFlight)

	// After Reset, the first read of a candidate is kept for the pick.
	var in scorer.Input
	in.Reset(nil, []*signals.Endpoint{a, b, c}, now)
	assert.EqualValues(t, 1, in.Load(0, hl).InFlight)
	assert.Zero(t, in.Load(2, hl).InFlight)
	a.Dispatch(10)
	c.Dispatch(10)
	assert.EqualValues(t, 1, in.Load(0, hl).InFlight, "one consistent reading per pick")
	// A different half-life is a different reading.
	assert.EqualValues(t, 2, in.Load(0, 0).InFlight)

	// A filter drops b and compacts c into its place: Keep carries c's
	// reading along, and a's stays.
	in.Endpoints[1] = c
	in.Keep(in.Endpoints[:2])
	assert.Zero(t, in.Load(1, hl).InFlight, "c's reading from before the filter")
	assert.EqualValues(t, 2, in.Load(0, 0).InFlight)

	// Without Keep, a moved candidate is read again rather than served
	// another candidate's reading.
	in.Endpoints[0], in.Endpoints[1] = in.Endpoints[1], in.Endpoints[0]
	assert.EqualValues(t, 1, in.Load(0, hl).InFlight, "c read afresh")
	assert.EqualValues(t, 2, in.Load(1, hl).InFlight, "a read afresh")

	// The next pick reads afresh.
	in.Reset(nil, []*signals.Endpoint{a, b, c}, now)
	assert.EqualValues(t, 2, in.Load(0, hl).InFlight)
	assert.EqualValues(t, 1, in.Load(2, hl).InFlight)
}
