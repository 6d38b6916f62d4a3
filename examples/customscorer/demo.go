package customscorer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// DemoConfig is the picker configuration Demo uses: two built-in load
// scorers and the two custom scorers, each with a weight.
const DemoConfig = `
filters:
  - name: healthy
scorers:
  - name: queue
    weight: 2
  - name: kv-cache
    weight: 2
  - name: zone-affinity
    weight: 3
    params:
      header: x-client-zone
      label: topology.kubernetes.io/zone
      sameRegion: 0.5
  - name: cost
    weight: 1
    params:
      label: inferroute.io/cost-per-mtok
`

// DemoEndpoint describes one endpoint of the demo fleet.
type DemoEndpoint struct {
	Name    string
	Zone    string
	Cost    string
	Waiting float64
	KV      float64
}

// DemoFleet is the fleet Demo picks from: the client's own zone is the
// busiest and dearest, the far region the idlest and cheapest.
var DemoFleet = []DemoEndpoint{
	{Name: "pod-a", Zone: "us-east1-b", Cost: "2.0", Waiting: 3, KV: 0.5},
	{Name: "pod-b", Zone: "us-east1-c", Cost: "1.0", Waiting: 1, KV: 0.3},
	{Name: "pod-c", Zone: "europe-west4-a", Cost: "0.5", Waiting: 0, KV: 0.2},
}

// DemoClientZone is the zone the demo request comes from.
const DemoClientZone = "us-east1-b"

// NewDemoPicker returns a picker configured with config (YAML; Demo passes
// DemoConfig) over a
// registry holding the built-ins and the custom scorers, with DemoFleet's
// endpoints scraped at the (fixed) clock's time, so every pick sees the
// same state.
func NewDemoPicker(config string) (*picker.Picker, error) {
	reg := scorer.NewRegistry()
	if err := Register(reg); err != nil {
		return nil, err
	}
	cfg, err := picker.ParseConfig([]byte(config))
	if err != nil {
		return nil, err
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, err := picker.New(cfg, picker.WithRegistry(reg), picker.WithClock(signalstest.NewClock(now)))
	if err != nil {
		return nil, err
	}
	eps := make([]*signals.Endpoint, len(DemoFleet))
	for i, d := range DemoFleet {
		ep := signalstest.Endpoint(d.Name, signalstest.Load{Running: 0, Waiting: d.Waiting, KV: d.KV, ScrapedAt: now})
		ep.Labels = map[string]string{DefaultZoneLabel: d.Zone, DefaultCostLabel: d.Cost}
		eps[i] = ep
	}
	p.SetEndpoints(eps)
	return p, nil
}

// Demo picks once for a request from DemoClientZone and writes the chosen
// endpoint and the decision breakdown (picker.Breakdown.String) to w.
func Demo(w io.Writer) error {
	p, err := NewDemoPicker(DemoConfig)
	if err != nil {
		return err
	}
	req := &signals.Request{ID: "demo", Headers: http.Header{}}
	req.Headers.Set("x-client-zone", DemoClientZone)
	res, err := p.Pick(context.Background(), req)
	if err != nil {
		return err
	}
	defer res.Done(picker.DoneInfo{})
	_, err = fmt.Fprintf(w, "request from %s -> %s\n%s", DemoClientZone, res.Endpoint.Name, res.Breakdown.String())
	return err
}
