// Package prefix gives inferroute its prefix-cache affinity signal: it turns
// a request's prompt into chained block hashes (Hasher) and keeps an
// approximate index of which endpoints hold which prompt prefixes in their
// KV cache (Index), so that a request can be sent back to a pod that would
// skip recomputing most of its prompt.
//
// # Blocks
//
// A prompt is rendered stably (HashBody reads OpenAI chat, completions,
// responses and embeddings bodies with a single scan; a Prompt holds the
// rendered text, so that a body can be read before its route is known and
// hashed after, and Fields walks a body's top-level fields with the same
// scanner for the router) and cut into
// fixed-size blocks: 64 bytes of text, about 16 tokens, or 16 token ids when
// the body carries ids. Each block's hash covers every block before it and
// is seeded with the model, the LoRA adapter and an optional salt, the
// scheme vLLM's automatic prefix caching uses for its KV blocks. Two prompts
// share a prefix of k blocks exactly when their first k hashes are equal.
//
// # Index
//
// Index implements signals.PrefixMatcher and signals.Observer. It records a
// request's blocks on the endpoint it was dispatched to, so a burst that
// shares a prefix sees the first placement at once, confirms them when the
// request completes (or drops them when it failed before its first token
// and no other request in flight recorded them), and forgets an endpoint's blocks when the endpoint
// restarts or goes down (a new signals.Endpoint.Generation, noticed through
// signals.RestartEpoch) or leaves the pool (Index.Retain or Index.Forget,
// called by whoever owns the pool). Each endpoint has a block capacity
// taken from its scraped KV-cache size, with LRU eviction per endpoint. The
// index keeps one entry per (block, endpoint) pair, millions of them, in
// open-addressing tables of 16-byte slots of its own (about 50 bytes per
// entry, where the github.com/hashicorp/golang-lru/v2 LRU of the first
// version took 155). Memory is bounded by the endpoints' capacities and
// reported by Index.Stats and, given a meter, as OpenTelemetry gauges.
//
// # Matching
//
// Index.Lookup resolves how much of a prompt every endpoint holds, by
// bisection over the prompt's indexed blocks with one table lookup per
// probe and word-wide operations on bitsets of endpoint slots, into a
// caller-owned Matches: a few groups of (matched fraction, slots). Its cost
// is O(blocks of the prompt), in practice O(log blocks) lookups per
// distinct match length, and does not depend on the number of endpoints
// beyond slots/64 words per bitset operation; it reads no per-endpoint
// memory and does not allocate once the Matches is warm. Matches.Fill
// writes the fractions of a candidate list into a dense slice, O(len of the
// list) with no per-endpoint reads, and Matches.Fraction reads one
// endpoint's. Index.Match, the picker's PrefixMatcher call, is Lookup then
// Fill over the candidates.
//
// # Assembly
//
// On amd64 the prompt path's two hot loops are assembly: the block hash
// (hash_amd64.s, 41 instructions per 64-byte block where the compiled Go
// took about 70) and the JSON string scan that finds the next quote or
// backslash and copies the plain bytes before it in one SSE2 pass
// (scan_amd64.s, where the Go version searches for each byte separately).
// Each has a Go twin with the same results, used on other architectures
// and under the purego build tag, and fuzz tests that hold the two equal.
//
// # Use
//
//	h := prefix.NewHasher(prefix.HashConfig{})
//	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
//	p, _ := picker.New(cfg, picker.WithPrefixMatcher(ix)) // ix also observes
//	blocks, n, err := h.HashBody(nil, model, adapter, body)
//	req := &signals.Request{Model: model, PromptBlocks: blocks, PromptTokens: n / prefix.BytesPerToken}
//
//	var m prefix.Matches // one per goroutine, reused
//	ix.Lookup(req, &m)
//	m.Fill(candidates, fractions)
package prefix
