package customscorer

import (
	"context"
	"fmt"
	"math"
	"net/textproto"
	"strconv"

	"github.com/inferroute/inferroute/scorer"
)

// Plugin names under which Register adds the scorers.
const (
	ZoneScorerName = "zone-affinity"
	CostScorerName = "cost"
)

// Label and header names used by default. The zone label is the Kubernetes
// well-known label topology.kubernetes.io/zone
// (https://kubernetes.io/docs/reference/labels-annotations-taints/).
const (
	DefaultZoneLabel  = "topology.kubernetes.io/zone"
	DefaultZoneHeader = "x-client-zone"
	DefaultCostLabel  = "inferroute.io/cost-per-mtok"
)

// DefaultSameRegion is the zone-affinity scorer's sameRegion when its YAML
// params leave it out. NewZoneScorer does not apply it: there a zero
// SameRegion is a value, not a gap.
const DefaultSameRegion = 0.5

// Compile-time guards.
var (
	_ scorer.Scorer = (*ZoneScorer)(nil)
	_ scorer.Scorer = (*CostScorer)(nil)
)

// ZoneScorer scores 1 for endpoints whose zone label equals the zone named
// in the request header, SameRegion for endpoints in another zone of the
// same region, and 0 for the rest. A request without the header, or an
// endpoint without the label, scores scorer.Neutral: no information is
// neither a bonus nor a penalty. The raw value in the breakdown is the
// match level: 2 same zone, 1 same region, 0 other.
//
// Two zones are in the same region when they differ only in their last
// character, which holds for the zone names of the big clouds: GCP
// "us-east1-b", AWS "us-east-1a", Azure "eastus-1".
//
// A ZoneScorer is immutable after construction and safe for concurrent use;
// Score does not allocate.
type ZoneScorer struct {
	// Header names the request header carrying the client's zone.
	Header string `yaml:"header"`
	// Label names the endpoint label carrying its zone.
	Label string `yaml:"label"`
	// SameRegion is the score of an endpoint in the client's region but
	// another zone, in [0, 1]. 0 scores such endpoints like those of other
	// regions.
	SameRegion float64 `yaml:"sameRegion"`

	canonHeader string
}

// NewZoneScorer returns a ZoneScorer with DefaultZoneHeader for an empty
// Header and DefaultZoneLabel for an empty Label of z. SameRegion is taken
// as given, so the zero value scores same-region endpoints 0, like other
// regions; set it (to DefaultSameRegion, say) for a partial match. It
// fails if SameRegion is not in [0, 1].
func NewZoneScorer(z ZoneScorer) (*ZoneScorer, error) {
	if z.Header == "" {
		z.Header = DefaultZoneHeader
	}
	if z.Label == "" {
		z.Label = DefaultZoneLabel
	}
	if math.IsNaN(z.SameRegion) || z.SameRegion < 0 || z.SameRegion > 1 {
		return nil, fmt.Errorf("sameRegion: %v is not in [0, 1]", z.SameRegion)
	}
	// Score indexes the header map directly, so the key is canonicalised
	// here once instead of by http.Header.Get on every pick.
	z.canonHeader = textproto.CanonicalMIMEHeaderKey(z.Header)
	return &z, nil
}

// Score implements scorer.Scorer.
func (z *ZoneScorer) Score(_ context.Context, in *scorer.Input, out []float64) {
	var client string
	if vs := in.Request.Headers[z.canonHeader]; len(vs) > 0 {
		client = vs[0]
	}
	for i, ep := range in.Endpoints {
		zone, ok := ep.Labels[z.Label]
		switch {
		case client == "" || !ok || zone == "":
			out[i] = scorer.Neutral
		case zone == client:
			out[i], in.Raw[i] = 1, 2
		case sameRegion(zone, client):
			out[i], in.Raw[i] = z.SameRegion, 1
		default:
			out[i], in.Raw[i] = 0, 0
		}
	}
}

// sameRegion reports whether zones a and b differ only in their last
// character.
func sameRegion(a, b string) bool {
	return len(a) > 1 && len(a) == len(b) && a[:len(a)-1] == b[:len(b)-1]
}

// CostScorer prefers cheaper endpoints: the raw value is the number in the
// endpoint's cost label (a price per million tokens, in any one currency),
// and scores are scorer.InverseMinMax across the candidates, so the
// cheapest scores 1 and the dearest 0. An endpoint without a parsable,
// non-negative label scores scorer.Neutral.
//
// The label is parsed on every pick, which keeps the scorer stateless as
// endpoints come and go; strconv.ParseFloat does not allocate on valid
// numbers. A CostScorer is safe for concurrent use.
type CostScorer struct {
	// Label names the endpoint label carrying its cost.
	Label string `yaml:"label"`
}

// Score implements scorer.Scorer.
func (c *CostScorer) Score(_ context.Context, in *scorer.Input, out []float64) {
	for i, ep := range in.Endpoints {
		out[i] = math.NaN() // unknown: InverseMinMax makes it Neutral
		if s, ok := ep.Labels[c.Label]; ok {
			if v, err := strconv.ParseFloat(s, 64); err == nil && v >= 0 && !math.IsInf(v, 0) {
				out[i] = v
			}
		}
	}
	copy(in.Raw, out)
	scorer.InverseMinMax(out)
}

// Register adds ZoneScorer under ZoneScorerName and CostScorer under
// CostScorerName to reg. Their YAML params are the fields' yaml names;
// unknown params are errors. Params left out take the defaults:
// DefaultZoneHeader, DefaultZoneLabel and DefaultSameRegion for the zone
// scorer, DefaultCostLabel for the cost scorer. It fails if either name is
// taken.
func Register(reg *scorer.Registry) error {
	err := reg.RegisterScorer(ZoneScorerName, func(p scorer.Params, _ scorer.Env) (scorer.Scorer, error) {
		z := ZoneScorer{SameRegion: DefaultSameRegion}
		if err := p.Decode(&z); err != nil {
			return nil, err
		}
		return NewZoneScorer(z)
	})
	if err != nil {
		return err
	}
	return reg.RegisterScorer(CostScorerName, func(p scorer.Params, _ scorer.Env) (scorer.Scorer, error) {
		c := CostScorer{Label: DefaultCostLabel}
		if err := p.Decode(&c); err != nil {
			return nil, err
		}
		if c.Label == "" {
			return nil, fmt.Errorf("label: must not be empty")
		}
		return &c, nil
	})
}
