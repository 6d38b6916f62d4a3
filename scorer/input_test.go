package scorer_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
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

// TestInputLoadsFollowKeep checks Loads against each endpoint's own
// reading through a pick: a first Loads, a filter that drops and compacts
// with Keep, load changes that must not show within the pick, a Load of
// one candidate between, and a new pick that must show them.
func TestInputLoadsFollowKeep(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	hl := 2 * time.Second
	eps := make([]*signals.Endpoint, 9)
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: string(rune('a' + i))})
		eps[i].SetMetrics(&signals.Metrics{ScrapedAt: now.Add(-time.Duration(i) * time.Second), Baseline: eps[i].Counters(),
			Waiting: signals.Known(float64(i)), KVCacheUtilization: signals.Known(float64(i) / 10), BlockSize: 16, NumBlocks: 100})
		eps[i].SetThroughput(float64(1000 * (i % 3)))
		for j := 0; j < i; j++ {
			eps[i].Dispatch(100 * j)
			eps[i].StartPrefill(100 * j)
		}
	}
	want := func(ep *signals.Endpoint) signals.Load { return ep.LoadAt(now, hl) }
	before := make(map[*signals.Endpoint]signals.Load)
	for _, ep := range eps {
		before[ep] = want(ep)
	}
	check := func(in *scorer.Input, expect map[*signals.Endpoint]signals.Load, msg string) {
		t.Helper()
		loads := in.Loads(hl)
		if assert.Len(t, loads, len(in.Endpoints), msg) {
			for i, ep := range in.Endpoints {
				assert.Equal(t, expect[ep], loads[i], "%s: candidate %d (%s)", msg, i, ep.Name)
				assert.Equal(t, expect[ep], *in.Load(i, hl), "%s: Load(%d)", msg, i)
			}
		}
	}

	var in scorer.Input
	in.Reset(nil, append([]*signals.Endpoint(nil), eps...), now)
	check(&in, before, "first reading")
	for _, ep := range eps {
		ep.Dispatch(5000) // not seen until the next pick
	}
	// A filter keeps the odd candidates, compacted to the front.
	n := 0
	for i, ep := range in.Endpoints {
		if i%2 == 1 {
			in.Endpoints[n] = ep
			n++
		}
	}
	in.Keep(in.Endpoints[:n])
	check(&in, before, "after Keep")
	// A filter that reverses the candidates in place, which Keep cannot
	// follow: they are read again, with the new loads.
	for i, j := 0, len(in.Endpoints)-1; i < j; i, j = i+1, j-1 {
		in.Endpoints[i], in.Endpoints[j] = in.Endpoints[j], in.Endpoints[i]
	}
	in.Keep(in.Endpoints)
	after := make(map[*signals.Endpoint]signals.Load)
	for _, ep := range eps {
		after[ep] = want(ep)
	}
	require.Len(t, in.Endpoints, 4) // an even count: every candidate moved
	loads := in.Loads(hl)
	for i, ep := range in.Endpoints {
		assert.Equal(t, after[ep], loads[i], "moved candidate %s read again", ep.Name)
	}

	in.Reset(nil, append([]*signals.Endpoint(nil), eps...), now)
	check(&in, after, "next pick")
}

// TestInputGrows reuses one Input over pools that grow one endpoint at a
// time and then jump, as a picker's pooled Input does when endpoints are
// added: the memo's slices have different element sizes, so append gives
// them different capacities, and each must grow on its own.
func TestInputGrows(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var eps []*signals.Endpoint
	var in scorer.Input
	sizes := []int{}
	for n := 1; n <= 80; n++ {
		sizes = append(sizes, n)
	}
	sizes = append(sizes, 3, 200, 7, 513, 1000, 1)
	for _, n := range sizes {
		for len(eps) < n {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprint(len(eps))})
			for j := 0; j < len(eps)%5; j++ {
				ep.Dispatch(j)
			}
			eps = append(eps, ep)
		}
		in.Reset(nil, eps[:n], now)
		loads := in.Loads(time.Second)
		require.Len(t, loads, n)
		for i, ep := range eps[:n] {
			require.Equal(t, ep.InFlight(), loads[i].InFlight, "n=%d i=%d", n, i)
		}
		require.Equal(t, eps[n-1].InFlight(), in.Load(n-1, 0).InFlight, "n=%d", n)
	}
}

