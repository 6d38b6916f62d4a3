package scorer

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"go.yaml.in/yaml/v3"
)

// Params holds one filter's or scorer's parameters as written in a YAML or
// JSON configuration. The zero Params has no parameters.
type Params struct {
	node *yaml.Node
}

// ParamsFromYAML wraps a parsed YAML node (a mapping) as Params. A nil node
// or an empty one means no parameters.
func ParamsFromYAML(node *yaml.Node) Params {
	if node == nil || node.Kind == 0 {
		return Params{}
	}
	return Params{node: node}
}

// ParseParams parses YAML or JSON text (JSON is a subset of YAML) as Params.
func ParseParams(text string) (Params, error) {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(text), &n); err != nil {
		return Params{}, err
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return ParamsFromYAML(n.Content[0]), nil
	}
	return ParamsFromYAML(&n), nil
}

// UnmarshalYAML keeps the node for a later Decode by the plugin's factory.
func (p *Params) UnmarshalYAML(n *yaml.Node) error {
	c := *n
	*p = ParamsFromYAML(&c)
	return nil
}

// MarshalYAML writes the parameters back as they were given.
func (p Params) MarshalYAML() (any, error) {
	if p.node == nil {
		return nil, nil
	}
	return p.node, nil
}

// IsZero reports whether there are no parameters.
func (p Params) IsZero() bool { return p.node == nil }

// Decode decodes the parameters into v, a pointer to a struct with yaml
// tags, leaving fields that are not mentioned untouched (so v can hold the
// defaults). Unknown fields and mistyped values are errors that name the
// field. Decoding zero Params does nothing.
func (p Params) Decode(v any) error {
	if p.node == nil {
		return nil
	}
	// yaml.Node.Decode cannot reject unknown fields, a Decoder can: re-encode.
	raw, err := yaml.Marshal(p.node)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("params: %w", cleanYAMLError(err))
	}
	return nil
}

// cleanYAMLError strips yaml.v3's "yaml: unmarshal errors:" preamble.
func cleanYAMLError(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		return errors.New(te.Errors[0])
	}
	return err
}

// ScorerFactory builds a scorer from its parameters.
type ScorerFactory func(p Params, env Env) (Scorer, error)

// FilterFactory builds a filter from its parameters.
type FilterFactory func(p Params, env Env) (Filter, error)

// ErrUnknownPlugin is returned (wrapped) for a filter or scorer name that is
// not registered.
var ErrUnknownPlugin = errors.New("unknown plugin")

// ErrDuplicatePlugin is returned (wrapped) when a name is registered twice.
var ErrDuplicatePlugin = errors.New("duplicate plugin name")

// Registry maps filter and scorer names to their factories. The zero value
// is an empty registry ready to use; NewRegistry returns one holding the
// built-ins. A Registry is safe for concurrent lookups once registration is
// done; registration itself is not synchronised.
type Registry struct {
	scorers map[string]ScorerFactory
	filters map[string]FilterFactory
}

// RegisterScorer adds a scorer factory under name. An empty name, a nil
// factory or a name already registered (as a scorer) is an error.
func (r *Registry) RegisterScorer(name string, f ScorerFactory) error {
	if name == "" || f == nil {
		return fmt.Errorf("scorer %q: name and factory are required", name)
	}
	if _, dup := r.scorers[name]; dup {
		return fmt.Errorf("scorer %q: %w", name, ErrDuplicatePlugin)
	}
	if r.scorers == nil {
		r.scorers = make(map[string]ScorerFactory)
	}
	r.scorers[name] = f
	return nil
}

// RegisterFilter adds a filter factory under name. An empty name, a nil
// factory or a name already registered (as a filter) is an error.
func (r *Registry) RegisterFilter(name string, f FilterFactory) error {
	if name == "" || f == nil {
		return fmt.Errorf("filter %q: name and factory are required", name)
	}
	if _, dup := r.filters[name]; dup {
		return fmt.Errorf("filter %q: %w", name, ErrDuplicatePlugin)
	}
	if r.filters == nil {
		r.filters = make(map[string]FilterFactory)
	}
	r.filters[name] = f
	return nil
}

// NewScorer builds the scorer registered under name.
func (r *Registry) NewScorer(name string, p Params, env Env) (Scorer, error) {
	f, ok := r.scorers[name]
	if !ok {
		return nil, fmt.Errorf("scorer %q: %w (registered: %v)", name, ErrUnknownPlugin, sortedKeys(r.scorers))
	}
	s, err := f(p, env)
	if err != nil {
		return nil, fmt.Errorf("scorer %q: %w", name, err)
	}
	return s, nil
}

