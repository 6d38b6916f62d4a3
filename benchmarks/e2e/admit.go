package e2e

import (
	"context"
	"fmt"
	"time"

	"github.com/inferroute/inferroute/scorer"
)

// SaturationAdmitter sheds sheddable requests (priority < 0) when every
// candidate is saturated: its queue depth is at or over QueueThreshold, or
// its KV cache utilisation at or over KVThreshold. It is the Gateway API
// Inference Extension's saturation detector (pkg/epp/saturationdetector:
// "the pool is saturated when no pod has queue depth and KV cache
// utilisation under their thresholds", defaults 5 waiting requests and
// 0.8), read through the library's lag-corrected signals. Critical and
// default requests are always admitted.
//
// A SaturationAdmitter is safe for concurrent use and does not allocate.
type SaturationAdmitter struct {
	// QueueThreshold is the queue depth at which a pod is saturated; 0
	// means 5.
	QueueThreshold float64
	// KVThreshold is the KV-cache utilisation at which a pod is saturated;
	// 0 means 0.8.
	KVThreshold float64
	// HalfLife ages scraped values (picker.DefaultHalfLife in the gateway).
	HalfLife time.Duration
}

var _ scorer.Admitter = (*SaturationAdmitter)(nil)

// Admit implements scorer.Admitter.
func (a *SaturationAdmitter) Admit(_ context.Context, in *scorer.Input) (bool, string) {
	if in.Request == nil || in.Request.Priority >= 0 || len(in.Endpoints) == 0 {
		return true, ""
	}
	qt, kt := a.QueueThreshold, a.KVThreshold
	if qt <= 0 {
		qt = 5
	}
	if kt <= 0 {
		kt = 0.8
	}
	for _, ep := range in.Endpoints {
		kv, _ := ep.KVCacheUtilization(in.Now, a.HalfLife)
		if ep.QueueDepth(in.Now, a.HalfLife) < qt && kv < kt {
			return true, ""
		}
	}
	return false, fmt.Sprintf("sheddable request: all %d endpoints saturated (queue ≥ %g or KV ≥ %g)", len(in.Endpoints), qt, kt)
}
