package policy

import (
	"fmt"
	"time"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/latency"
	"github.com/inferroute/inferroute/signals/prefix"
)

// libraryOptions returns the picker options that plug the library's own
// prefix index (prefix.NewIndex with its defaults) and latency predictor
// (latency.New on the run's clock, its scrape half-life that of cfg) into a
// picker built for env, as a gateway would. Both are observers, so the
// picker feeds them every dispatch and completion by itself.
func libraryOptions(cfg picker.Config, env Env) ([]picker.Option, error) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		return nil, fmt.Errorf("prefix index: %w", err)
	}
	var clock signals.Clock = signals.SystemClock{}
	if env.Clock != nil {
		clock = env.Clock
	}
	halfLife := time.Duration(cfg.StalenessHalfLife)
	if halfLife == 0 {
		halfLife = picker.DefaultHalfLife
	}
	pred := latency.New(latency.Config{Clock: clock, HalfLife: halfLife})
	return []picker.Option{picker.WithPrefixMatcher(ix), picker.WithLatencyEstimator(pred)}, nil
}
