package signals_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// TestLoadAtMatchesMethods checks that the one-read Load agrees exactly with
// the per-signal methods it replaces on the pick path, across the states an
// endpoint goes through: never scraped, fresh, ageing, partly reported,
// hostile values, work dispatched and completed since the scrape.
func TestLoadAtMatchesMethods(t *testing.T) {
	hl := 2 * time.Second
	for _, tt := range []struct {
		name     string
		m        *signals.Metrics // nil: never scraped
		dispatch []int            // prompt tokens dispatched after the scrape
		complete []int            // of which these completed
		age      time.Duration
		halfLife time.Duration
		tp       float64
	}{
		{name: "never scraped, idle", halfLife: hl},
		{name: "never scraped, busy", dispatch: []int{100, 200, 300}, complete: []int{100}, halfLife: hl},
		{name: "fresh full scrape", m: &signals.Metrics{Waiting: signals.Known(3), Running: signals.Known(7),
			KVCacheUtilization: signals.Known(0.4), BlockSize: 16, NumBlocks: 1000}, halfLife: hl},
		{name: "ageing scrape with dispatches since", m: &signals.Metrics{Waiting: signals.Known(3), Running: signals.Known(7),
			KVCacheUtilization: signals.Known(0.4), BlockSize: 16, NumBlocks: 1000},
			dispatch: []int{512, 1024, 64}, complete: []int{512}, age: 1500 * time.Millisecond, halfLife: hl, tp: 9000},
		{name: "old scrape", m: &signals.Metrics{Waiting: signals.Known(30), Running: signals.Known(1),
			KVCacheUtilization: signals.Known(0.9)}, dispatch: []int{10}, age: time.Minute, halfLife: hl},
		{name: "no half-life: never ages", m: &signals.Metrics{Waiting: signals.Known(2), Running: signals.Known(2)},
			dispatch: []int{10, 10}, age: time.Hour},
		{name: "only running reported", m: &signals.Metrics{Running: signals.Known(4)}, dispatch: []int{1}, age: time.Second, halfLife: hl},
		{name: "nothing reported", m: &signals.Metrics{}, dispatch: []int{1, 2}, halfLife: hl},
		{name: "negative counts, KV over 1", m: &signals.Metrics{Waiting: signals.Known(-5), Running: signals.Known(-1),
			KVCacheUtilization: signals.Known(1.7), BlockSize: 16, NumBlocks: 10}, complete: nil, dispatch: []int{5000}, halfLife: hl},
		{name: "ageing scrape, more in flight than the cache holds", m: &signals.Metrics{Waiting: signals.Known(1),
			KVCacheUtilization: signals.Known(0.5), BlockSize: 16, NumBlocks: 10},
			dispatch: []int{5000, 300}, complete: []int{300}, age: 3 * time.Second, halfLife: hl},
		{name: "more completed than dispatched since", m: &signals.Metrics{Waiting: signals.Known(0), Running: signals.Known(1),
			KVCacheUtilization: signals.Known(0.1), BlockSize: 16, NumBlocks: 100}, halfLife: hl},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a", Labels: map[string]string{signals.LabelGPU: "l4"}})
			ep.SetThroughput(tt.tp)
			if tt.name == "more completed than dispatched since" {
				ep.Dispatch(40)
				ep.Dispatch(40)
			}
			if tt.m != nil {
				tt.m.ScrapedAt = t0
				tt.m.Baseline = ep.Counters()
				ep.SetMetrics(tt.m)
			}
			if tt.name == "more completed than dispatched since" {
				ep.Complete(40)
				ep.Complete(40)
			}
			for _, n := range tt.dispatch {
				ep.Dispatch(n)
				ep.StartPrefill(n)
				ep.NoteDispatch(t0)
			}
			if len(tt.complete) > 0 {
				ep.EndPrefill(tt.complete[0])
			}
			for _, n := range tt.complete {
				ep.Complete(n)
			}
			now := t0.Add(tt.age)

			l := ep.LoadAt(now, tt.halfLife)

			assert.Equal(t, tt.halfLife, l.HalfLife)
			assert.Equal(t, ep.QueueDepth(now, tt.halfLife), l.Waiting, "Waiting")
			assert.Equal(t, ep.RunningRequests(now, tt.halfLife), l.Running, "Running")
			assert.Equal(t, ep.Requests(now, tt.halfLife), l.Requests, "Requests")
			kv, ok := ep.KVCacheUtilization(now, tt.halfLife)
			assert.Equal(t, ok, l.KVKnown, "KVKnown")
			assert.Equal(t, kv, l.KV, "KV")
			assert.Equal(t, ep.InFlight(), l.InFlight, "InFlight")
			assert.Equal(t, ep.InFlightTokens(), l.InFlightTokens, "InFlightTokens")
			preq, ptok := ep.Prefilling()
			assert.Equal(t, preq, l.PrefillRequests, "PrefillRequests")
			assert.Equal(t, ptok, l.PrefillTokens, "PrefillTokens")
			assert.Equal(t, ep.PrefillRate(), l.PrefillRate(), "PrefillRate")
			if tp, ok := ep.Throughput(); ok {
				assert.Equal(t, tp, l.Throughput, "Throughput")
				assert.Equal(t, 1/tp, l.InvThroughput, "InvThroughput")
			} else {
				assert.Zero(t, l.Throughput, "Throughput unmeasured")
				assert.Zero(t, l.InvThroughput, "InvThroughput unmeasured")
			}
			assert.Equal(t, ep.RecentDispatches(now), l.Recent, "Recent")
			assert.Equal(t, 0.39, l.Speed, "Speed: the l4 label's")
			if len(tt.dispatch) > 0 && tt.age <= 2*time.Second {
				assert.Positive(t, l.Recent, "dispatches were noted")
			}
			if tt.m == nil {
				assert.Zero(t, l.Confidence)
			} else {
				assert.InDelta(t, signals.Confidence(t0, now, tt.halfLife), l.Confidence, 1e-4)
			}
			for _, v := range []float64{l.Waiting, l.Running, l.Requests, l.KV, l.Confidence} {
				assert.False(t, math.IsNaN(v) || math.IsInf(v, 0) || v < 0, "%v", v)
			}
		})
	}
}

