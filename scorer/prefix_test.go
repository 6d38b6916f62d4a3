package scorer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

var pxT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pxEndpoints returns endpoints with the given numbers of requests in
// flight and no scrape, so their load is exactly that number.
func pxEndpoints(loads ...int) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, len(loads))
	for i, l := range loads {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("pod-%d", i)})
		for j := 0; j < l; j++ {
			eps[i].Dispatch(0)
		}
	}
	return eps
}

func TestPrefixScorerScores(t *testing.T) {
	def := scorer.DefaultPrefixParams()
	tests := []struct {
		name   string
		params scorer.PrefixParams
		loads  []int
		cached []float64
		want   []float64
	}{
		{"hit: longest prefix 1, shorter ones partial credit", def,
			[]int{1, 0, 0}, []float64{0.9, 0.3, 0}, []float64{1, 0.25 / 3, 0}},
		{"equal holders tie", def,
			[]int{2, 0, 2}, []float64{0.8, 0.8, 0.8}, []float64{1, 1, 1}},
		{"within tolerance counts as holding", def,
			[]int{0, 0, 0}, []float64{0.8, 0.79, 0.7}, []float64{1, 1, 0.25 * 0.7 / 0.8}},
		{"yields over both margins", def,
			// lmin 2: over means > 2+4 and > 2×1.5.
			[]int{10, 2, 3}, []float64{0.9, 0.3, 0}, []float64{0, 1, 0}},
		{"absolute margin alone does not yield", def,
			// lmin 14: 20 > 18 but not > 21.
			[]int{20, 14, 14}, []float64{0.9, 0.3, 0}, []float64{1, 0.25 / 3, 0}},
		{"relative margin alone does not yield", def,
			// lmin 1: 3 > 1.5 but not > 5.
			[]int{3, 1, 1}, []float64{0.9, 0.3, 0}, []float64{1, 0.25 / 3, 0}},
		{"a miss prefers nobody: the load scorers spread it", def,
			[]int{2, 0, 1}, []float64{0, 0, 0}, []float64{1, 1, 1}},
		{"miss with equal loads prefers nobody", def,
			[]int{1, 1, 1, 1}, []float64{0, 0, 0, 0}, []float64{1, 1, 1, 1}},
		{"a match below minMatch is a miss", def,
			[]int{0, 0, 0}, []float64{0.04, 0, 0}, []float64{1, 1, 1}},
		{"the only holder yields: a miss, which prefers nobody", def,
			// pod 0 is over (9 > 4 and 9 > 0).
			[]int{9, 0, 2}, []float64{0.9, 0, 0}, []float64{1, 1, 1}},
		{"a miss does not turn the loaded away: the load scorers do", def,
			[]int{40, 0, 3}, []float64{0, 0, 0}, []float64{1, 1, 1}},
		{"zero margins yield to any load difference",
			scorer.PrefixParams{MinMatch: 0.05, PartialCredit: 1},
			[]int{1, 0, 0}, []float64{0.9, 0.45, 0}, []float64{0, 1, 0}},
		{"full partial credit scores by share", scorer.PrefixParams{PartialCredit: 1, YieldAbsolute: 4, YieldRelative: 0.5},
			[]int{0, 0, 0}, []float64{0.8, 0.2, 0}, []float64{1, 0.25, 0}},
		{"minMatch 0 counts any hit", scorer.PrefixParams{YieldAbsolute: 4, YieldRelative: 0.5},
			[]int{0, 0}, []float64{0.01, 0}, []float64{1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := scorer.NewPrefixScorer(tc.params, scorer.Env{})
			require.NoError(t, err)
			eps := pxEndpoints(tc.loads...)
			raw := make([]float64, len(eps))
			for i := range raw {
				raw[i] = math.NaN()
			}
			in := &scorer.Input{Endpoints: eps, Now: pxT0, Cached: tc.cached, Raw: raw}
			out := make([]float64, len(eps))
			s.Score(context.Background(), in, out)
			assert.InDeltaSlice(t, tc.want, out, 1e-12)
			assert.Equal(t, tc.cached, raw, "raw values are the cached fractions")
		})
	}
}

func TestPrefixScorerNoMatcher(t *testing.T) {
	s, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), scorer.Env{})
	require.NoError(t, err)
	eps := pxEndpoints(2, 0, 1)
	out := make([]float64, 3)
	s.Score(context.Background(), &scorer.Input{Endpoints: eps, Now: pxT0}, out)
	assert.InDeltaSlice(t, []float64{1, 1, 1}, out, 1e-12, "no Cached: a miss everywhere")
	s.Score(context.Background(), &scorer.Input{Now: pxT0}, nil)
}

