// Package prefix gives inferroute its prefix-cache affinity signal: it turns
// a request's prompt into chained block hashes (Hasher) and keeps an
// approximate index of which endpoints hold which prompt prefixes in their
// KV cache (Index), so that a request can be sent back to a pod that would
// skip recomputing most of its prompt.
//
// # Blocks
//
// A prompt is rendered stably (HashBody reads OpenAI chat, completions,
// responses and embeddings bodies with a single scan) and cut into
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
// request completes, and forgets an endpoint's blocks when the endpoint
// leaves, restarts or goes down (signals.Endpoint.Generation). Each endpoint
// has a block capacity taken from its scraped KV-cache size, with LRU
// eviction per endpoint. Match costs O(blocks) plus O(endpoints), not their
// product, and does not allocate.
package prefix
