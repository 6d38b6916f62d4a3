package signals_test

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestKnown(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want signals.Reading
	}{
		{0, signals.Reading{Value: 0, Known: true}},
		{-2, signals.Reading{Value: -2, Known: true}},
		{math.NaN(), signals.Reading{}},
		{math.Inf(1), signals.Reading{}},
		{math.Inf(-1), signals.Reading{}},
	} {
		assert.Equal(t, tt.want, signals.Known(tt.in), "%v", tt.in)
	}
}

func TestConfidence(t *testing.T) {
	hl := 100 * time.Millisecond
	for _, tt := range []struct {
		age  time.Duration
		want float64
	}{
		{-time.Second, 1}, // clock skew: a scrape from the future is fresh
		{0, 1},
		{50 * time.Millisecond, 0.7071067811865476},
		{100 * time.Millisecond, 0.5},
		{300 * time.Millisecond, 0.125},
	} {
		assert.InEpsilon(t, tt.want, signals.Confidence(t0, t0.Add(tt.age), hl), 1e-4, "age %v", tt.age)
	}
	assert.Equal(t, 1.0, signals.Confidence(t0, t0.Add(time.Hour), 0), "no half-life: never ages")
}

func TestQueueDepthCorrectsTheScrape(t *testing.T) {
	hl := 100 * time.Millisecond
	tests := []struct {
		name       string
		waiting    float64
		dispatched int
		completed  int
		age        time.Duration
		want       float64
	}{
		{"fresh scrape, nothing since", 5, 0, 0, 0, 5},
		{"burst since the scrape counts at once", 5, 3, 0, 0, 8},
		{"completions since the scrape", 5, 3, 2, 0, 6},
		{"never below zero", 1, 0, 4, 0, 0},
		// One half-life: half the corrected scrape (5+3=8), half the local
		// in-flight count (3 dispatched, 0 done): 0.5·8 + 0.5·3.
		{"ageing blends toward local", 5, 3, 0, hl, 5.5},
		{"very old: local only", 5, 3, 0, 100 * hl, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := signalstest.Endpoint("a", signalstest.Load{Running: 0, Waiting: tt.waiting, KV: 0, ScrapedAt: t0})
			for i := 0; i < tt.dispatched; i++ {
				ep.Dispatch(10)
			}
			for i := 0; i < tt.completed; i++ {
				ep.Complete(10)
			}
			assert.InDelta(t, tt.want, ep.QueueDepth(t0.Add(tt.age), hl), 1e-9)
			q, ok := signals.QueueDepth{Staleness: signals.Staleness{Clock: signalstest.NewClock(t0.Add(tt.age)), HalfLife: hl}}.Value(nil, ep)
			assert.True(t, ok)
			assert.InDelta(t, tt.want, q, 1e-9, "the Signal agrees with the method")
		})
	}
}

func TestRunningWithoutScrapeIsLocal(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Address: "10.0.0.1:8000"})
	assert.Equal(t, "10.0.0.1:8000", ep.Name, "name defaults to the address")
	assert.Equal(t, "http://10.0.0.1:8000/metrics", ep.MetricsAddress())
	ep.Dispatch(1)
	ep.Dispatch(1)
	assert.Equal(t, 2.0, ep.RunningRequests(t0, time.Second))
	assert.Equal(t, 2.0, ep.QueueDepth(t0, time.Second))
	_, ok := ep.KVCacheUtilization(t0, time.Second)
	assert.False(t, ok, "KV is unknown without a scrape, never zero")
}