func TestPrefixScorerLoadFromScrape(t *testing.T) {
	// Pod 0 holds the prompt, pod 1 a third of it; pods 1 and 2 carry 5
	// requests each. Pod 0 yields when its load exceeds 5 + 3 (pod 1's
	// shorter match is then the best): its load is read from the scrape,
	// corrected by the dispatches since and faded toward the local count.
	p := scorer.PrefixParams{MinMatch: 0.05, Tolerance: 0.02, PartialCredit: 0.25, YieldAbsolute: 3}
	s, err := scorer.NewPrefixScorer(p, scorer.Env{HalfLife: time.Second})
	require.NoError(t, err)
	eps := pxEndpoints(0, 5, 5)
	scraped := eps[0]
	scraped.Dispatch(0) // seen by the scrape
	scraped.SetMetrics(&signals.Metrics{
		ScrapedAt: pxT0,
		Baseline:  scraped.Counters(),
		Waiting:   signals.Reading{Value: 3, Known: true},
		Running:   signals.Reading{Value: 5, Known: true},
	})
	scraped.Dispatch(0) // two since the scrape
	scraped.Dispatch(0)
	tests := []struct {
		name string
		now  time.Time
		// pod 0's load: fresh 3+5+2 = 10 > 8, it yields; after one
		// half-life 0.5×10 + 0.5×3 in flight = 6.5 ≤ 8, it keeps the prompt.
		want []float64
	}{
		{"fresh scrape", pxT0, []float64{0, 1, 0}},
		{"one half-life old", pxT0.Add(time.Second), []float64{1, 0.25 * 0.3 / 0.9, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]float64, 3)
			s.Score(context.Background(), &scorer.Input{Endpoints: eps, Now: tc.now, Cached: []float64{0.9, 0.3, 0}}, out)
			assert.InDeltaSlice(t, tc.want, out, 1e-12)
		})
	}
}

func TestDefaultPrefixParams(t *testing.T) {
	assert.Equal(t, scorer.PrefixParams{MinMatch: 0.05, Tolerance: 0.02, PartialCredit: 0.25, YieldAbsolute: 4, YieldRelative: 0.5}, scorer.DefaultPrefixParams())
}

func TestPrefixParamsValidation(t *testing.T) {
	tests := []struct {
		name string
		p    scorer.PrefixParams
		ok   bool
	}{
		{"defaults", scorer.PrefixParams{MinMatch: 0.05, Tolerance: 0.02, PartialCredit: 0.25, YieldAbsolute: 4, YieldRelative: 0.5}, true},
		{"zero", scorer.PrefixParams{}, true},
		{"minMatch above 1", scorer.PrefixParams{MinMatch: 1.5}, false},
		{"negative absolute", scorer.PrefixParams{YieldAbsolute: -1}, false},
		{"NaN relative", scorer.PrefixParams{YieldRelative: math.NaN()}, false},
		{"infinite absolute", scorer.PrefixParams{YieldAbsolute: math.Inf(1)}, false},
		{"tolerance above 1", scorer.PrefixParams{Tolerance: 2}, false},
		{"negative partial credit", scorer.PrefixParams{PartialCredit: -0.1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := scorer.NewPrefixScorer(tc.p, scorer.Env{})
			if tc.ok {
				require.NoError(t, err)
				assert.Equal(t, tc.p, s.Params())
			} else {
				assert.Error(t, err)
			}
		})
	}
}

func TestPrefixScorerFromParams(t *testing.T) {
	p, err := scorer.ParseParams(`{"yieldAbsolute": 8, "minMatch": 0.1}`)
	require.NoError(t, err)
	s, err := scorer.NewPrefixScorerFromParams(p, scorer.Env{})
	require.NoError(t, err)
	assert.Equal(t, scorer.PrefixParams{MinMatch: 0.1, Tolerance: 0.02, PartialCredit: 0.25, YieldAbsolute: 8, YieldRelative: 0.5},
		s.(*scorer.PrefixScorer).Params())
	bad, err := scorer.ParseParams(`{"yieldAbsolut": 8}`)
	require.NoError(t, err)
	_, err = scorer.NewPrefixScorerFromParams(bad, scorer.Env{})
	assert.Error(t, err, "unknown field")
	neg, err := scorer.ParseParams(`{"yieldRelative": -1}`)
	require.NoError(t, err)
	_, err = scorer.NewPrefixScorerFromParams(neg, scorer.Env{})
	assert.Error(t, err)
}

func TestPrefixScorerDoesNotAllocate(t *testing.T) {
	s, err := scorer.NewPrefixScorer(scorer.DefaultPrefixParams(), scorer.Env{})
	require.NoError(t, err)
	eps := pxEndpoints(3, 1, 4, 1, 5, 9, 2, 6)
	in := &scorer.Input{Endpoints: eps, Now: pxT0, Cached: []float64{0.5, 0.5, 0, 0.9, 0, 0, 0.1, 0}, Raw: make([]float64, 8)}
	out := make([]float64, 8)
	assert.Zero(t, testing.AllocsPerRun(100, func() { s.Score(context.Background(), in, out) }))
}

