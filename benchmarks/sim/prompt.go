package sim

import (
	"slices"

	"github.com/inferroute/inferroute/signals/prefix"
)

// BytesPerToken is the length of synthetic text per prompt token: about four
// bytes of English per token for Llama-family BPE tokenizers (OpenAI's
// tokenizer guide gives "1 token ≈ 4 characters of common English text").
// With the library's default hash block of 64 bytes, a 16-token content block
// is exactly four hash blocks.
const BytesPerToken = 4

// words are the vocabulary of the synthetic prompt text.
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

// corpusBytes is the size of the pseudo-word corpus blocks are cut from:
// small enough to stay in the L1 cache, since the distinctness of blocks
// comes from their tags, not from the corpus.
const corpusBytes = 1 << 12

// corpus is 4 KB of pseudo-words drawn from words by a SplitMix64 stream
// with a fixed seed.
var corpus = func() []byte {
	c := make([]byte, 0, corpusBytes+16)
	x := uint64(0x636f_7270_7573) // "corpus"
	for len(c) < corpusBytes {
		x++
		c = append(c, words[splitmix64(x)%uint64(len(words))]...)
		c = append(c, ' ')
	}
	return c[:corpusBytes]
}()

// tagLen is the length of the id tag that starts every block's text.
const tagLen = 16

// splitmix64 is the output function of Vigna's SplitMix64 generator
// (https://prng.di.unimi.it/splitmix64.c): a bijection on uint64 with good
// avalanche.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// appendBlockText appends n bytes of the synthetic text of content block id
// to dst. The text is a 16-letter tag spelling h = splitmix64(id) in the
// letters a–p (one per 4 bits, so distinct ids always have distinct text,
// splitmix64 being a bijection), followed by the corpus from an offset
// chosen by h. The text of a block does not depend on n beyond its length,
// so a partial last block is a prefix of the full one. Generating it costs a
// hash and a copy, less than hashing it, so hashing the prompt stays the
// main cost as in a gateway.
func appendBlockText(dst []byte, id uint64, n int) []byte {
	if n <= 0 {
		return dst
	}
	h := splitmix64(id)
	var tag [tagLen]byte
	for i := range tag {
		tag[i] = 'a' + byte(h>>(4*i))&0xf
	}
	if n <= tagLen {
		return append(dst, tag[:n]...)
	}
	dst = append(dst, tag[:]...)
	// The corpus is read cyclically from the offset, so the offset does not
	// depend on n.
	off := int(splitmix64(h) % corpusBytes)
	for rest := n - tagLen; rest > 0; off = 0 {
		k := min(rest, corpusBytes-off)
		dst = append(dst, corpus[off:off+k]...)
		rest -= k
	}
	return dst
}

// promptText materialises the deterministic synthetic text of a request's
// content blocks and hashes it with the library's own prefix hasher, so the
// real prefix index sees realistic chained hashes. A block's text is cut
// from a shared corpus (appendBlockText), which is cheaper than looking it
// up in a per-block cache, so nothing is cached per block. Not safe for
// concurrent use.
type promptText struct {
	hasher *prefix.Hasher
	buf    []byte
}

func newPromptText() *promptText {
	return &promptText{hasher: prefix.NewHasher(prefix.HashConfig{})}
}

// hash appends to dst the chained block hashes of the prompt made of the
// given content blocks, promptTokens long (the last block may be partial),
// seeded by model and adapter, and returns it.
func (p *promptText) hash(dst []uint64, model, adapter string, blocks []uint64, blockTokens, promptTokens int) []uint64 {
	if len(blocks) == 0 || blockTokens <= 0 {
		return dst
	}
	size := blockTokens * BytesPerToken
	total := len(blocks) * size
	if n := promptTokens * BytesPerToken; n > 0 && n < total {
		total = n
	}
	p.buf = slices.Grow(p.buf[:0], total)
	for _, id := range blocks {
		p.buf = appendBlockText(p.buf, id, min(size, total-len(p.buf)))
		if len(p.buf) >= total {
			break
		}
	}
	return p.hasher.HashText(dst, model, adapter, p.buf)
}
