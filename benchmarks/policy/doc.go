// Package policy is the routing-policy interface of the routebench
// simulator, a registry of policies by name, and the policies compared:
// the baselines (round-robin, random, least-request), inferroute's default
// picker, re-implementations of the peers' published algorithms (llm-d,
// SGLang cache-aware and least-load, Dynamo's KV router, AIBrix
// prefix-cache; peers.go) and the perfect-information oracle (oracle.go).
//
// A Policy chooses one endpoint per request and returns a Done callback
// that the simulator calls exactly once with the simulated outcome. Policies
// are built per simulation run by a Factory from an Env: the run's fleet,
// its virtual clock, a seed, and, for policies that are allowed perfect
// knowledge (the oracle), an Inspector that
// reads the simulated pods' live state without scrape lag.
//
// Every policy keeps the endpoints' local accounting
// (signals.Endpoint.Dispatch on pick, Complete on Done) so that in-flight
// counts and scrape baselines mean the same thing whichever policy runs;
// inferroute's picker does this itself.
package policy