// pxClock is a signals.Clock that stands still.
type pxClock struct{ t time.Time }

func (c pxClock) Now() time.Time { return c.t }

// pxFleet runs the real picker over simulated pods in discrete steps: each
// pick is one step, and a request completes a fixed number of steps after
// it was dispatched. The scorers are the prefix scorer (weight 3) and the
// queue scorer (weight 2), the weights of picker.DefaultConfig.
type pxFleet struct {
	t       *testing.T
	eps     []*signals.Endpoint
	ix      *prefix.Index
	hasher  *prefix.Hasher
	p       *picker.Picker
	service int
	step    int
	running []pxFlight
	counts  map[*signals.Endpoint]int
}

type pxFlight struct {
	end  int
	done func(picker.DoneInfo)
	then func()
}

func newPxFleet(t *testing.T, pods, service int) *pxFleet {
	t.Helper()
	reg := &scorer.Registry{}
	require.NoError(t, reg.RegisterScorer("prefix-affinity", scorer.NewPrefixScorerFromParams))
	require.NoError(t, reg.RegisterScorer("queue-depth", func(_ scorer.Params, env scorer.Env) (scorer.Scorer, error) {
		return &scorer.QueueScorer{HalfLife: env.HalfLife}, nil
	}))
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	require.NoError(t, err)
	cfg := picker.Config{
		Scorers: []picker.Plugin{
			{Name: "prefix-affinity", Weight: 3},
			{Name: "queue-depth", Weight: 2},
		},
		Strategy: picker.Strategy{Name: picker.StrategyMaxScore},
	}
	p, err := picker.New(cfg, picker.WithRegistry(reg), picker.WithPrefixMatcher(ix),
		picker.WithClock(pxClock{pxT0}), picker.WithSeed(7))
	require.NoError(t, err)
	f := &pxFleet{t: t, ix: ix, hasher: prefix.NewHasher(prefix.HashConfig{}), p: p, service: service,
		counts: map[*signals.Endpoint]int{}}
	for i := 0; i < pods; i++ {
		f.eps = append(f.eps, signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprintf("pod-%d", i)}))
	}
	p.SetEndpoints(f.eps)
	return f
}

// request hashes a chat body into a Request.
func (f *pxFleet) request(body []byte) *signals.Request {
	blocks, n, err := f.hasher.HashBody(nil, "llama", "", body)
	require.NoError(f.t, err)
	return &signals.Request{Model: "llama", PromptBlocks: blocks, PromptTokens: n / prefix.BytesPerToken}
}

// pick places req, completes it f.service steps later (then calling then),
// and advances one step.
func (f *pxFleet) pick(req *signals.Request, then func()) *signals.Endpoint {
	res, err := f.p.Pick(context.Background(), req)
	require.NoError(f.t, err)
	f.counts[res.Endpoint]++
	f.running = append(f.running, pxFlight{end: f.step + f.service, done: res.Done, then: then})
	f.advance()
	return res.Endpoint
}

// advance moves one step and completes the requests due.
func (f *pxFleet) advance() {
	f.step++
	kept := f.running[:0]
	var due []pxFlight
	for _, r := range f.running {
		if r.end <= f.step {
			due = append(due, r)
		} else {
			kept = append(kept, r)
		}
	}
	f.running = kept
	for _, r := range due {
		r.done(picker.DoneInfo{TTFT: time.Millisecond})
		if r.then != nil {
			r.then()
		}
	}
}

// loads returns each pod's requests in flight (their load, without scrapes).
func (f *pxFleet) loads() []float64 {
	out := make([]float64, len(f.eps))
	for i, ep := range f.eps {
		out[i] = float64(ep.InFlight())
	}
	return out
}

func pxChat(msgs ...string) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, c := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		ms = append(ms, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"model": "llama", "messages": ms})
	return b
}