func TestKVCacheUtilization(t *testing.T) {
	hl := 100 * time.Millisecond
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "a"})
	ep.SetMetrics(&signals.Metrics{ScrapedAt: t0, KVCacheUtilization: signals.Known(0.25)})
	u, ok := ep.KVCacheUtilization(t0, hl)
	require.True(t, ok)
	assert.Equal(t, 0.25, u, "without a cache size the scrape is used as is")

	// 1000 blocks × 16 tokens = 16000 tokens of capacity.
	ep.SetMetrics(&signals.Metrics{ScrapedAt: t0, Baseline: ep.Counters(),
		KVCacheUtilization: signals.Known(0.25), BlockSize: 16, NumBlocks: 1000})
	ep.Dispatch(4000)
	u, _ = ep.KVCacheUtilization(t0, hl)
	assert.InDelta(t, 0.5, u, 1e-12, "4000 tokens dispatched since: +0.25")
	u, _ = ep.KVCacheUtilization(t0.Add(hl), hl)
	assert.InDelta(t, 0.5*0.5+0.5*0.25, u, 1e-12, "halfway to local 4000/16000")

	for _, bad := range []float64{-1, 7} {
		ep.SetMetrics(&signals.Metrics{ScrapedAt: t0, KVCacheUtilization: signals.Known(bad)})
		u, ok := ep.KVCacheUtilization(t0, hl)
		assert.True(t, ok)
		assert.True(t, u >= 0 && u <= 1, "%v clamps into [0,1], got %v", bad, u)
	}
	ep.SetMetrics(&signals.Metrics{ScrapedAt: t0, KVCacheUtilization: signals.Known(math.NaN())})
	_, ok = ep.KVCacheUtilization(t0, hl)
	assert.False(t, ok, "NaN is unknown")
}

