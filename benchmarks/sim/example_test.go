package sim_test

import (
	"context"
	"fmt"

	"github.com/inferroute/inferroute/benchmarks/policy"
	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// Example runs 200 Poisson requests on four H100 pods with round-robin.
func Example() {
	pods, err := sim.Fleet(0, sim.H100, sim.H100, sim.H100, sim.H100)
	if err != nil {
		panic(err)
	}
	w, err := workload.Generate(workload.GenConfig{
		Name: "example", Seed: 1, N: 200,
		Arrivals: workload.Poisson{Rate: 20},
		Lengths:  sim.ShareGPTLengths,
	})
	if err != nil {
		panic(err)
	}
	m, err := sim.New().Run(context.Background(), sim.DefaultConfig(pods), w, policy.NewRoundRobin)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s completed %d of %d, per pod %v\n", m.Policy, m.Completed, m.Requests, m.PerPod)
	// Output: round-robin completed 200 of 200, per pod [50 50 50 50]
}
