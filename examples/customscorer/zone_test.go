package customscorer_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/examples/customscorer"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

func labelled(labels ...map[string]string) []*signals.Endpoint {
	eps := make([]*signals.Endpoint, len(labels))
	for i, l := range labels {
		eps[i] = signals.NewEndpoint(signals.EndpointSpec{Name: string(rune('a' + i)), Labels: l})
	}
	return eps
}

func score(s scorer.Scorer, req *signals.Request, eps []*signals.Endpoint) (scores, raw []float64) {
	scores = make([]float64, len(eps))
	raw = make([]float64, len(eps))
	for i := range raw {
		raw[i] = math.NaN()
	}
	s.Score(context.Background(), &scorer.Input{Request: req, Endpoints: eps, Raw: raw}, scores)
	return scores, raw
}

func withZone(zone string) *signals.Request {
	req := &signals.Request{Headers: http.Header{}}
	if zone != "" {
		req.Headers.Set(customscorer.DefaultZoneHeader, zone)
	}
	return req
}

func zones(zs ...string) []*signals.Endpoint {
	ls := make([]map[string]string, len(zs))
	for i, z := range zs {
		if z != "-" {
			ls[i] = map[string]string{customscorer.DefaultZoneLabel: z}
		}
	}
	return labelled(ls...)
}

func TestZoneScorer(t *testing.T) {
	z, err := customscorer.NewZoneScorer(customscorer.ZoneScorer{SameRegion: 0.4})
	require.NoError(t, err)
	nan := math.NaN()
	tests := []struct {
		name      string
		req       *signals.Request
		eps       []*signals.Endpoint
		want, raw []float64
	}{
		{name: "gcp zones", req: withZone("us-east1-b"), eps: zones("us-east1-b", "us-east1-c", "us-west1-b"),
			want: []float64{1, 0.4, 0}, raw: []float64{2, 1, 0}},
		{name: "aws zones", req: withZone("us-east-1a"), eps: zones("us-east-1b", "us-east-2a", "us-east-1a"),
			want: []float64{0.4, 0, 1}, raw: []float64{1, 0, 2}},
		{name: "azure zones", req: withZone("eastus-1"), eps: zones("eastus-2", "westus-1"),
			want: []float64{0.4, 0}, raw: []float64{1, 0}},
		{name: "no header is neutral", req: withZone(""), eps: zones("us-east1-b", "us-east1-c"),
			want: []float64{0.5, 0.5}, raw: []float64{nan, nan}},
		{name: "nil headers are neutral", req: &signals.Request{}, eps: zones("us-east1-b"),
			want: []float64{0.5}, raw: []float64{nan}},
		{name: "unlabelled endpoint is neutral", req: withZone("us-east1-b"), eps: zones("-", "us-east1-b"),
			want: []float64{0.5, 1}, raw: []float64{nan, 2}},
		{name: "one-character zones are never the same region", req: withZone("1"), eps: zones("2", "1"),
			want: []float64{0, 1}, raw: []float64{0, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, raw := score(z, tc.req, tc.eps)
			assert.Equal(t, tc.want, got)
			for i := range raw {
				if math.IsNaN(tc.raw[i]) {
					assert.True(t, math.IsNaN(raw[i]), "raw[%d] = %v, want NaN", i, raw[i])
				} else {
					assert.Equal(t, tc.raw[i], raw[i], "raw[%d]", i)
				}
			}
		})
	}
}