func TestLoRAResidency(t *testing.T) {
	tests := []struct {
		name    string
		m       *signals.Metrics
		adapter string
		recent  []string
		want    signals.Residency
	}{
		{"base model", nil, "", nil, signals.ResidencyRunning},
		{"no scrape", nil, "a", nil, signals.ResidencyUnknown},
		{"no lora metric", &signals.Metrics{}, "a", nil, signals.ResidencyUnknown},
		{"running", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b", "a"}, MaxLoRA: 2}, "a", nil, signals.ResidencyRunning},
		{"waiting", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b"}, WaitingAdapters: []string{"a"}, MaxLoRA: 1}, "a", nil, signals.ResidencyWaiting},
		{"free slot", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b"}, MaxLoRA: 2}, "a", nil, signals.ResidencyFreeSlot},
		{"empty lists", &signals.Metrics{LoRAKnown: true, MaxLoRA: 1}, "a", nil, signals.ResidencyFreeSlot},
		{"must evict", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b", "c"}, MaxLoRA: 2}, "a", nil, signals.ResidencyEvict},
		{"slots unknown", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b"}}, "a", nil, signals.ResidencyFreeSlot},
		{"routed here recently", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b"}, MaxLoRA: 1}, "a", []string{"a"}, signals.ResidencyRunning},
		{"recent others take the free slot", &signals.Metrics{LoRAKnown: true, RunningAdapters: []string{"b"}, MaxLoRA: 2}, "a", []string{"c"}, signals.ResidencyEvict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
			if tt.m != nil {
				ep.SetMetrics(tt.m)
			}
			for _, a := range tt.recent {
				ep.NoteAdapter(a, t0.Add(-time.Second))
			}
			assert.Equal(t, tt.want, ep.LoRAResidency(tt.adapter, t0))
			v, ok := signals.LoRAAffinity{Staleness: signals.Staleness{Clock: signalstest.NewClock(t0)}}.Value(&signals.Request{Adapter: tt.adapter}, ep)
			assert.Equal(t, tt.want != signals.ResidencyUnknown, ok)
			assert.Equal(t, float64(tt.want), v)
		})
	}
}

func TestRecentAdaptersExpireAndAreBounded(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	ep.NoteAdapter("a", t0)
	assert.Equal(t, signals.ResidencyRunning, ep.LoRAResidency("a", t0.Add(signals.AdapterRecency)))
	assert.Equal(t, signals.ResidencyUnknown, ep.LoRAResidency("a", t0.Add(signals.AdapterRecency+time.Nanosecond)))
	// More adapters than slots: the oldest are forgotten, nothing grows.
	for i := 0; i < 100; i++ {
		ep.NoteAdapter(string(rune('A'+i%50)), t0)
	}
	assert.Equal(t, signals.ResidencyRunning, ep.LoRAResidency(string(rune('A'+49)), t0))
}

func TestHealth(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	require.True(t, ep.Healthy())
	g := ep.Generation()
	boom := errors.New("boom")
	ep.ReportScrape(ep.HealthMark(), boom, 3)
	ep.ReportScrape(ep.HealthMark(), boom, 3)
	assert.True(t, ep.Healthy(), "two failures of three")
	ep.ReportScrape(ep.HealthMark(), boom, 3)
	assert.False(t, ep.Healthy())
	assert.Equal(t, g+1, ep.Generation(), "going down starts a generation")
	ep.ReportScrape(ep.HealthMark(), boom, 3)
	assert.Equal(t, g+1, ep.Generation(), "staying down does not")
	ep.ReportScrape(ep.HealthMark(), nil, 3)
	assert.True(t, ep.Healthy())
	ep.ReportConnectError()
	assert.False(t, ep.Healthy(), "a connect error is proof")
	ep.ReportSuccess(ep.HealthMark())
	assert.True(t, ep.Healthy())
	ep.MarkRestarted()
	assert.Equal(t, g+3, ep.Generation())
}

// TestHealthEvidenceOrder: a success brings an endpoint back only if its
// probe was sent after the last failure. A scrape answered just before a
// pod died, or a request that finished then, is reported after the
// router's connect error to the dead pod and must not put it back in
// rotation.
func TestHealthEvidenceOrder(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	scrape, request := ep.HealthMark(), ep.HealthMark() // probes sent while up
	ep.ReportConnectError()
	require.False(t, ep.Healthy())
	ep.ReportScrape(scrape, nil, 3)
	assert.False(t, ep.Healthy(), "a scrape sent before the connect error is older evidence")
	ep.ReportSuccess(request)
	assert.False(t, ep.Healthy(), "so is a request sent before it")

	// Failures while down still order the evidence.
	between := ep.HealthMark()
	ep.ReportConnectError()
	ep.ReportSuccess(between)
	assert.False(t, ep.Healthy(), "a probe sent between two failures predates the second")
	beforeScrape := ep.HealthMark()
	ep.ReportScrape(ep.HealthMark(), errors.New("boom"), 1)
	ep.ReportSuccess(beforeScrape)
	assert.False(t, ep.Healthy(), "a failed scrape advances the mark too")

	g := ep.Generation()
	fresh := ep.HealthMark()
	ep.ReportScrape(fresh, nil, 3)
	assert.True(t, ep.Healthy(), "a scrape sent after the last failure brings it back")
	ep.ReportSuccess(fresh)
	assert.True(t, ep.Healthy())
	assert.Equal(t, g, ep.Generation(), "coming back does not start a generation")
}

// TestHealthEvidenceOrderConcurrent races probes against failures: each
// goroutine reads the mark, fails the endpoint, then reports a success for
// the probe sent before its own failure. Every success is stale, so none may
// bring the endpoint back, whatever the interleaving (run under -race).
func TestHealthEvidenceOrderConcurrent(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				mark := ep.HealthMark()
				ep.MarkDown()
				ep.ReportSuccess(mark)
				if ep.Healthy() {
					t.Error("a stale success brought the endpoint back")
					return
				}
			}
		})
	}
	wg.Wait()
	assert.False(t, ep.Healthy())
	assert.Equal(t, uint64(8*2000), ep.HealthMark(), "every MarkDown advances the mark")
}

func TestThroughput(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	_, ok := ep.Throughput()
	assert.False(t, ok)
	ep.SetThroughput(1234.5)
	v, ok := ep.Throughput()
	assert.True(t, ok)
	assert.Equal(t, 1234.5, v)
	// Subnormal throughputs too: their reciprocal, the seconds per token
	// that scorers multiply by, would be infinite.
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1), 5e-324, 1e-310} {
		ep.SetThroughput(1234.5)
		ep.SetThroughput(bad)
		_, ok := ep.Throughput()
		assert.False(t, ok, "%v clears", bad)
		assert.Zero(t, ep.LoadAt(t0, 0).InvThroughput, "%v clears the inverse", bad)
	}
	ep.SetThroughput(1e-300)
	_, ok = ep.Throughput()
	assert.True(t, ok, "a tiny normal throughput is kept")
}

type halfMatcher struct{}

