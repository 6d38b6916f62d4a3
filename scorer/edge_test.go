package scorer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

func edgeInput(req *signals.Request, eps ...*signals.Endpoint) *scorer.Input {
	var in scorer.Input
	in.Reset(req, append([]*signals.Endpoint(nil), eps...), t0)
	n := len(eps)
	in.Cached = make([]float64, n)
	in.Raw = make([]float64, n)
	return &in
}

// TestBurstScorerExtremeThroughputs: BurstScorer implements
// Normalized, promising scores in [0, 1] and never NaN, also with
// throughputs SetThroughput accepts whose ratio overflows (1e300 and 1e-10
// tokens/s), where an endpoint with no recent dispatch computed
// 0 × Inf = NaN.
func TestBurstScorerExtremeThroughputs(t *testing.T) {
	fast := ep("fast", 0, 0, 0)
	slow := ep("slow", 0, 0, 0)
	fast.SetThroughput(1e300)
	slow.SetThroughput(1e-10)
	_, okFast := fast.Throughput()
	_, okSlow := slow.Throughput()
	require.True(t, okFast && okSlow, "both throughputs are accepted")

	in := edgeInput(&signals.Request{}, fast, slow)
	out := make([]float64, 2)
	scorer.BurstScorer{}.Score(context.Background(), in, out)
	for i, v := range out {
		assert.True(t, v >= 0 && v <= 1, "burst score %d = %v (raw %v)", i, v, in.Raw[i])
	}
}

// flipEstimator predicts, for endpoint "a", first[a] on its first
// call and then[a] on every later call; other endpoints always then[name].
// It stands for latency.Predictor, whose TTFT predictions grow as
// concurrent picks dispatch to an endpoint (its in-flight and prefill
// counters are live features), between the SLO filter's two passes.
type flipEstimator struct {
	mu    sync.Mutex
	calls map[string]int
	first map[string]float64
	then  map[string]float64
}

func (e *flipEstimator) PredictTTFT(_ *signals.Request, ep *signals.Endpoint, _ float64) (float64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[ep.Name]++
	if v, ok := e.first[ep.Name]; ok && e.calls[ep.Name] == 1 {
		return v, true
	}
	return e.then[ep.Name], true
}

// TestSLOFilterEmptiesWhenPredictionsMove: SLOFilter documents that
// it "returns an empty slice only for empty input" and otherwise fails open
// to the endpoint closest to the objective, also when a prediction changes
// while the filter runs (a concurrent dispatch raised it). Judging each
// endpoint twice, a read-only pass then a compacting one, it could find a
// keeper in the first and keep nothing in the second.
func TestSLOFilterEmptiesWhenPredictionsMove(t *testing.T) {
	est := &flipEstimator{
		calls: map[string]int{},
		first: map[string]float64{"a": 0.1},
		then:  map[string]float64{"a": 0.3, "b": 0.5},
	}
	f, err := scorer.NewSLOFilter(scorer.DefaultSLOParams(), scorer.Env{Estimator: est})
	require.NoError(t, err)
	eps := latEndpoints("a", "b")
	req := &signals.Request{SLO: signals.SLO{TTFT: 200 * time.Millisecond}}
	got := f.Filter(context.Background(), &scorer.Input{Request: req, Endpoints: eps})
	assert.NotEmpty(t, got, "a non-empty pool must never be filtered to nothing")
}

// TestPrefixYieldWithStaleOverflowingScrape: an endpoint whose last
// scrape reported huge but finite queue and batch sizes (each accepted by
// signals.Known) summed them to +Inf requests, which a scrape old enough to
// have no confidence turned into 0 × Inf = NaN; the prefix scorer's min
// over the loads would then be NaN and no candidate ever "over" the yield
// margins. A pod 100 requests deeper than an idle one must yield.
func TestPrefixYieldWithStaleOverflowingScrape(t *testing.T) {
	hot := ep("hot", 100, 0, 0) // holds the prefix, 100 requests running
	idle := ep("idle", 0, 0, 0)
	stale := signals.NewEndpoint(signals.EndpointSpec{Name: "stale"})
	stale.SetMetrics(&signals.Metrics{ScrapedAt: t0.Add(-time.Hour), Baseline: stale.Counters(),
		Waiting: signals.Known(1e308), Running: signals.Known(1e308)})

	hl := 2 * time.Second
	r := stale.Requests(t0, hl)
	assert.False(t, math.IsNaN(r), "Endpoint.Requests of a scrape an hour old is NaN")

	s, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), scorer.Env{HalfLife: hl})
	require.NoError(t, err)

	score := func(eps ...*signals.Endpoint) []float64 {
		in := edgeInput(&signals.Request{PromptBlocks: []uint64{1}}, eps...)
		in.Cached[0] = 1   // hot holds the whole prompt
		in.Cached[1] = 0.5 // idle half of it: a hit there when hot yields
		out := make([]float64, len(eps))
		s.Score(context.Background(), in, out)
		return out
	}
	without := score(hot, idle)
	require.Equal(t, 0.0, without[0], "hot yields its affinity to the idle pod: %v", without)
	with := score(hot, idle, stale)
	assert.Equal(t, 0.0, with[0], "a third, stale endpoint must not stop hot from yielding: %v", with)
}

