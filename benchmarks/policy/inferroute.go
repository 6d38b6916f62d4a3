package policy

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
)

var _ Policy = (*inferroute)(nil)

// NewInferroute returns inferroute's default picker as a policy: the real
// picker.New(picker.DefaultConfig(), ...) on the run's virtual clock and
// seed, with the library's prefix index and latency predictor, exactly as a
// gateway would build it. The picker's endpoint snapshot is swapped
// (SetEndpoints) whenever Pick is given a different fleet.
func NewInferroute(env Env) (Policy, error) {
	return NewPicker(Inferroute, picker.DefaultConfig(), env)
}

// NewPicker returns a policy named name that runs the library's picker with
// cfg, plus opts after the ones derived from env (clock, seed, logger, the
// prefix index and the latency predictor). It is how a tuned or a user's
// configuration is benchmarked.
func NewPicker(name string, cfg picker.Config, env Env, opts ...picker.Option) (Policy, error) {
	logger := env.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	all, err := libraryOptions(cfg, env)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	all = append(all, picker.WithLogger(logger))
	if env.Clock != nil {
		all = append(all, picker.WithClock(env.Clock))
	}
	all = append(all, picker.WithSeed(env.Seed))
	all = append(all, opts...)
	p, err := picker.New(cfg, all...)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	pol := &inferroute{name: name, p: p}
	if len(env.Endpoints) > 0 {
		pol.setEndpoints(env.Endpoints)
	}
	return pol, nil
}

type inferroute struct {
	name string
	p    *picker.Picker
	// last identifies the fleet last given to SetEndpoints by its first
	// element's address and its length.
	lastFirst *signals.Endpoint
	lastLen   int
}

func (p *inferroute) Name() string { return p.name }

func (p *inferroute) setEndpoints(eps []*signals.Endpoint) {
	p.p.SetEndpoints(eps)
	p.lastFirst, p.lastLen = eps[0], len(eps)
}

func (p *inferroute) Pick(ctx context.Context, req *signals.Request, eps []*signals.Endpoint) (Choice, error) {
	if len(eps) == 0 {
		return Choice{}, ErrNoEndpoints
	}
	if len(eps) != p.lastLen || eps[0] != p.lastFirst {
		p.setEndpoints(eps)
	}
	res, err := p.p.Pick(ctx, req)
	if err != nil {
		return Choice{}, err
	}
	return Choice{Endpoint: res.Endpoint, Done: res.Done, FirstToken: res.FirstToken}, nil
}
