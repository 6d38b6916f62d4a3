package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/inferroute/inferroute/picker"
)

// ErrModelNotFound is wrapped by Table.Route's error for a model the table
// does not know; a router answers 404 with code model_not_found.
var ErrModelNotFound = errors.New("model not found")

// Pool is a set of interchangeable endpoints behind one Picker.
type Pool struct {
	// Name identifies the pool in the table, logs and metrics.
	Name string
	// Picker chooses among the pool's endpoints; the owner keeps its
	// endpoints current with Picker.SetEndpoints.
	Picker *picker.Picker

	header http.Header // PoolConfig.Header, canonical keys
}

// Route is where a request goes: the pool, and what the picker and the
// upstream see of the model.
type Route struct {
	// Pool is the pool whose picker chooses the endpoint. Never nil in a
	// Route returned by a Table.
	Pool *Pool
	// ClientModel is the model name the client asked for; "" on the
	// fallback route.
	ClientModel string
	// Model is the served base model, signals.Request.Model: what the
	// endpoints' EndpointSpec.Model names.
	Model string
	// Adapter is the LoRA adapter the request needs, "" for the base model.
	Adapter string
	// Upstream, when not "", replaces the body's model value before the
	// request is sent; responses then have their "model" field rewritten
	// back to ClientModel.
	Upstream string
	// Fallback reports that the request had no routable model and took
	// the fallback route.
	Fallback bool
}

// Rewrites reports whether the route changes the model name on the way up
// and back.
func (r Route) Rewrites() bool { return r.Upstream != "" && r.Upstream != r.ClientModel }

// PoolConfig declares one pool and the model names that route to it.
type PoolConfig struct {
	// Name is the pool's unique name.
	Name string
	// Picker chooses among the pool's endpoints. Required.
	Picker *picker.Picker
	// Models are the served model names of the pool; each routes here
	// unchanged, with no adapter.
	Models []string
	// Adapters maps LoRA adapter names to their base model, one of Models
	// when Models lists any: a request for an adapter routes here with
	// signals.Request.Adapter set and signals.Request.Model the base. The body is sent unchanged (model
	// servers such as vLLM serve an adapter under its own name).
	Adapters map[string]string
	// Aliases maps client-facing names to a model or adapter of this pool;
	// the request body is rewritten to the target and responses back.
	Aliases map[string]string
	// Header sets fields on every request sent to the pool's endpoints,
	// replacing the client's field of the same name; a field with no
	// values removes the client's. It is for what the gateway holds and
	// the client must not choose, such as the credential of model servers
	// started with vLLM's --api-key (Authorization: Bearer <key>). Names
	// must be tokens and values free of control characters; hop-by-hop
	// fields, the body's framing (Host, Content-Length, Content-Encoding,
	// Transfer-Encoding) and Via, by which the router detects loops,
	// cannot be set.
	Header http.Header
}

// TableConfig declares a routing table.
type TableConfig struct {
	// Pools are the pools; at least one is required.
	Pools []PoolConfig
	// Default names the default pool; "" means the first pool.
	Default string
	// Fallback names the pool for requests with no model field, non-JSON
	// bodies and GETs; "" means the default pool.
	Fallback string
	// Created is the "created" time reported by /v1/models; zero means
	// the Unix epoch.
	Created time.Time
	// OwnedBy is the "owned_by" of /v1/models entries; "" means "inferroute".
	OwnedBy string
}

// Table maps model names to routes. It is immutable once built and safe for
// concurrent use; replace a Table rather than changing it (Proxy.SetTable).
// Lookups are one map access, so hundreds of models cost nothing extra.
type Table struct {
	routes   map[string]Route
	pools    []*Pool
	byName   map[string]*Pool
	def      *Pool
	fallback Route
	models   []byte            // the /v1/models response
	entries  map[string][]byte // each model's entry of it, for /v1/models/{model}
	names    []string          // the names of models' entries, in its order
}

