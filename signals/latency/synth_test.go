package latency

import (
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/inferroute/inferroute/signals"
)

// fakeClock is a settable signals.Clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

// synthEndpoint is a simulated endpoint whose true TTFT follows a known
// formula, scaled by its speed:
//
//	TTFT = 0.03 s + (uncached + queued tokens) / (4000 tokens/s × speed)
//	       + 3 ms × running / speed + 0.4 s × (adapter load)
//
// times multiplicative log-normal noise exp(N(0, noise²)).
type synthEndpoint struct {
	ep    *signals.Endpoint
	speed float64
}

const (
	synthBaseRate   = 4000.0
	synthOverhead   = 0.03
	synthPerRunning = 0.003
	synthLoRA       = 0.4
	synthMeanPrompt = 2000.0 // mean of the uniform prompt sizes below
)

// state is the load an endpoint shows for one request.
type synthLoad struct {
	prompt  int
	cached  float64
	waiting int
	running int
	kv      float64
}

func randomLoad(rng *rand.Rand) synthLoad {
	return synthLoad{
		prompt:  100 + rng.IntN(3801), // uniform 100..3900, mean 2000
		cached:  rng.Float64() * 0.5,
		waiting: rng.IntN(9),
		running: rng.IntN(33),
		kv:      rng.Float64() * 0.9,
	}
}

// truth is the noiseless TTFT in seconds for a request of load l.
func (s *synthEndpoint) truth(l synthLoad) float64 {
	u := float64(l.prompt) * (1 - l.cached)
	queued := float64(l.waiting) * synthMeanPrompt * 0.75 // mean uncached size
	return synthOverhead + (u+queued)/(synthBaseRate*s.speed) + synthPerRunning*float64(l.running)/s.speed
}

// publish makes the endpoint show load l, as a fresh scrape would.
func (s *synthEndpoint) publish(l synthLoad, now time.Time) {
	s.ep.SetMetrics(&signals.Metrics{
		ScrapedAt:          now,
		Baseline:           s.ep.Counters(),
		Waiting:            signals.Known(float64(l.waiting)),
		Running:            signals.Known(float64(l.running)),
		KVCacheUtilization: signals.Known(l.kv),
	})
}

// serve runs one request of load l through the predictor as the picker
// would (Dispatch, Dispatched, Complete, Completed) and returns the
// observed TTFT.
func (s *synthEndpoint) serve(p *Predictor, clk *fakeClock, rng *rand.Rand, l synthLoad, noise float64) float64 {
	s.publish(l, clk.Now())
	req := &signals.Request{PromptTokens: l.prompt}
	tokens := int(float64(l.prompt) * (1 - l.cached))
	s.ep.Dispatch(tokens)
	p.Dispatched(req, s.ep)
	ttft := s.truth(l) * math.Exp(rng.NormFloat64()*noise)
	clk.Advance(10 * time.Millisecond)
	s.ep.Complete(tokens)
	p.Completed(req, s.ep, signals.Outcome{TTFT: time.Duration(ttft * float64(time.Second))})
	return ttft
}

// predict returns the predictor's TTFT for a request of load l on s.
func (s *synthEndpoint) predict(p *Predictor, clk *fakeClock, l synthLoad) float64 {
	s.publish(l, clk.Now())
	v, _ := p.PredictTTFT(&signals.Request{PromptTokens: l.prompt}, s.ep, l.cached)
	return v
}

func newSynthFleet(speeds ...float64) []*synthEndpoint {
	out := make([]*synthEndpoint, len(speeds))
	for i, s := range speeds {
		out[i] = &synthEndpoint{
			ep:    signals.NewEndpoint(signals.EndpointSpec{Name: "ep" + string(rune('a'+i)), Address: "10.0.0.1:8000"}),
			speed: s,
		}
	}
	return out
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
