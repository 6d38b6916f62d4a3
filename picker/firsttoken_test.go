package picker

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// assertBalanced checks that every StartPrefill and Dispatch on ep was
// ended exactly once. Prefilling and InFlight never read below zero, so a
// second end would read zero like a correct one: count one more prefill and
// dispatch, which an extra end would have absorbed.
func assertBalanced(t *testing.T, ep *signals.Endpoint) {
	t.Helper()
	ep.StartPrefill(5)
	ep.Dispatch(5)
	n, tok := ep.Prefilling()
	assert.EqualValues(t, 1, n, "%s: prefills started and ended do not balance", ep.Name)
	assert.EqualValues(t, 5, tok, ep.Name)
	assert.EqualValues(t, 1, ep.InFlight(), "%s: dispatches and completions do not balance", ep.Name)
	ep.EndPrefill(5)
	ep.Complete(5)
}

func TestFirstTokenEndsPrefill(t *testing.T) {
	a := ep("a", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a})
	ctx := context.Background()

	// A pick counts the request as prefilling with its uncached tokens;
	// FirstToken takes it out while it still counts as in flight.
	res, err := p.Pick(ctx, &signals.Request{PromptTokens: 700})
	require.NoError(t, err)
	n, tok := a.Prefilling()
	assert.EqualValues(t, 1, n)
	assert.EqualValues(t, 700, tok)
	res.FirstToken()
	res.FirstToken() // a second call is a no-op
	n, tok = a.Prefilling()
	assert.Zero(t, n)
	assert.Zero(t, tok)
	assert.EqualValues(t, 1, a.InFlight())
	res.Done(DoneInfo{})
	assertBalanced(t, a) // Done after FirstToken must not end the prefill twice

	// Without FirstToken, Done ends the prefill.
	res, err = p.Pick(ctx, &signals.Request{PromptTokens: 300})
	require.NoError(t, err)
	res.Done(DoneInfo{})
	n, tok = a.Prefilling()
	assert.Zero(t, n)
	assert.Zero(t, tok)
	res.FirstToken() // after Done: a no-op
	assertBalanced(t, a)

	// A late FirstToken of a finished pick must not end the prefill of the
	// pick that reuses its record.
	old, err := p.Pick(ctx, &signals.Request{PromptTokens: 100})
	require.NoError(t, err)
	old.Done(DoneInfo{})
	cur, err := p.Pick(ctx, &signals.Request{PromptTokens: 200})
	require.NoError(t, err)
	old.FirstToken()
	n, tok = a.Prefilling()
	assert.EqualValues(t, 1, n, "stale FirstToken must not touch the new pick")
	assert.EqualValues(t, 200, tok)
	cur.Done(DoneInfo{})

	// The Result of a failed pick has nothing to end.
	empty, _ := newPicker(t, Config{}, nil)
	res, err = empty.Pick(ctx, nil)
	require.Error(t, err)
	res.FirstToken()
}

// TestFirstTokenRacesDone runs FirstToken and Done of the same picks on
// different goroutines (as a proxy's response reader and its handler may)
// under -race: every prefill is ended exactly once.
func TestFirstTokenRacesDone(t *testing.T) {
	a, b := ep("a", 0, 0, 0), ep("b", 0, 0, 0)
	p, _ := newPicker(t, Config{}, []*signals.Endpoint{a, b})
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				res, err := p.Pick(ctx, &signals.Request{PromptTokens: 64})
				if !assert.NoError(t, err) {
					return
				}
				var both sync.WaitGroup
				both.Add(2)
				go func() { defer both.Done(); res.FirstToken() }()
				go func() { defer both.Done(); res.Done(DoneInfo{}) }()
				both.Wait()
			}
		}()
	}
	wg.Wait()
	assertBalanced(t, a)
	assertBalanced(t, b)
}