// TestZoneScorerDefaults pins which defaults apply where: NewZoneScorer
// fills in the header and label names only, the YAML factory also
// sameRegion.
func TestZoneScorerDefaults(t *testing.T) {
	sameRegionEP := zones("us-east1-c")
	t.Run("NewZoneScorer", func(t *testing.T) {
		z, err := customscorer.NewZoneScorer(customscorer.ZoneScorer{})
		require.NoError(t, err)
		assert.Equal(t, customscorer.DefaultZoneHeader, z.Header)
		assert.Equal(t, customscorer.DefaultZoneLabel, z.Label)
		assert.Zero(t, z.SameRegion)
		got, raw := score(z, withZone("us-east1-b"), sameRegionEP)
		assert.Equal(t, []float64{0}, got, "zero SameRegion scores like another region")
		assert.Equal(t, []float64{1}, raw, "the match level still says same region")
	})
	tests := []struct {
		name, params string
		want         customscorer.ZoneScorer
	}{
		{name: "no params", want: customscorer.ZoneScorer{Header: customscorer.DefaultZoneHeader,
			Label: customscorer.DefaultZoneLabel, SameRegion: customscorer.DefaultSameRegion}},
		{name: "sameRegion left out", params: "{header: x-z}", want: customscorer.ZoneScorer{Header: "x-z",
			Label: customscorer.DefaultZoneLabel, SameRegion: customscorer.DefaultSameRegion}},
		{name: "explicit zero sameRegion", params: "{sameRegion: 0}", want: customscorer.ZoneScorer{
			Header: customscorer.DefaultZoneHeader, Label: customscorer.DefaultZoneLabel}},
	}
	for _, tc := range tests {
		t.Run("YAML/"+tc.name, func(t *testing.T) {
			reg := scorer.NewRegistry()
			require.NoError(t, customscorer.Register(reg))
			var params scorer.Params
			if tc.params != "" {
				var err error
				params, err = scorer.ParseParams(tc.params)
				require.NoError(t, err)
			}
			s, err := reg.NewScorer(customscorer.ZoneScorerName, params, scorer.Env{})
			require.NoError(t, err)
			z, ok := s.(*customscorer.ZoneScorer)
			require.True(t, ok, "%T", s)
			assert.Equal(t, tc.want.Header, z.Header)
			assert.Equal(t, tc.want.Label, z.Label)
			assert.Equal(t, tc.want.SameRegion, z.SameRegion)
		})
	}
}

func TestZoneScorerHeaderCase(t *testing.T) {
	z, err := customscorer.NewZoneScorer(customscorer.ZoneScorer{Header: "X-MY-zone", SameRegion: 0.5})
	require.NoError(t, err)
	req := &signals.Request{Headers: http.Header{}}
	req.Headers.Set("x-my-zone", "z1")
	got, _ := score(z, req, zones("z1", "z2"))
	assert.Equal(t, []float64{1, 0.5}, got)
}

func TestCostScorer(t *testing.T) {
	c := &customscorer.CostScorer{Label: "cost"}
	cost := func(vs ...string) []*signals.Endpoint {
		ls := make([]map[string]string, len(vs))
		for i, v := range vs {
			if v != "-" {
				ls[i] = map[string]string{"cost": v}
			}
		}
		return labelled(ls...)
	}
	tests := []struct {
		name string
		eps  []*signals.Endpoint
		want []float64
	}{
		// (hi − v) / (hi − lo) with lo 1, hi 5.
		{name: "cheapest scores 1", eps: cost("1", "5", "2"), want: []float64{1, 0, 0.75}},
		{name: "unparsable, negative and missing are neutral", eps: cost("1", "cheap", "-3", "-", "3"),
			want: []float64{1, 0.5, 0.5, 0.5, 0}},
		{name: "equal costs all score 1", eps: cost("2", "2"), want: []float64{1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := score(c, &signals.Request{}, tc.eps)
			assert.InDeltaSlice(t, tc.want, got, 1e-12)
		})
	}
}

func TestScoreDoesNotAllocate(t *testing.T) {
	z, err := customscorer.NewZoneScorer(customscorer.ZoneScorer{SameRegion: 0.5})
	require.NoError(t, err)
	req := withZone("us-east1-b")
	eps := zones("us-east1-b", "us-east1-c", "eu-west1-a")
	for i, ep := range eps {
		ep.Labels[customscorer.DefaultCostLabel] = []string{"1.5", "2", "0.25"}[i]
	}
	c := &customscorer.CostScorer{Label: customscorer.DefaultCostLabel}
	out, raw := make([]float64, 3), make([]float64, 3)
	in := &scorer.Input{Request: req, Endpoints: eps, Raw: raw}
	for _, s := range []scorer.Scorer{z, c} {
		allocs := testing.AllocsPerRun(100, func() { s.Score(context.Background(), in, out) })
		assert.Zero(t, allocs, "%T", s)
	}
}

