package sim

import (
	"math/rand/v2"

	"github.com/inferroute/inferroute/signals/prefix"
)

// BytesPerToken is the length of synthetic text per prompt token: about four
// bytes of English per token for Llama-family BPE tokenizers (OpenAI's
// tokenizer guide gives "1 token ≈ 4 characters of common English text").
// With the library's default hash block of 64 bytes, a 16-token content block
// is exactly four hash blocks.
const BytesPerToken = 4

// words are the vocabulary of the synthetic prompt text. Only its
// determinism matters: equal content block ids give equal text, different
// ids give different text.
var words = [...]string{
	"the", "model", "router", "token", "cache", "prefix", "query", "answer",
	"system", "user", "a", "of", "to", "and", "in", "is", "that", "for",
	"with", "as", "on", "be", "this", "by", "from", "at", "or", "which",
	"code", "data", "value", "return", "function", "error", "request", "server",
	"latency", "batch", "queue", "memory", "block", "layer", "weight", "attention",
	"please", "explain", "write", "summarize", "list", "why", "how", "what",
	"python", "golang", "table", "report", "number", "time", "result", "input",
	"output", "context", "prompt", "tool",
}

// promptText materialises deterministic synthetic text per content block id
// and hashes a request's blocks with the library's own prefix hasher, so the
// real prefix index sees realistic chained hashes. Texts are cached per
// block id in a map bounded by maxBytes; when the bound is reached the map is
// dropped and refilled (the text is cheap to regenerate; hashing stays the
// main cost). Not safe for concurrent use.
type promptText struct {
	hasher   *prefix.Hasher
	cache    map[blockKey][]byte
	bytes    int
	maxBytes int
	buf      []byte
}

type blockKey struct {
	id     uint64
	tokens int
}

func newPromptText(maxBytes int) *promptText {
	if maxBytes <= 0 {
		maxBytes = 64 << 20
	}
	return &promptText{
		hasher:   prefix.NewHasher(prefix.HashConfig{}),
		cache:    make(map[blockKey][]byte),
		maxBytes: maxBytes,
	}
}

// block returns the synthetic text of content block id, blockTokens tokens
// long. The slice is owned by the cache and must not be modified.
func (p *promptText) block(id uint64, blockTokens int) []byte {
	k := blockKey{id, blockTokens}
	if t, ok := p.cache[k]; ok {
		return t
	}
	t := blockText(id, blockTokens*BytesPerToken)
	if p.bytes+len(t) > p.maxBytes {
		clear(p.cache)
		p.bytes = 0
	}
	p.cache[k] = t
	p.bytes += len(t)
	return t
}

// blockText returns n bytes of pseudo-words drawn from a PCG seeded by id.
func blockText(id uint64, n int) []byte {
	r := rand.New(rand.NewPCG(id, 0x5eed_b10c_7e47))
	t := make([]byte, 0, n+16)
	for len(t) < n {
		t = append(t, words[r.IntN(len(words))]...)
		t = append(t, ' ')
	}
	return t[:n]
}

// hash appends to dst the chained block hashes of the prompt made of the
// given content blocks, promptTokens long (the last block may be partial),
// seeded by model and adapter, and returns it.
func (p *promptText) hash(dst []uint64, model, adapter string, blocks []uint64, blockTokens, promptTokens int) []uint64 {
	if len(blocks) == 0 || blockTokens <= 0 {
		return dst
	}
	p.buf = p.buf[:0]
	for _, id := range blocks {
		p.buf = append(p.buf, p.block(id, blockTokens)...)
	}
	if n := promptTokens * BytesPerToken; n > 0 && n < len(p.buf) {
		p.buf = p.buf[:n]
	}
	return p.hasher.HashText(dst, model, adapter, p.buf)
}
