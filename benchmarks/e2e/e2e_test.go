package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/workload"
	"github.com/inferroute/inferroute/signals/prefix"
)

// TestCompareShort runs 300 requests at 80% of the hetero fleet's capacity
// through the gateway with round-robin and with the default picker, and
// through the simulator. The default picker must lower the mean TTFT over
// HTTP as it does in the simulation, and no request may fail.
func TestCompareShort(t *testing.T) {
	r, err := Compare(context.Background(), CompareConfig{Requests: 300, Load: 0.8, Seed: 1})
	require.NoError(t, err)
	var sb strings.Builder
	require.NoError(t, WriteCompare(&sb, r))
	t.Log("\n" + sb.String())
	require.Len(t, r.Policies, 2)
	for _, p := range r.Policies {
		assert.Equal(t, 300, p.OK, p.Policy)
		assert.Zero(t, p.Lost+p.Cut+p.Truncated, p.Policy)
	}
	httpMean, httpP99, simMean, simP99, ok := r.Reduction()
	require.True(t, ok)
	assert.Less(t, simMean, 0.0, "the simulation favours the default picker")
	assert.Less(t, simP99, 0.0)
	assert.Less(t, httpMean, 0.0, "so must the run over HTTP")
	assert.Less(t, httpP99, 0.0)
}

// TestChaosShort kills and restarts 3 of 8 pods during a 6-second run.
// The targets are asserted: no request lost before its first
// byte, no stream silently truncated (a cut stream is reported to the
// client), and a dead pod out of the picker's rotation within one scrape
// interval of its first connect error. The picker marks the pod down as
// that error is reported, so no pick that began after the report may
// choose it: the bound asserted is zero, measured from the report rather
// than from the failed attempt's end, which a loaded machine can separate
// by tens of milliseconds. Retries on fallbacks ranked before the error
// may still reach the pod; they are logged and bounded.
func TestChaosShort(t *testing.T) {
	r, err := Chaos(context.Background(), ChaosConfig{Duration: 6 * time.Second, Load: 0.5, DownMin: time.Second, DownMax: 2 * time.Second, Seed: 2})
	require.NoError(t, err)
	var sb strings.Builder
	require.NoError(t, WriteChaos(&sb, r))
	t.Log("\n" + sb.String())
	l := r.Load
	assert.Zero(t, l.Count(Truncated), "a stream must never end silently short")
	assert.Zero(t, l.Count(Lost), "errors before the first byte must be retried on a fallback")
	assert.Equal(t, len(l.Outcomes), l.Count(OK)+l.Count(Cut))
	require.Len(t, r.Kills, 3)
	for _, k := range r.Kills {
		assert.False(t, k.At.IsZero(), k.Pod)
		assert.False(t, k.RestartAt.IsZero(), k.Pod)
		if !k.FirstConnectError.IsZero() && !assert.False(t, k.MarkedDown.IsZero(), "%s: a connect error seen but never reported", k.Pod) {
			logTraffic(t, r, k)
		}
		if k.MarkedDown.After(k.RestartAt) {
			t.Logf("%s: its first connect error reached Done %v after the restart", k.Pod, k.MarkedDown.Sub(k.RestartAt))
		}
		assert.Zero(t, k.Picks, "%s: picks begun after its mark-down chose it", k.Pod)
		assert.Less(t, k.OutOfRotation(), time.Second, "%s kept receiving traffic", k.Pod)
		if k.Retries > 0 {
			// The router retries on the fallbacks chosen with the pick; it
			// skips those marked down, but one checked just before the
			// mark is still sent.
			t.Logf("%s: %d retries on stale fallbacks after its mark-down; traffic up to %v after its first connect error",
				k.Pod, k.Retries, k.OutOfRotation())
		}
	}
}

// logTraffic logs what the gateway sent to k's pod and what its picker
// accounted for it, from the kill on, for a failed chaos check.
func logTraffic(t *testing.T, r *ChaosResult, k Kill) {
	t.Helper()
	for _, a := range r.Attempts {
		if a.Address == k.Address && !a.End.Before(k.At) {
			t.Logf("%s attempt: sent %v after the kill, ended %v after, connect error %t %q",
				k.Pod, a.At.Sub(k.At), a.End.Sub(k.At), a.ConnectError, a.Err)
		}
	}
	for _, c := range r.Completions {
		if c.Address == k.Address && !c.At.Before(k.At) {
			t.Logf("%s accounted %v after the kill: dispatch %t, retry %t, ok %t, connect error %t",
				k.Pod, c.At.Sub(k.At), c.Dispatch, c.Retry, c.OK, c.ConnectError)
		}
	}
}

