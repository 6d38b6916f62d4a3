package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals"
)

// Policy chooses the endpoint that serves each request of a simulation run.
//
// Pick chooses one of eps for req and returns it with a Done callback. eps is
// owned by the caller and must not be modified or retained; it is the same
// slice (same backing array) for every call of a run unless the fleet
// changes. req is read-only and must not be retained after Done. Pick must
// not block. It returns an error only when no endpoint can be chosen (for
// example eps is empty); the simulator then counts the request as failed.
//
// Policies are driven by a single simulator goroutine and need not be safe
// for concurrent use, though the baselines here are.
type Policy interface {
	// Name returns the policy's registry name.
	Name() string
	// Pick chooses an endpoint for req among eps.
	Pick(ctx context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error)
}

// Choice is the result of one Pick.
type Choice struct {
	// Endpoint is the chosen endpoint, one of the eps given to Pick.
	Endpoint *signals.Endpoint
	// Done reports the request's outcome. The simulator calls it exactly
	// once, when the request completes or fails. Never nil.
	Done func(signals.Outcome)
	// FirstToken, if not nil, is called when the request's first token is
	// produced (before Done), as a proxy reports the first response byte.
	FirstToken func()
}

// Env is what a Factory gets to build a policy for one simulation run.
type Env struct {
	// Endpoints is the run's fleet, in pod order. Owned by the simulator;
	// read-only.
	Endpoints []*signals.Endpoint
	// Clock is the run's virtual clock; nil means signals.SystemClock.
	Clock signals.Clock
	// Seed seeds the policy's randomness; runs with equal seeds are equal.
	Seed uint64
	// Logger receives diagnostics; nil means discard.
	Logger *slog.Logger
	// Inspector reads the simulated pods' live state without lag. Only
	// policies that model perfect knowledge (an oracle) may use it; nil when
	// the host is not a simulator.
	Inspector Inspector
}

// Inspector gives lag-free, read-only access to the simulated fleet: what a
// perfect-information oracle knows. The simulator implements it. Its methods
// are valid only during a call of Pick, on the simulator's goroutine, and
// what they return must not be modified or retained.
type Inspector interface {
	// Pod returns the live state of the pod behind ep, and false if ep is
	// not one of the simulated pods.
	Pod(ep *signals.Endpoint) (PodView, bool)
	// EngineRequest returns the engine request the simulator will submit for
	// req if it is routed now (content block ids, lengths, adapter), or nil
	// when req is not the request being picked.
	EngineRequest(req *signals.Request) *engine.Request
}

// PodView is the live state of one simulated pod.
type PodView struct {
	// Engine is the pod's engine model. Read-only: call only methods that do
	// not change it (Stats, Idle).
	Engine *engine.Engine
	// Config is the engine's configuration, including its hardware profile.
	Config engine.Config
	// InTransit counts requests routed to the pod that the network has not
	// delivered to its engine yet.
	InTransit int
}

// Factory builds a policy for one simulation run.
type Factory func(env Env) (Policy, error)

// ErrNoEndpoints is returned by Pick when eps is empty.
var ErrNoEndpoints = errors.New("policy: no endpoints")

// Registry maps policy names to factories. The zero value is empty and
// ready to use. A Registry is not safe for concurrent mutation; lookups may
// run concurrently once registration is over.
type Registry struct {
	factories map[string]Factory
}

// Register adds a factory under name. It returns an error when name is
// empty, f is nil, or name is already registered.
func (r *Registry) Register(name string, f Factory) error {
	switch {
	case name == "":
		return errors.New("policy: empty name")
	case f == nil:
		return fmt.Errorf("policy: nil factory for %q", name)
	}
	if _, dup := r.factories[name]; dup {
		return fmt.Errorf("policy: %q already registered", name)
	}
	if r.factories == nil {
		r.factories = make(map[string]Factory)
	}
	r.factories[name] = f
	return nil
}

// New builds the policy registered under name for env.
func (r *Registry) New(name string, env Env) (Policy, error) {
	f, ok := r.factories[name]
	if !ok {
		return nil, fmt.Errorf("policy: unknown policy %q (known: %v)", name, r.Names())
	}
	return f(env)
}

// Lookup returns the factory registered under name.
func (r *Registry) Lookup(name string) (Factory, bool) {
	f, ok := r.factories[name]
	return f, ok
}

// Names returns the registered names, sorted. The caller owns the slice.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Names of the baseline policies.
const (
	RoundRobin   = "round-robin"
	Random       = "random"
	LeastRequest = "least-request"
	Inferroute   = "inferroute"
)

// Baselines returns the baseline names in the order reports list them.
func Baselines() []string {
	return []string{RoundRobin, Random, LeastRequest, Inferroute}
}

// Default returns a new registry holding the baseline policies, the peers
// (Peers) and the oracle. Callers may register more on the returned value.
func Default() *Registry {
	r := &Registry{}
	for _, b := range []struct {
		name string
		f    Factory
	}{
		{RoundRobin, NewRoundRobin},
		{Random, NewRandom},
		{LeastRequest, NewLeastRequest},
		{Inferroute, NewInferroute},
	} {
		if err := r.Register(b.name, b.f); err != nil {
			panic(err) // unreachable: the names above are distinct
		}
	}
	if err := registerPeers(r); err != nil {
		panic(err) // unreachable: the peers' names are distinct from the baselines'
	}
	return r
}
