// Package workload produces the request streams that the routebench fleet
// simulator replays: real traces (Mooncake, Azure LLM inference 2023) and
// synthetic generators (Poisson, Gamma with a chosen coefficient of
// variation, on/off bursts, multi-tenant shared system prompts, multi-turn
// conversations whose prompts grow turn by turn, LoRA adapters with Zipf
// popularity).
//
// A Workload is a list of Requests sorted by arrival offset. A request's
// prompt is described by content-block ids rather than text: two requests
// whose Blocks agree on their first k ids share a k-block prefix (a system
// prompt, a conversation's history), and ids unique to one request stand for
// its own text. The simulator turns ids into deterministic synthetic text
// so that the library's own prefix hashing runs on it.
//
// Block ids live in disjoint name spaces (the top byte of the id says where
// an id came from: a Mooncake trace, an Azure trace, a generator), so that
// merging a trace with generated traffic never aliases prompts by accident.
//
// The trace readers accept files in the same formats as the copies in
// ../shared/traces (see PROVENANCE.md there), so a user's own trace works
// from the command line. They cap line length (MaxLineBytes), row count
// (MaxRows) and token counts (MaxTokens) and report malformed input as a
// *ParseError carrying the line number.
//
// Everything is deterministic: generators draw from math/rand/v2 PCG
// streams derived from GenConfig.Seed, and nothing reads the wall clock.
// Workloads are plain values; methods that return a *Workload return a new
// one and never modify the receiver, but they share the receiver's Blocks
// slices, which all code must treat as read-only.
package workload
