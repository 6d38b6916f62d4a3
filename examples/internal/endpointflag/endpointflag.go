// Package endpointflag reads the static endpoint list of the examples'
// commands (pickerd, eppd): their -endpoints and -gpus flags.
package endpointflag

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/inferroute/inferroute/signals"
)

// Usage texts for the flags Parse reads.
const (
	// EndpointsUsage describes -endpoints.
	EndpointsUsage = "comma-separated endpoints, each name=host:port or host:port"
	// GPUUsage describes -gpus.
	GPUUsage = "the endpoints' GPU, which gives the picker their speed: one name for all (h100), or comma-separated name=gpu pairs (a=h100,b=l4)"
)

// Parse reads an -endpoints value (name=host:port or host:port items,
// comma-separated; host:port as net.SplitHostPort reads it, IPv6 in
// brackets) and a -gpus value: empty, one GPU name for every endpoint, or
// name=gpu pairs for named endpoints (GPUUsage). Each endpoint gets engine
// and model, and signals.LabelGPU when it has a GPU, which gives the
// picker its speed. A bad address, an empty list, a GPU
// signals.GPURelativeSpeed does not know, and a pair naming no endpoint
// are errors.
func Parse(list, gpus, engine, model string) ([]*signals.Endpoint, error) {
	type spec struct{ name, addr string }
	var specs []spec
	names := map[string]bool{}
	for item := range strings.SplitSeq(list, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok {
			name, addr = "", item
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("endpoint %q: %w", item, err)
		}
		specs = append(specs, spec{name, addr})
		if name != "" {
			names[name] = true
		}
	}
	if len(specs) == 0 {
		return nil, errors.New("no endpoints: pass -endpoints with host:port or name=host:port items, comma-separated")
	}
	known := func(gpu string) error {
		if _, ok := signals.GPURelativeSpeed(gpu); !ok {
			return fmt.Errorf("-gpus: %q is not a GPU the picker knows (h100, h200, a100, l40s, l40, a10, l4, or their MIG slices)", gpu)
		}
		return nil
	}
	all := ""                     // one GPU for every endpoint
	byName := map[string]string{} // or one per named endpoint
	if g := strings.TrimSpace(gpus); g != "" && !strings.ContainsAny(g, "=,") {
		if err := known(g); err != nil {
			return nil, err
		}
		all = g
	} else {
		for item := range strings.SplitSeq(gpus, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			name, gpu, ok := strings.Cut(item, "=")
			name, gpu = strings.TrimSpace(name), strings.TrimSpace(gpu)
			if !ok || !names[name] {
				return nil, fmt.Errorf("-gpus: %q names no endpoint (want name=gpu, with name as in -endpoints name=host:port)", item)
			}
			if err := known(gpu); err != nil {
				return nil, err
			}
			byName[name] = gpu
		}
	}
	eps := make([]*signals.Endpoint, 0, len(specs))
	for _, s := range specs {
		sp := signals.EndpointSpec{Name: s.name, Address: s.addr, Engine: engine, Model: model}
		if gpu := cmp.Or(byName[s.name], all); gpu != "" {
			sp.Labels = map[string]string{signals.LabelGPU: gpu}
		}
		eps = append(eps, signals.NewEndpoint(sp))
	}
	return eps, nil
}