// TestSLOAdmitterNeverShedsPriorityAtLeastZero: with every endpoint
// confidently predicted far over the objective and over ShedTTFTMs, the
// admitter sheds priority < 0 and always admits priority 0 and above
// .
func TestSLOAdmitterNeverShedsPriorityAtLeastZero(t *testing.T) {
	est := &latFakeEstimator{ttft: map[string]float64{"a": 5, "b": 9}, tpot: map[string]float64{"a": 1, "b": 1}}
	p := scorer.DefaultSLOParams()
	p.ShedTTFTMs = 10
	a, err := scorer.NewSLOAdmitter(p, scorer.Env{Estimator: est})
	require.NoError(t, err)
	for _, slo := range []signals.SLO{{}, {TTFT: time.Millisecond}, {TPOT: time.Millisecond}, {TTFT: -time.Second}} {
		for _, prio := range []int{math.MinInt, -1, 0, 1, math.MaxInt} {
			req := &signals.Request{Priority: prio, SLO: slo}
			ok, reason := a.Admit(context.Background(), &scorer.Input{Request: req, Endpoints: latEndpoints("a", "b")})
			if prio >= 0 {
				assert.True(t, ok, "priority %d slo %+v shed: %s", prio, slo, reason)
			} else if slo.TTFT > 0 || slo.TPOT > 0 || slo == (signals.SLO{}) {
				assert.False(t, ok, "priority %d slo %+v admitted", prio, slo)
				assert.NotEmpty(t, reason)
			}
		}
	}
}

// TestNormalizedScorersExtremeThroughputRatio is TestNormalizedPromise
// for throughputs whose ratio overflows, on the other Normalized scorers
// that read throughput.
func TestNormalizedScorersExtremeThroughputRatio(t *testing.T) {
	prefill, err := scorer.NewPrefillScorer(scorer.DefaultPrefillParams())
	require.NoError(t, err)
	for name, s := range map[string]scorer.Scorer{"token-load": scorer.TokenLoadScorer{}, "prefill": prefill} {
		fast, slow, none := ep("fast", 0, 0, 0), ep("slow", 0, 0, 0), ep("none", 0, 0, 0)
		fast.SetThroughput(math.MaxFloat64)
		slow.SetThroughput(1e-300)
		for _, e := range []*signals.Endpoint{fast, slow, none} {
			e.Dispatch(1 << 30)
			e.StartPrefill(1 << 30)
		}
		in := edgeInput(&signals.Request{PromptTokens: math.MaxInt32}, fast, slow, none)
		out := make([]float64, 3)
		s.Score(context.Background(), in, out)
		for i, v := range out {
			assert.True(t, v >= 0 && v <= 1, "%s score %d = %v", name, i, v)
		}
	}
}

// TestInputMemoFollowsArbitraryKeeps reuses one Input over many picks
// whose filters keep random subsets in random orders (new slices and
// in-place compactions), and checks that the column-based scorers then
// report each candidate's own load, never another's.
func TestInputMemoFollowsArbitraryKeeps(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pool := make([]*signals.Endpoint, 12)
	for i := range pool {
		pool[i] = ep(fmt.Sprintf("e%d", i), float64(i), float64(10*i+1), float64(i)/20)
	}
	hl := 2 * time.Second
	var in scorer.Input
	q := &scorer.QueueScorer{HalfLife: hl}
	for trial := 0; trial < 500; trial++ {
		n := 1 + rng.IntN(len(pool))
		eps := append([]*signals.Endpoint(nil), pool...)
		rng.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
		eps = eps[:n]
		in.Reset(&signals.Request{}, eps, t0)
		for step := 0; step < 3; step++ {
			if rng.IntN(2) == 0 {
				in.Loads(hl) // a filter that reads loads
			} else if len(in.Endpoints) > 0 {
				in.Load(rng.IntN(len(in.Endpoints)), hl)
			}
			m := 1 + rng.IntN(len(in.Endpoints))
			var kept []*signals.Endpoint
			switch rng.IntN(3) {
			case 0: // in place, order kept
				idx := rng.Perm(len(in.Endpoints))[:m]
				slices.Sort(idx)
				for j, i := range idx {
					in.Endpoints[j] = in.Endpoints[i]
				}
				kept = in.Endpoints[:m]
			case 1: // a new slice in another order
				for _, i := range rng.Perm(len(in.Endpoints))[:m] {
					kept = append(kept, in.Endpoints[i])
				}
			default: // a tail sub-slice
				kept = in.Endpoints[len(in.Endpoints)-m:]
			}
			in.Keep(kept)
		}
		k := len(in.Endpoints)
		in.Raw = make([]float64, k)
		out := make([]float64, k)
		q.Score(context.Background(), &in, out)
		for i, e := range in.Endpoints {
			require.Equal(t, e.QueueDepth(t0, hl), in.Raw[i], "trial %d: raw queue of %s", trial, e.Name)
		}
		loads := in.Loads(hl)
		for i, e := range in.Endpoints {
			require.Equal(t, e.LoadAt(t0, hl), loads[i], "trial %d: load of %s", trial, e.Name)
		}
	}
}