func (halfMatcher) Match(_ *signals.Request, eps []*signals.Endpoint, out []float64) {
	for i := range eps {
		out[i] = 0.5
	}
}

type fixedEstimator struct{ v float64 }

func (e fixedEstimator) PredictTTFT(_ *signals.Request, _ *signals.Endpoint, cached float64) (float64, bool) {
	return e.v * (1 - cached), true
}

func TestPrefixAndLatencySignals(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	req := &signals.Request{PromptBlocks: []uint64{1, 2, 3}}
	v, ok := signals.PrefixCacheHit{}.Value(req, ep)
	assert.True(t, ok)
	assert.Zero(t, v, "no matcher matches nothing")
	v, _ = signals.PrefixCacheHit{Matcher: signals.NoPrefixMatcher{}}.Value(req, ep)
	assert.Zero(t, v)
	v, _ = signals.PrefixCacheHit{Matcher: halfMatcher{}}.Value(req, ep)
	assert.Equal(t, 0.5, v)

	_, ok = signals.PredictedLatency{}.Value(req, ep)
	assert.False(t, ok, "no estimator: unknown")
	_, ok = signals.PredictedLatency{Estimator: signals.NoLatencyEstimator{}}.Value(req, ep)
	assert.False(t, ok)
	v, ok = signals.PredictedLatency{Matcher: halfMatcher{}, Estimator: fixedEstimator{2}}.Value(req, ep)
	assert.True(t, ok)
	assert.Equal(t, 1.0, v, "the estimator sees the prefix match")
	for _, bad := range []float64{math.NaN(), -1} {
		_, ok = signals.PredictedLatency{Estimator: fixedEstimator{bad}}.Value(req, ep)
		assert.False(t, ok, "%v is not a prediction", bad)
	}
}

func TestKVSignal(t *testing.T) {
	ep := signalstest.Endpoint("a", signalstest.Load{Running: 1, Waiting: 0, KV: 0.4, ScrapedAt: t0})
	v, ok := signals.KVCacheUtilization{Staleness: signals.Staleness{Clock: signalstest.NewClock(t0)}}.Value(nil, ep)
	assert.True(t, ok)
	assert.Equal(t, 0.4, v)
	r, ok := signals.RunningRequests{}.Value(nil, ep)
	assert.True(t, ok)
	assert.Equal(t, 1.0, r)
}

func TestRecentDispatchesDecay(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	assert.Zero(t, ep.RecentDispatches(t0))
	ep.NoteDispatch(t0)
	ep.NoteDispatch(t0)
	for _, tt := range []struct {
		age  time.Duration
		want float64
	}{
		{0, 2},
		{signals.BurstHalfLife, 1},
		{2 * signals.BurstHalfLife, 0.5},
		{-time.Second, 2}, // a clock that steps back does not inflate the count
	} {
		assert.InEpsilon(t, tt.want, ep.RecentDispatches(t0.Add(tt.age)), 1e-3, "age %v", tt.age)
	}
	ep.NoteDispatch(t0.Add(signals.BurstHalfLife))
	assert.InEpsilon(t, 2, ep.RecentDispatches(t0.Add(signals.BurstHalfLife)), 1e-3, "1 decayed + 1 new")
}

// TestRecentDispatchesLongIdle: a dispatch long ago counts as fully
// decayed, however long ago, including past 2^31 ms (about 24.8 days) where
// a signed millisecond age wraps negative.
func TestRecentDispatchesLongIdle(t *testing.T) {
	const day = 24 * time.Hour
	for _, idle := range []time.Duration{
		2 * time.Minute, time.Hour, 24 * day, 25 * day, 30 * day, 40 * day, 49 * day,
		(1<<31 - 1) * time.Millisecond, 1 << 31 * time.Millisecond,
	} {
		ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
		ep.NoteDispatch(t0)
		assert.Zero(t, ep.RecentDispatches(t0.Add(idle)), "idle %v", idle)
		assert.Zero(t, ep.LoadAt(t0.Add(idle), 0).Recent, "Load.Recent, idle %v", idle)
		ep.NoteDispatch(t0.Add(idle))
		assert.Equal(t, 1.0, ep.RecentDispatches(t0.Add(idle)), "a new dispatch after idle %v counts alone", idle)
	}

	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	ep.NoteDispatch(t0)
	assert.Equal(t, 1.0, ep.RecentDispatches(t0.Add(-100*time.Second)), "a clock slightly behind")
	assert.Zero(t, ep.RecentDispatches(t0.Add(-200*time.Second)), "a clock stepped far back")
}

