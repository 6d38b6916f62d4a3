// Package e2e measures inferroute end to end over real HTTP: an open-loop
// load generator streams requests through a gateway built from the library
// (router.Proxy, the picker, the scraper, the prefix index and the latency
// predictor) to emulated vLLM pods (benchmarks/emulator), and measures what
// clients see.
//
//   - Compare runs the same Poisson workload on routebench's heterogeneous
//     fleet (2×H100 + 3×A100 + 3×L4) with round-robin and with the default
//     picker, over HTTP and in routebench's simulator, and reports the
//     client-side TTFT mean and p99 next to the simulated ones.
//   - Chaos kills and restarts pods during a run and counts requests lost
//     before their first byte (the gateway must retry them on a fallback),
//     streams cut mid-way (the client must be told), silently truncated
//     streams (must be none), and how long the gateway kept sending traffic
//     to a dead pod after its first connect error.
//   - Overload offers twice the fleet's capacity with critical and
//     sheddable requests and samples the process's goroutines and heap: the
//     sheddable requests must get 429 with Retry-After, the critical ones
//     must be served, and memory must stay bounded.
//
// Short versions run as ordinary tests; the full-length runs are the
// e2ebench command (benchmarks/e2e/cmd/e2ebench). Every server listens on
// 127.0.0.1, and every run is bounded in requests and time.
package e2e
