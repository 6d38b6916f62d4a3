package sim

import (
	"encoding/binary"
	"slices"

	"github.com/inferroute/inferroute/signals/prefix"
)

// BytesPerToken is the length of synthetic text per prompt token: about four
// bytes of English per token for Llama-family BPE tokenizers (OpenAI's
// tokenizer guide gives "1 token ≈ 4 characters of common English text").
// With the library's default hash block of 64 bytes, a 16-token content block
// is exactly four hash blocks.
const BytesPerToken = 4

// hashTokens is the number of prompt tokens per prefix hash: the default
// hash block of the library's hasher (64 bytes) at BytesPerToken, 16 tokens,
// vLLM's default KV block.
const hashTokens = prefix.DefaultBlockBytes / BytesPerToken

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

// corpus2 is the corpus twice over, so that any cyclic read of up to
// corpusBytes bytes from an offset in the corpus is one contiguous slice.
var corpus2 = append(corpus[:corpusBytes:corpusBytes], corpus...)

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

// letters spells the eight 4-bit digits of x, least significant first,
// as the letters a–p, one byte each, in a little-endian word: the nibbles
// are spread to one per byte by the shift-and-mask steps of a bit
// interleave (Warren, "Hacker's Delight", 2nd ed., §7-2), then offset to
// 'a'.
func letters(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	v = (v | v<<8) & 0x00ff00ff00ff00ff
	v = (v | v<<4) & 0x0f0f0f0f0f0f0f0f
	return v + 0x6161616161616161
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
	dst = slices.Grow(dst, n)
	l := len(dst)
	fillBlockText(dst[l:l+n], id)
	return dst[:l+n]
}

// fillBlockText fills b with the first len(b) bytes of the text of content
// block id (see appendBlockText).
func fillBlockText(b []byte, id uint64) {
	h := splitmix64(id)
	var tag [tagLen]byte
	binary.LittleEndian.PutUint64(tag[:8], letters(uint32(h)))
	binary.LittleEndian.PutUint64(tag[8:], letters(uint32(h>>32)))
	if len(b) == 64 {
		// The common case, a 16-token block: fixed-size moves, no calls.
		off := splitmix64(h) % corpusBytes
		*(*[tagLen]byte)(b) = tag
		*(*[64 - tagLen]byte)(b[tagLen:]) = *(*[64 - tagLen]byte)(corpus2[off:])
		return
	}
	if copy(b, tag[:]) < tagLen {
		return
	}
	b = b[tagLen:]
	// The corpus is read cyclically from the offset, so the offset does not
	// depend on n; every corpusBytes bytes the read is back at off.
	off := int(splitmix64(h) % corpusBytes)
	for len(b) > 0 {
		b = b[copy(b, corpus2[off:off+min(len(b), corpusBytes)]):]
	}
}

// promptText materialises the deterministic synthetic text of a request's
// content blocks and hashes it with the library's own prefix hasher, so the
// real prefix index sees realistic chained hashes. A block's text is cut
// from a shared corpus (appendBlockText), which is cheaper than looking it
// up in a per-block cache, so nothing is cached per block: the text is
// written in place into one reused buffer. Not safe for concurrent use.
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
	p.buf = slices.Grow(p.buf[:0], total)[:total]
	pos := 0
	for _, id := range blocks {
		n := min(size, total-pos)
		fillBlockText(p.buf[pos:pos+n], id)
		if pos += n; pos >= total {
			break
		}
	}
	return p.hasher.HashText(dst, model, adapter, p.buf)
}