// NewFilter builds the filter registered under name.
func (r *Registry) NewFilter(name string, p Params, env Env) (Filter, error) {
	f, ok := r.filters[name]
	if !ok {
		return nil, fmt.Errorf("filter %q: %w (registered: %v)", name, ErrUnknownPlugin, sortedKeys(r.filters))
	}
	flt, err := f(p, env)
	if err != nil {
		return nil, fmt.Errorf("filter %q: %w", name, err)
	}
	return flt, nil
}

// Scorers returns the registered scorer names, sorted.
func (r *Registry) Scorers() []string { return sortedKeys(r.scorers) }

// Filters returns the registered filter names, sorted.
func (r *Registry) Filters() []string { return sortedKeys(r.filters) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Names of the built-in filters and scorers.
const (
	FilterModel      = "model"
	FilterHealthy    = "healthy"
	FilterSaturation = "saturation"
	FilterSubset     = "subset"

	ScorerQueue     = "queue"
	ScorerKVCache   = "kv-cache"
	ScorerRunning   = "running"
	ScorerLoRA      = "lora"
	ScorerTokenLoad = "token-load"
	ScorerBurst     = "burst"
	ScorerPrefill   = "prefill"
	ScorerPrefix    = "prefix"
	ScorerLatency   = "latency"
	FilterSLO       = "slo"
)

// NewRegistry returns a new Registry holding every built-in filter and
// scorer. Each call returns an independent value.
func NewRegistry() *Registry {
	r := &Registry{}
	noParams := func(_ string, p Params) error {
		if !p.IsZero() {
			var none struct{}
			if err := p.Decode(&none); err != nil {
				return err
			}
		}
		return nil
	}
	must := func(err error) {
		if err != nil {
			panic(err) // built-in names are distinct; a clash is a programming error
		}
	}
	must(r.RegisterFilter(FilterModel, func(p Params, _ Env) (Filter, error) {
		return ModelFilter{}, noParams(FilterModel, p)
	}))
	must(r.RegisterFilter(FilterHealthy, func(p Params, _ Env) (Filter, error) {
		return HealthyFilter{}, noParams(FilterHealthy, p)
	}))
	must(r.RegisterFilter(FilterSaturation, func(p Params, env Env) (Filter, error) {
		f := DefaultSaturationFilter()
		if err := p.Decode(&f); err != nil {
			return nil, err
		}
		if err := f.validate(); err != nil {
			return nil, err
		}
		f.HalfLife = env.HalfLife
		return &f, nil
	}))
	must(r.RegisterFilter(FilterSubset, func(p Params, _ Env) (Filter, error) {
		f := DefaultSubsetFilter()
		if err := p.Decode(&f); err != nil {
			return nil, err
		}
		// Canonical names make the per-request lookup a map access
		// instead of an allocation of the canonical copy (or a scan of
		// the name, which http.Header.Get repeats even for a canonical one).
		f.AddressHeader = http.CanonicalHeaderKey(f.AddressHeader)
		f.LabelHeader = http.CanonicalHeaderKey(f.LabelHeader)
		f.canonical = true
		return &f, nil
	}))
	must(r.RegisterScorer(ScorerQueue, func(p Params, env Env) (Scorer, error) {
		return &QueueScorer{HalfLife: env.HalfLife}, noParams(ScorerQueue, p)
	}))
	must(r.RegisterScorer(ScorerRunning, func(p Params, env Env) (Scorer, error) {
		return &RunningScorer{HalfLife: env.HalfLife}, noParams(ScorerRunning, p)
	}))
	must(r.RegisterScorer(ScorerKVCache, func(p Params, env Env) (Scorer, error) {
		return &KVCacheScorer{HalfLife: env.HalfLife}, noParams(ScorerKVCache, p)
	}))
	must(r.RegisterScorer(ScorerLoRA, func(p Params, _ Env) (Scorer, error) {
		return LoRAScorer{}, noParams(ScorerLoRA, p)
	}))
	must(r.RegisterScorer(ScorerTokenLoad, func(p Params, _ Env) (Scorer, error) {
		return TokenLoadScorer{}, noParams(ScorerTokenLoad, p)
	}))
	must(r.RegisterScorer(ScorerBurst, func(p Params, _ Env) (Scorer, error) {
		return BurstScorer{}, noParams(ScorerBurst, p)
	}))
	must(r.RegisterScorer(ScorerPrefill, NewPrefillScorerFromParams))
	must(r.RegisterScorer(ScorerPrefix, NewPrefixScorerFromParams))
	must(r.RegisterScorer(ScorerLatency, NewLatencyScorerFromParams))
	must(r.RegisterFilter(FilterSLO, NewSLOFilterFromParams))
	return r
}