// pxWords returns n bytes of deterministic English-like text.
func pxWords(rng *rand.Rand, n int) string {
	vocab := strings.Fields("the a river mountain model token cache prefix request endpoint quick brown fox " +
		"jumps over lazy dog server batch queue latency answer question policy route")
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(vocab[rng.IntN(len(vocab))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// TestSharedSystemPromptDoesNotHotSpot is issue 4's test (a): 8 pods, 1000
// requests sharing a 2K-token system prompt with distinct user turns. The
// busiest pod's share must be within 1.5× of an even share, and once every
// pod holds the system prompt the requests still hit the cache.
func TestSharedSystemPromptDoesNotHotSpot(t *testing.T) {
	const pods, requests = 8, 1000
	f := newPxFleet(t, pods, 64) // 64 requests in flight: 8 per pod on average
	rng := rand.New(rand.NewPCG(1, 2))
	system := pxWords(rng, 2048*prefix.BytesPerToken) // 2K tokens
	hits := 0
	for i := 0; i < requests; i++ {
		req := f.request(pxChat(system, fmt.Sprintf("request %d: %s", i, pxWords(rng, 200+rng.IntN(400)))))
		cached := make([]float64, pods)
		f.ix.Match(req, f.eps, cached)
		ep := f.pick(req, nil)
		for j, e := range f.eps {
			if e == ep && cached[j] > 0.9 {
				hits++
			}
		}
	}
	busiest := 0
	for _, ep := range f.eps {
		busiest = max(busiest, f.counts[ep])
		t.Logf("%s: %d requests", ep.Name, f.counts[ep])
	}
	assert.LessOrEqual(t, float64(busiest), 1.5*requests/pods, "busiest pod's share")
	// Each pod misses at most once (its first request with the prompt).
	assert.GreaterOrEqual(t, hits, requests-pods, "requests that hit the system prompt")
}

// TestConversationsStayWithTheirHistory is issue 4's test (b): 100
// multi-turn conversations; every turn after the first must land on the pod
// that served the previous turn (and so holds the history) unless that pod
// is over the yield margins at the time of the pick, which the test checks
// from the pods' loads with the default margins (4 requests and 50%).
func TestConversationsStayWithTheirHistory(t *testing.T) {
	const pods, convs, turns = 8, 100, 5
	f := newPxFleet(t, pods, 40) // about 5 requests per pod
	rng := rand.New(rand.NewPCG(3, 4))
	system := pxWords(rng, 512) // a short system prompt shared by all
	type conv struct {
		msgs []string
		pod  *signals.Endpoint
		busy bool
		turn int
	}
	cs := make([]*conv, convs)
	for i := range cs {
		cs[i] = &conv{msgs: []string{system, fmt.Sprintf("conversation %d: %s", i, pxWords(rng, 2000))}}
	}
	stayed, yielded := 0, 0
	for remaining := convs * turns; remaining > 0; {
		var ready []*conv
		for _, c := range cs {
			if !c.busy && c.turn < turns {
				ready = append(ready, c)
			}
		}
		if len(ready) == 0 {
			f.advance()
			continue
		}
		c := ready[rng.IntN(len(ready))]
		req := f.request(pxChat(c.msgs...))
		over := false
		if c.pod != nil {
			loads := f.loads()
			lmin := loads[0]
			for _, l := range loads {
				lmin = min(lmin, l)
			}
			lh := float64(c.pod.InFlight())
			over = lh-lmin > 4 && lh > 1.5*lmin // the default margins
		}
		prev := c.pod
		c.busy = true
		c.pod = f.pick(req, func() {
			c.busy = false
			c.turn++
			c.msgs = append(c.msgs, pxWords(rng, 300), pxWords(rng, 150)) // answer, next question
		})
		remaining--
		switch {
		case prev == nil:
		case over:
			yielded++
		default:
			require.Same(t, prev, c.pod, "turn %d of a conversation left its pod without being over the margin", c.turn+1)
			stayed++
		}
	}
	assert.Equal(t, convs*(turns-1), stayed+yielded)
	assert.Greater(t, stayed, convs*(turns-1)*9/10, "most later turns stay")
	t.Logf("stayed %d, yielded %d", stayed, yielded)
}

// TestRestartEmptiesPodEntries is issue 4's test (c): after a pod restarts
// its prefix entries are gone, it attracts none of the conversations it
// held, and the index frees their memory once it sees the pool.
func TestRestartEmptiesPodEntries(t *testing.T) {
	f := newPxFleet(t, 4, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	var bodies [][]byte
	var homes []*signals.Endpoint
	for i := 0; i < 40; i++ {
		b := pxChat(pxWords(rng, 256), fmt.Sprintf("conversation %d: %s", i, pxWords(rng, 1500)))
		bodies = append(bodies, b)
		homes = append(homes, f.pick(f.request(b), nil))
	}
	for range 10 {
		f.advance() // complete everything
	}
	victim := homes[0]
	before := f.ix.Stats().Entries
	held := f.ix.Entries(victim)
	require.Positive(t, held)

	victim.MarkRestarted()
	assert.Zero(t, f.ix.Entries(victim))
	for i, b := range bodies {
		cached := make([]float64, len(f.eps))
		f.ix.Match(f.request(b), f.eps, cached)
		for j, ep := range f.eps {
			switch {
			case ep == victim:
				assert.Zero(t, cached[j], "conversation %d on the restarted pod", i)
			case ep == homes[i]:
				assert.Greater(t, cached[j], 0.9, "conversation %d on its pod", i)
			}
		}
	}
	f.ix.Retain(f.eps)
	assert.Equal(t, before-held, f.ix.Stats().Entries, "the restarted pod's entries are freed")
}
