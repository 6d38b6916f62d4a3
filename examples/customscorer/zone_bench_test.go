package customscorer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/inferroute/inferroute/examples/customscorer"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// BenchmarkCustomScorers scores 64 endpoints with each custom scorer.
func BenchmarkCustomScorers(b *testing.B) {
	eps := make([]*signals.Endpoint, 64)
	for i := range eps {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: fmt.Sprint(i), Labels: map[string]string{
			customscorer.DefaultZoneLabel: []string{"us-east1-b", "us-east1-c", "europe-west4-a"}[i%3],
			customscorer.DefaultCostLabel: fmt.Sprintf("%.2f", 0.5+float64(i%7)/4),
		}})
	}
	req := withZone("us-east1-b")
	z, err := customscorer.NewZoneScorer(customscorer.ZoneScorer{SameRegion: 0.5})
	if err != nil {
		b.Fatal(err)
	}
	out, raw := make([]float64, len(eps)), make([]float64, len(eps))
	in := &scorer.Input{Request: req, Endpoints: eps, Raw: raw}
	for _, bc := range []struct {
		name string
		s    scorer.Scorer
	}{{"zone", z}, {"cost", &customscorer.CostScorer{Label: customscorer.DefaultCostLabel}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.s.Score(context.Background(), in, out)
			}
		})
	}
}
