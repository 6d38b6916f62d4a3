package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/signals"
)

// fakeInspector serves real engines to the oracle.
type fakeInspector struct {
	pods    map[*signals.Endpoint]policy.PodView
	current *signals.Request
	ereq    *engine.Request
}

func (f *fakeInspector) Pod(ep *signals.Endpoint) (policy.PodView, bool) {
	v, ok := f.pods[ep]
	return v, ok
}

func (f *fakeInspector) EngineRequest(req *signals.Request) *engine.Request {
	if req != f.current {
		return nil
	}
	return f.ereq
}

func h100(t *testing.T) *engine.Engine {
	t.Helper()
	p, ok := engine.ProfileByName("h100-llama3-8b")
	require.True(t, ok)
	return engine.New(engine.DefaultConfig(p))
}

// drain runs e until idle.
func drain(e *engine.Engine) {
	var now time.Duration
	var evs []engine.Event
	for {
		d, ok := e.StartStep(now)
		if !ok {
			return
		}
		now += d
		evs = e.FinishStep(now, evs[:0])
	}
}

func TestOracleNeedsInspector(t *testing.T) {
	_, err := policy.NewOracle(policy.Env{})
	require.ErrorIs(t, err, policy.ErrNoInspector)
}

func TestOracle(t *testing.T) {
	tests := []struct {
		name string
		// setup prepares the two engines; the oracle must choose want.
		setup func(busy, idle *engine.Engine)
		req   engine.Request
		want  int
	}{
		{
			name: "queue ahead",
			setup: func(e0, _ *engine.Engine) {
				for i := range 40 {
					e0.Add(0, &engine.Request{ID: uint64(100 + i), PromptTokens: 4000, OutputTokens: 200})
				}
			},
			req:  engine.Request{ID: 1, PromptTokens: 1000, OutputTokens: 10},
			want: 1,
		},
		{
			name: "prefix cache beats an idle pod",
			setup: func(e0, _ *engine.Engine) {
				e0.Add(0, &engine.Request{ID: 2, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, BlockTokens: 1024, PromptTokens: 8192, OutputTokens: 1})
				drain(e0)
			},
			req:  engine.Request{ID: 3, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, BlockTokens: 1024, PromptTokens: 8200, OutputTokens: 10},
			want: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eps := endpoints(2)
			engs := []*engine.Engine{h100(t), h100(t)}
			tt.setup(engs[0], engs[1])
			insp := &fakeInspector{pods: map[*signals.Endpoint]policy.PodView{}}
			for i, ep := range eps {
				insp.pods[ep] = policy.PodView{Engine: engs[i], Config: engs[i].Config()}
			}
			p, err := policy.Default().New(policy.Oracle, policy.Env{Endpoints: eps, Seed: 1, Inspector: insp})
			require.NoError(t, err)
			req := &signals.Request{PromptTokens: tt.req.PromptTokens}
			insp.current, insp.ereq = req, &tt.req
			i, done := pickIndex(t, p, eps, req)
			assert.Equal(t, tt.want, i)
			done(signals.Outcome{})
		})
	}
}

func TestOracleIdleTiesSpreadByInFlight(t *testing.T) {
	eps := endpoints(2)
	insp := &fakeInspector{pods: map[*signals.Endpoint]policy.PodView{}}
	for _, ep := range eps {
		e := h100(t)
		insp.pods[ep] = policy.PodView{Engine: e, Config: e.Config()}
	}
	p, err := policy.NewOracle(policy.Env{Endpoints: eps, Seed: 1, Inspector: insp})
	require.NoError(t, err)
	// Two idle, identical pods predict the same TTFT: the second request
	// goes where the first did not (fewer in flight).
	r1 := &signals.Request{PromptTokens: 100}
	insp.current, insp.ereq = r1, &engine.Request{ID: 1, PromptTokens: 100, OutputTokens: 5}
	a, _ := pickIndex(t, p, eps, r1)
	r2 := &signals.Request{PromptTokens: 100}
	insp.current, insp.ereq = r2, &engine.Request{ID: 2, PromptTokens: 100, OutputTokens: 5}
	b, _ := pickIndex(t, p, eps, r2)
	assert.Equal(t, 1-a, b)
}