func TestRequestsCorrectsTheSumOnce(t *testing.T) {
	hl := 100 * time.Millisecond
	ep := signalstest.Endpoint("a", signalstest.Load{Running: 5, Waiting: 3, KV: 0, ScrapedAt: t0})
	ep.Dispatch(0)
	ep.Dispatch(0)
	// 3 waiting + 5 running + 2 dispatched since, counted once (QueueDepth
	// and RunningRequests would each add the 2).
	assert.InDelta(t, 10, ep.Requests(t0, hl), 1e-9)
	assert.InDelta(t, 0.5*10+0.5*2, ep.Requests(t0.Add(hl), hl), 1e-9, "fades toward the 2 in flight")

	onlyRunning := signals.NewEndpoint(signals.EndpointSpec{Name: "r"})
	onlyRunning.SetMetrics(&signals.Metrics{ScrapedAt: t0, Running: signals.Known(4)})
	assert.InDelta(t, 4, onlyRunning.Requests(t0, hl), 1e-9, "a server without a queue gauge")

	unscraped := signals.NewEndpoint(signals.EndpointSpec{Name: "u"})
	unscraped.Dispatch(0)
	assert.Equal(t, 1.0, unscraped.Requests(t0, hl), "before any scrape: the local count")
}

// TestProtocolErrorsMarkDownInARow: a malformed response leaves the
// endpoint up and its cache generation alone, ProtocolErrorThreshold of
// them in a row mark it down, a successful request resets the count, and
// a successful scrape brings the endpoint back without resetting it, so
// the next malformed response marks it down again at once.
func TestProtocolErrorsMarkDownInARow(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	g := ep.Generation()
	for i := 1; i < signals.ProtocolErrorThreshold; i++ {
		ep.ReportProtocolError()
		require.True(t, ep.Healthy(), "after %d malformed responses", i)
	}
	assert.Equal(t, g, ep.Generation(), "the cache is not forgotten for a bad answer")
	ep.ReportSuccess(ep.HealthMark())
	for i := 1; i < signals.ProtocolErrorThreshold; i++ {
		ep.ReportProtocolError()
		require.True(t, ep.Healthy(), "a success reset the count; %d since", i)
	}
	ep.ReportProtocolError()
	require.False(t, ep.Healthy(), "%d in a row mark it down", signals.ProtocolErrorThreshold)
	assert.Equal(t, g+1, ep.Generation())

	ep.ReportScrape(ep.HealthMark(), nil, 3)
	require.True(t, ep.Healthy(), "a scrape brings it back")
	ep.ReportProtocolError()
	assert.False(t, ep.Healthy(), "but does not reset the count")
	ep.ReportScrape(ep.HealthMark(), nil, 3)
	ep.ReportSuccess(ep.HealthMark())
	ep.ReportProtocolError()
	assert.True(t, ep.Healthy(), "a served request does")
}

// TestServerErrorsCountWithProtocolErrors: 5xx answers count towards the
// same threshold as malformed ones, in any mix, and a served request
// resets both.
func TestServerErrorsCountWithProtocolErrors(t *testing.T) {
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e"})
	for i := 1; i < signals.ProtocolErrorThreshold; i++ {
		ep.ReportServerError()
		require.True(t, ep.Healthy(), "after %d 5xx answers", i)
	}
	ep.ReportSuccess(ep.HealthMark())
	for i := 1; i < signals.ProtocolErrorThreshold; i++ {
		if i%2 == 0 {
			ep.ReportProtocolError()
		} else {
			ep.ReportServerError()
		}
		require.True(t, ep.Healthy(), "a success reset the count; %d since", i)
	}
	ep.ReportServerError()
	assert.False(t, ep.Healthy(), "%d answers that served nothing, in a row", signals.ProtocolErrorThreshold)
}
