// Package benchmarks is inferroute's evidence: a harness that drives the
// real picker through a simulated fleet of model servers.
//
//   - engine: a vLLM V1-like engine model of one pod in virtual time
//     (continuous batching, chunked prefill, paged KV with preemption,
//     prefix caching, LoRA slots), calibrated per GPU;
//   - workload: trace replay (Mooncake, Azure) and generators (Poisson,
//     Gamma, on/off bursts, tenants with shared system prompts, multi-turn
//     conversations, LoRA popularity);
//   - policy: the routing-policy interface, a registry by name, and the
//     baselines (round-robin, random, least-request, inferroute's default
//     picker);
//   - sim: the discrete-event fleet simulator, capacity measurement, the
//     default suite of scenarios and its report;
//   - cmd/routebench: the command that runs the suite and prints the table.
//
// Run the suite with
//
//	go run ./benchmarks/cmd/routebench          # default suite, about 40 s on two cores
//	go run ./benchmarks/cmd/routebench -quick   # scaled-down suite
package benchmarks