// TestInputLoadsAreEndpointReadings checks every field of every Load the
// memo hands out against the endpoint's own reading (signals.Endpoint.
// LoadAt), for a pool with and without scrapes, KV utilisation, measured
// throughput, prefill work and recent dispatches: the memo keeps each
// Load and a column copy of some of its fields, and what it hands out must
// be the endpoint's reading exactly. It also checks that a candidate read
// again with another half-life (Load) does not leave Loads serving that
// reading for the first half-life.
func TestInputLoadsAreEndpointReadings(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	hl := 2 * time.Second
	pool := []*signals.Endpoint{
		signalstest.Endpoint("scraped", signalstest.Load{Running: 3, Waiting: 7, KV: 0.4, ScrapedAt: now.Add(-700 * time.Millisecond)}),
		signalstest.Endpoint("no-kv", signalstest.Load{Running: 1, Waiting: 0, KV: math.NaN(), ScrapedAt: now.Add(-3 * time.Second)}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "never-scraped"}),
		signalstest.Endpoint("busy", signalstest.Load{Running: 9, Waiting: 30, KV: 0.97, ScrapedAt: now}),
	}
	for i, ep := range pool {
		for j := 0; j <= i; j++ {
			ep.Dispatch(100 * (j + 1))
			ep.StartPrefill(100 * (j + 1))
			ep.NoteDispatch(now.Add(-time.Duration(j) * 10 * time.Millisecond))
		}
		if i%2 == 0 {
			ep.SetThroughput(float64(1000 * (i + 1)))
		}
	}
	want := func(i int, h time.Duration) signals.Load { return pool[i].LoadAt(now, h) }

	var in scorer.Input
	in.Reset(nil, append([]*signals.Endpoint(nil), pool...), now)
	loads := in.Loads(hl)
	require.Len(t, loads, len(pool))
	for i := range pool {
		assert.Equal(t, want(i, hl), loads[i], pool[i].Name)
		assert.Equal(t, want(i, hl), *in.Load(i, hl), pool[i].Name)
	}
	assert.Equal(t, want(2, 0), *in.Load(2, 0), "another half-life, another reading")
	loads = in.Loads(hl)
	for i := range pool {
		assert.Equal(t, want(i, hl), loads[i], "%s after a reading with another half-life", pool[i].Name)
	}

	// A hand-built Input reads afresh and gives the same.
	hand := &scorer.Input{Endpoints: pool, Now: now}
	for i, l := range hand.Loads(hl) {
		assert.Equal(t, want(i, hl), l, pool[i].Name)
	}
}

// TestInputLoadsKeepsEarlierReadings checks that Loads, which reads a
// whole pool at once when nothing of the pick is memoised yet, still
// serves a candidate that a filter already read with Load its earlier
// reading, even after that candidate's counters moved.
func TestInputLoadsKeepsEarlierReadings(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	hl := 2 * time.Second
	a := signalstest.Endpoint("a", signalstest.Load{Running: 1, Waiting: 2, KV: 0.5, ScrapedAt: now})
	b := signalstest.Endpoint("b", signalstest.Load{Running: 1, Waiting: 2, KV: 0.5, ScrapedAt: now})

	var in scorer.Input
	in.Reset(nil, []*signals.Endpoint{a, b}, now)
	early := *in.Load(1, hl)
	b.Dispatch(500)
	a.Dispatch(500)
	loads := in.Loads(hl)
	assert.Equal(t, early, loads[1], "b's reading from before its dispatch")
	assert.Equal(t, a.LoadAt(now, hl), loads[0], "a read when Loads first asked")

	// The next pick reads both afresh.
	in.Reset(nil, []*signals.Endpoint{a, b}, now)
	loads = in.Loads(hl)
	assert.Equal(t, a.LoadAt(now, hl), loads[0])
	assert.Equal(t, b.LoadAt(now, hl), loads[1])
	assert.EqualValues(t, 1, loads[1].InFlight)
}