// TestOverloadShort offers twice the capacity of an H100 + L4 fleet for 5
// seconds: 30% critical, 70% sheddable.
func TestOverloadShort(t *testing.T) {
	r, err := Overload(context.Background(), OverloadConfig{Duration: 5 * time.Second, Seed: 4})
	require.NoError(t, err)
	var sb strings.Builder
	require.NoError(t, WriteOverload(&sb, r))
	t.Log("\n" + sb.String())
	shed, critical := 0, 0
	for _, o := range r.Load.Outcomes {
		switch o.Priority {
		case 1:
			critical++
			assert.Equal(t, OK, o.Status, "critical request %d: %v", o.Index, o.Err)
		case -1:
			assert.Contains(t, []Status{OK, Shed}, o.Status, "sheddable request %d: %v", o.Index, o.Err)
			if o.Status == Shed {
				shed++
				assert.Equal(t, 429, o.HTTPStatus)
				secs, err := strconv.Atoi(o.RetryAfter)
				assert.NoError(t, err, "Retry-After %q", o.RetryAfter)
				assert.Positive(t, secs)
			}
		}
	}
	assert.Positive(t, critical)
	assert.Positive(t, shed, "at twice the capacity some sheddable requests must be shed")
	require.NotEmpty(t, r.Samples)
	g, h := r.Peaks()
	// Bounds: a few goroutines per request in flight (client, gateway,
	// pod) for a few hundred requests, and far less heap than an
	// unbounded queue of 7 KB prompts would take.
	assert.Less(t, g, 3000, "peak goroutines")
	assert.Less(t, h, uint64(256<<20), "peak heap in use")
}

func TestCompletionBody(t *testing.T) {
	shared := workload.Request{Blocks: []uint64{1, 2, 3}, BlockTokens: 16, PromptTokens: 40, OutputTokens: 5}
	other := workload.Request{Blocks: []uint64{1, 2, 9}, BlockTokens: 16, PromptTokens: 40, OutputTokens: 5}
	h := prefix.NewHasher(prefix.HashConfig{})
	hash := func(r workload.Request, uniq uint64) ([]uint64, int) {
		b := completionBody("m", &r, uniq)
		hs, n, err := h.HashBody(nil, "m", "", b)
		require.NoError(t, err)
		return hs, n
	}
	a, n := hash(shared, 1)
	assert.Equal(t, 40*4, n, "4 bytes per prompt token")
	// 160 bytes: two full 64-byte hash blocks.
	require.Len(t, a, 2)
	b, _ := hash(shared, 2)
	assert.Equal(t, a, b, "equal blocks, equal text, whatever the request")
	c, _ := hash(other, 1)
	assert.Equal(t, a[:2], c[:2], "the first two content blocks are shared")

	tail := workload.Request{Blocks: []uint64{1}, BlockTokens: 16, PromptTokens: 48, OutputTokens: 1}
	x, _ := hash(tail, 1)
	y, _ := hash(tail, 2)
	require.Len(t, x, 3)
	assert.Equal(t, x[0], y[0])
	assert.NotEqual(t, x[1], y[1], "text past the blocks is unique to the request")
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{2}, Summary{N: 1, Mean: 2, P50: 2, P90: 2, P99: 2}},
		// Nearest rank: p50 of 1..10 is the 5th, p90 the 9th, p99 the 10th.
		{"ten", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, Summary{N: 10, Mean: 5.5, P50: 5, P90: 9, P99: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, Summarize(tt.in)) })
	}
}

func TestKillOutOfRotation(t *testing.T) {
	t0 := time.Unix(100, 0)
	tests := []struct {
		name string
		k    Kill
		want time.Duration
	}{
		{"no traffic", Kill{}, 0},
		{"one attempt", Kill{FirstConnectError: t0, LastAttempt: t0}, 0},
		{"kept sending", Kill{FirstConnectError: t0, LastAttempt: t0.Add(30 * time.Millisecond)}, 30 * time.Millisecond},
		{"attempt before the error", Kill{FirstConnectError: t0, LastAttempt: t0.Add(-time.Millisecond)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.k.OutOfRotation())
			// The same arithmetic on picks, from the mark-down.
			p := Kill{MarkedDown: tt.k.FirstConnectError, LastPick: tt.k.LastAttempt}
			assert.Equal(t, tt.want, p.PickOutOfRotation())
		})
	}
}
