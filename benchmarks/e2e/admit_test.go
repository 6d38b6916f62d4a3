package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

func endpointWith(t *testing.T, waiting, kv float64, now time.Time) *signals.Endpoint {
	t.Helper()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "e", Address: "127.0.0.1:1"})
	ep.SetMetrics(&signals.Metrics{ScrapedAt: now, Waiting: signals.Known(waiting), KVCacheUtilization: signals.Known(kv)})
	return ep
}

func TestSaturationAdmitter(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		priority int
		eps      [][2]float64 // waiting, kv
		want     bool
	}{
		{"critical always", 1, [][2]float64{{50, 0.99}}, true},
		{"default always", 0, [][2]float64{{50, 0.99}}, true},
		{"sheddable, one pod has room", -1, [][2]float64{{50, 0.99}, {4, 0.79}}, true},
		{"sheddable, queues at the threshold", -1, [][2]float64{{5, 0.1}, {9, 0.2}}, false},
		{"sheddable, caches at the threshold", -1, [][2]float64{{0, 0.8}, {1, 0.95}}, false},
		{"sheddable, no candidates", -1, nil, true},
	}
	a := &SaturationAdmitter{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []*signals.Endpoint
			for _, e := range tt.eps {
				eps = append(eps, endpointWith(t, e[0], e[1], now))
			}
			ok, reason := a.Admit(context.Background(), &scorer.Input{Request: &signals.Request{Priority: tt.priority}, Endpoints: eps, Now: now})
			assert.Equal(t, tt.want, ok)
			if ok {
				assert.Empty(t, reason)
			} else {
				assert.Contains(t, reason, "saturated")
			}
		})
	}
}

func TestRoundRobinScorer(t *testing.T) {
	s := &roundRobinScorer{}
	in := &scorer.Input{Endpoints: make([]*signals.Endpoint, 3)}
	out := make([]float64, 3)
	want := [][]float64{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 0, 0}}
	for i, w := range want {
		s.Score(context.Background(), in, out)
		assert.Equal(t, w, out, "pick %d", i)
	}
}
