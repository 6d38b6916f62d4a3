package workload_test

import (
	"fmt"

	"github.com/inferroute/inferroute/benchmarks/workload"
)

// ExampleGenerate builds a small two-tenant workload with shared system
// prompts and rescales it to a target rate.
func ExampleGenerate() {
	w, err := workload.Generate(workload.GenConfig{
		Name:     "demo",
		Seed:     1,
		N:        1000,
		Arrivals: workload.Gamma{Rate: 5, CV: 3},
		Lengths:  workload.Fixed{Prompt: 256, Output: 64},
		Tenants: []workload.Tenant{
			{Name: "chat", Weight: 1, SystemPromptTokens: 768},
			{Name: "batch", Weight: 1, Priority: -1},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	s := w.Scale(20).Stats()
	fmt.Printf("%d requests, %.0f req/s, %d tenants\n", s.Requests, s.MeanRate, s.Tenants)
	fmt.Println(w.Requests[0].BlockTokens, "tokens per block")
	// Output:
	// 1000 requests, 20 req/s, 2 tenants
	// 16 tokens per block
}