// NewTable builds a table. It fails when no pool is given, a pool has no
// name or picker or a Header field it may not set, a name is declared
// twice (also across pools), an adapter
// has no base model or one outside its pool's Models (when it lists any),
// an alias points outside its pool, or Default/Fallback name an unknown
// pool.
func NewTable(cfg TableConfig) (*Table, error) {
	if len(cfg.Pools) == 0 {
		return nil, errors.New("router: table needs at least one pool")
	}
	t := &Table{routes: make(map[string]Route), byName: make(map[string]*Pool)}
	owned := cfg.OwnedBy
	if owned == "" {
		owned = "inferroute"
	}
	created := int64(0)
	if !cfg.Created.IsZero() {
		created = cfg.Created.Unix()
	}
	list := []modelEntry{} // "data":[] for a table of no models, not null
	add := func(name string, rt Route, e modelEntry) error {
		if name == "" {
			return fmt.Errorf("router: pool %q: empty model name", rt.Pool.Name)
		}
		if prev, dup := t.routes[name]; dup {
			return fmt.Errorf("router: model %q is declared twice (pools %q and %q)", name, prev.Pool.Name, rt.Pool.Name)
		}
		rt.ClientModel = name
		t.routes[name] = rt
		e.ID, e.Object, e.Created, e.OwnedBy = name, "model", created, owned
		list = append(list, e)
		return nil
	}
	for i, pc := range cfg.Pools {
		if pc.Name == "" {
			return nil, fmt.Errorf("router: pools[%d]: empty name", i)
		}
		if pc.Picker == nil {
			return nil, fmt.Errorf("router: pool %q: nil picker", pc.Name)
		}
		if _, dup := t.byName[pc.Name]; dup {
			return nil, fmt.Errorf("router: pool %q is declared twice", pc.Name)
		}
		pool := &Pool{Name: pc.Name, Picker: pc.Picker}
		if len(pc.Header) > 0 {
			var err error
			if pool.header, err = poolHeader(pc.Header); err != nil {
				return nil, fmt.Errorf("router: pool %q: %w", pc.Name, err)
			}
		}
		t.pools = append(t.pools, pool)
		t.byName[pc.Name] = pool
		for _, m := range pc.Models {
			if err := add(m, Route{Pool: pool, Model: m}, modelEntry{Root: m}); err != nil {
				return nil, err
			}
		}
		for _, a := range sortedKeys(pc.Adapters) {
			base := pc.Adapters[a]
			switch {
			case base == "":
				return nil, fmt.Errorf("router: pool %q: adapter %q has no base model", pc.Name, a)
			case len(pc.Models) > 0 && !slices.Contains(pc.Models, base):
				return nil, fmt.Errorf("router: pool %q: adapter %q has base model %q, which is not a model of the pool", pc.Name, a, base)
			}
			parent := base
			if err := add(a, Route{Pool: pool, Model: base, Adapter: a}, modelEntry{Root: a, Parent: &parent}); err != nil {
				return nil, err
			}
		}
		for _, alias := range sortedKeys(pc.Aliases) {
			target := pc.Aliases[alias]
			rt := Route{Pool: pool, Model: target, Upstream: target}
			switch {
			case slices.Contains(pc.Models, target):
			case pc.Adapters[target] != "":
				rt.Model, rt.Adapter = pc.Adapters[target], target
			default:
				return nil, fmt.Errorf("router: pool %q: alias %q targets %q, which is not a model or adapter of the pool", pc.Name, alias, target)
			}
			if err := add(alias, rt, modelEntry{Root: target}); err != nil {
				return nil, err
			}
		}
	}
	t.def = t.pools[0]
	if cfg.Default != "" {
		if t.def = t.byName[cfg.Default]; t.def == nil {
			return nil, fmt.Errorf("router: default pool %q is not declared", cfg.Default)
		}
	}
	fb := t.def
	if cfg.Fallback != "" {
		if fb = t.byName[cfg.Fallback]; fb == nil {
			return nil, fmt.Errorf("router: fallback pool %q is not declared", cfg.Fallback)
		}
	}
	t.fallback = Route{Pool: fb, Fallback: true}
	var err error
	if t.models, err = json.Marshal(modelList{Object: "list", Data: list}); err != nil {
		return nil, err
	}
	t.entries = make(map[string][]byte, len(list))
	t.names = make([]string, len(list))
	for i, e := range list {
		if t.entries[e.ID], err = json.Marshal(e); err != nil {
			return nil, err
		}
		t.names[i] = e.ID
	}
	return t, nil
}