func TestRegisterFromYAML(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{name: "defaults", yaml: "scorers: [{name: zone-affinity, weight: 1}, {name: cost, weight: 1}]"},
		{name: "params", yaml: "scorers: [{name: zone-affinity, weight: 1, params: {header: x-z, label: zone, sameRegion: 0.2}}]"},
		{name: "sameRegion out of range", yaml: "scorers: [{name: zone-affinity, weight: 1, params: {sameRegion: 2}}]",
			wantErr: "sameRegion: 2 is not in [0, 1]"},
		{name: "unknown param", yaml: "scorers: [{name: zone-affinity, weight: 1, params: {zone: x}}]",
			wantErr: "field zone not found"},
		{name: "empty cost label", yaml: "scorers: [{name: cost, weight: 1, params: {label: ''}}]",
			wantErr: "label: must not be empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := scorer.NewRegistry()
			require.NoError(t, customscorer.Register(reg))
			cfg, err := picker.ParseConfig([]byte(tc.yaml))
			require.NoError(t, err)
			_, err = picker.New(cfg, picker.WithRegistry(reg))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := scorer.NewRegistry()
	require.NoError(t, customscorer.Register(reg))
	err := customscorer.Register(reg)
	assert.True(t, errors.Is(err, scorer.ErrDuplicatePlugin), "%v", err)
}

// TestDemoContributions checks the custom scorers' weighted contributions
// in the demo pick, computed by hand in ExampleDemo's comment.
func TestDemoContributions(t *testing.T) {
	p, err := customscorer.NewDemoPicker(customscorer.DemoConfig)
	require.NoError(t, err)
	req := withZone(customscorer.DemoClientZone)
	res, err := p.Pick(context.Background(), req)
	require.NoError(t, err)
	defer res.Done(picker.DoneInfo{})
	bd := res.Breakdown
	require.Equal(t, []string{"queue", "kv-cache", customscorer.ZoneScorerName, customscorer.CostScorerName}, bd.Scorers())
	want := map[string][]float64{ // queue, kv-cache, zone, cost
		"pod-a": {0, 1.0, 3, 0},
		"pod-b": {4.0 / 3, 1.4, 1.5, 2.0 / 3},
		"pod-c": {2, 1.6, 0, 1},
	}
	require.Equal(t, 3, bd.Len())
	for i := range bd.Len() {
		name := bd.Endpoint(i).Name
		var total float64
		for s := range bd.Scorers() {
			assert.InDelta(t, want[name][s], bd.Contribution(s, i), 1e-9, "%s %s", name, bd.Scorers()[s])
			total += want[name][s]
		}
		assert.InDelta(t, total, bd.Total(i), 1e-9, name)
	}
	assert.Equal(t, "pod-b", res.Endpoint.Name)
	assert.True(t, strings.Contains(bd.String(), "zone-affinity"))
}

// TestZoneWeightDecides raises the zone weight until affinity outweighs
// load: pod-a then totals 0+1+6+0 = 7 against pod-b's 1.333+1.4+3+0.667 =
// 6.4 and pod-c's 2+1.6+0+1 = 4.6.
func TestZoneWeightDecides(t *testing.T) {
	p, err := customscorer.NewDemoPicker(strings.Replace(customscorer.DemoConfig, "weight: 3", "weight: 6", 1))
	require.NoError(t, err)
	res, err := p.Pick(context.Background(), withZone(customscorer.DemoClientZone))
	require.NoError(t, err)
	defer res.Done(picker.DoneInfo{})
	assert.Equal(t, "pod-a", res.Endpoint.Name)
	assert.InDelta(t, 7.0, res.Breakdown.Total(res.Breakdown.Chosen()), 1e-9)
}