// TestLoadAtArithmetic checks the blend by hand: a scrape one half-life old
// (confidence ½) saw 3 waiting; 2 requests went out since and none came
// back, and 2 are in flight in all. Waiting = ½·(3+2) + ½·2 = 3.5.
func TestLoadAtArithmetic(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	ep.SetMetrics(&signals.Metrics{ScrapedAt: t0, Baseline: ep.Counters(),
		Waiting: signals.Known(3), Running: signals.Known(1)})
	ep.Dispatch(10)
	ep.Dispatch(10)
	l := ep.LoadAt(t0.Add(time.Second), time.Second)
	require.InDelta(t, 0.5, l.Confidence, 1e-4)
	assert.InDelta(t, 3.5, l.Waiting, 1e-3)
	assert.InDelta(t, 0.5*(1+2)+0.5*2, l.Running, 1e-3)
	assert.InDelta(t, 0.5*(4+2)+0.5*2, l.Requests, 1e-3)
	assert.Equal(t, int64(2), l.InFlight)
	assert.Equal(t, int64(20), l.InFlightTokens)
	assert.False(t, l.KVKnown)
}

func TestPrefilling(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	ep.StartPrefill(100)
	ep.StartPrefill(300)
	ep.StartPrefill(-5) // a nonsense count counts as zero tokens
	n, tok := ep.Prefilling()
	assert.EqualValues(t, 3, n)
	assert.EqualValues(t, 400, tok)
	ep.EndPrefill(300)
	n, tok = ep.Prefilling()
	assert.EqualValues(t, 2, n)
	assert.EqualValues(t, 100, tok)
	// More ends than starts (a caller's bug) never reads below zero.
	for i := 0; i < 4; i++ {
		ep.EndPrefill(100)
	}
	n, tok = ep.Prefilling()
	assert.Zero(t, n)
	assert.Zero(t, tok)

	assert.Equal(t, signals.DefaultPrefillRate, ep.PrefillRate())
	ep.SetThroughput(2500)
	assert.Equal(t, 2500.0, ep.PrefillRate())
}

// TestReadLoadsAtMatchesLoadAt checks the pool reader against each
// endpoint's own reading: scraped and never scraped, with and without KV,
// with work in flight.
func TestReadLoadsAtMatchesLoadAt(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	eps := []*signals.Endpoint{
		signalstest.Endpoint("a", signalstest.Load{Running: 3, Waiting: 1, KV: 0.2, ScrapedAt: now.Add(-time.Second)}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "never-scraped"}),
		signalstest.Endpoint("no-kv", signalstest.Load{Running: 0, Waiting: 9, KV: math.NaN(), ScrapedAt: now.Add(-5 * time.Second)}),
	}
	for i, ep := range eps {
		ep.Dispatch(100 * (i + 1))
		ep.NoteDispatch(now)
	}
	for _, hl := range []time.Duration{0, 250 * time.Millisecond, 2 * time.Second} {
		at := signals.NewInstant(now, hl)
		dst := make([]signals.Load, len(eps)+1)
		signals.ReadLoadsAt(dst, eps, &at)
		for i, ep := range eps {
			assert.Equal(t, ep.LoadAt(now, hl), dst[i], "%s, half-life %v", ep.Name, hl)
		}
		assert.Equal(t, signals.Load{}, dst[len(eps)], "past len(eps) untouched")
	}
}