// modelsAllowed returns the body of GET /v1/models with the entries of
// the names whose route allow accepts, in declaration order: ModelsJSON
// byte for byte when it accepts all.
func (t *Table) modelsAllowed(allow func(Route) bool) []byte {
	b := make([]byte, 0, len(t.models))
	b = append(b, `{"object":"list","data":[`...)
	n := 0
	for _, name := range t.names {
		if !allow(t.routes[name]) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, t.entries[name]...)
		n++
	}
	return append(b, "]}"...)
}

// modelList is the OpenAI list shape of GET /v1/models (with vLLM's root and
// parent fields, see shared/fixtures/openai/llm-d-inference-sim/models.response.json).
type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Lookup returns the route of a model name.
func (t *Table) Lookup(model string) (Route, bool) {
	rt, ok := t.routes[model]
	return rt, ok
}

// Route returns the route of a parsed request: the model's route, or the
// fallback route when the request has no JSON body or no model field. An
// unknown model is an error wrapping ErrModelNotFound.
func (t *Table) Route(p *Parsed) (Route, error) {
	if !p.JSON || !p.HasModel() {
		return t.fallback, nil
	}
	rt, ok := t.routes[p.Model]
	if !ok {
		return Route{}, fmt.Errorf("%w: %q", ErrModelNotFound, p.Model)
	}
	return rt, nil
}

// Fallback returns the route of requests without a model.
func (t *Table) Fallback() Route { return t.fallback }

// Default returns the default pool.
func (t *Table) Default() *Pool { return t.def }

// Pools returns the pools in declaration order. The slice must not be
// modified.
func (t *Table) Pools() []*Pool { return t.pools }

// Pool returns the pool of that name, or nil.
func (t *Table) Pool(name string) *Pool { return t.byName[name] }

// ModelsJSON returns the body of GET /v1/models: every declared model,
// adapter and alias in the OpenAI list shape, in declaration order. The
// slice is shared and must not be modified.
func (t *Table) ModelsJSON() []byte { return t.models }

// ModelJSON returns the body of GET /v1/models/{model}, OpenAI's
// retrieve-model call: the model's entry of ModelsJSON, or false when the
// table declares no model, adapter or alias of that name. The slice is
// shared and must not be modified.
func (t *Table) ModelJSON(model string) ([]byte, bool) {
	b, ok := t.entries[model]
	return b, ok
}

// poolHeader checks PoolConfig.Header and returns its copy with canonical
// keys, which the requests sent to the pool share and never modify.
func poolHeader(h http.Header) (http.Header, error) {
	out := make(http.Header, len(h))
	for k, v := range h {
		ck, ok := fieldKey(k)
		if !ok {
			return nil, fmt.Errorf("header %q is not a valid header field name", k)
		}
		switch {
		case isHopHeader(ck), ck == "Host", ck == "Content-Length", ck == "Content-Encoding", ck == "Via":
			return nil, fmt.Errorf("header %q cannot be set on the requests sent to a pool", k)
		}
		if _, dup := out[ck]; dup {
			return nil, fmt.Errorf("header %q is given twice", k)
		}
		for _, s := range v {
			if !validFieldValue(s) {
				return nil, fmt.Errorf("header %q has a control character in its value", k)
			}
		}
		out[ck] = slices.Clip(slices.Clone(v))
	}
	return out, nil
}
