package emulator

import (
	"context"
	"fmt"
	"sync"

	"github.com/inferroute/inferroute/signals"
)

// Fleet is a set of pods started together in one process.
type Fleet struct {
	// Pods are the fleet's pods, in the order of the Options given to
	// StartFleet. The slice must not be modified.
	Pods []*Pod
}

// StartFleet starts one pod per Options, each on its own loopback port.
// Pods without a Name are named "<profile>-<index>". If any pod fails to
// start, the ones started are closed and the error is returned. The pods
// stop when ctx is done, on Close, or after their Lifetime.
func StartFleet(ctx context.Context, opts []Options) (*Fleet, error) {
	f := &Fleet{Pods: make([]*Pod, 0, len(opts))}
	for i, o := range opts {
		if o.Name == "" {
			prof := o.Profile
			if o.Engine.Profile.Name != "" {
				prof = o.Engine.Profile.Name
			}
			if prof == "" {
				prof = DefaultProfile
			}
			o.Name = fmt.Sprintf("%s-%d", prof, i)
		}
		p, err := Start(ctx, o)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("emulator: pod %d: %w", i, err)
		}
		f.Pods = append(f.Pods, p)
	}
	return f, nil
}

// Specs returns the endpoint description of every pod (Pod.Spec).
func (f *Fleet) Specs() []signals.EndpointSpec {
	out := make([]signals.EndpointSpec, len(f.Pods))
	for i, p := range f.Pods {
		out[i] = p.Spec()
	}
	return out
}

// Endpoints returns a new signals.Endpoint per pod, healthy and without
// metrics. Each call returns new endpoints; keep one set per picker.
func (f *Fleet) Endpoints() []*signals.Endpoint {
	out := make([]*signals.Endpoint, len(f.Pods))
	for i, p := range f.Pods {
		out[i] = signals.NewEndpoint(p.Spec())
	}
	return out
}

// Close closes every pod and waits for them. It is idempotent.
func (f *Fleet) Close() {
	var wg sync.WaitGroup
	for _, p := range f.Pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Close()
		}()
	}
	wg.Wait()
}
