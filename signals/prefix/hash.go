package prefix

import (
	"encoding/binary"
	"math/bits"
	"sync"
)

// Default hashing parameters.
const (
	// DefaultBlockBytes is the default size of a text block: 64 bytes of
	// rendered prompt, about 16 tokens at the usual ~4 bytes per token of
	// English BPE vocabularies (OpenAI's tokenizer guide: "one token generally
	// corresponds to ~4 characters of text").
	DefaultBlockBytes = 64
	// DefaultTokenBlock is the default number of token ids per block; it is
	// vLLM's default KV-cache block size (--block-size 16), so a block here is
	// the unit vLLM's automatic prefix caching hashes and reuses.
	DefaultTokenBlock = 16
	// DefaultMaxTokens is the prompt length the default block cap covers.
	DefaultMaxTokens = 128 * 1024
)

// HashConfig configures a Hasher. The zero value means the defaults:
// 64-byte text blocks, 16-token blocks, and enough blocks for a prompt of
// 128K tokens.
type HashConfig struct {
	// BlockBytes is the size of a text block in bytes; 0 means 64.
	BlockBytes int `json:"blockBytes,omitempty" yaml:"blockBytes,omitempty"`
	// TokenBlock is the number of token ids per block when a prompt is given
	// as token ids; 0 means 16.
	TokenBlock int `json:"tokenBlock,omitempty" yaml:"tokenBlock,omitempty"`
	// MaxBlocks caps the number of blocks hashed per prompt; the rest of a
	// longer prompt is ignored. 0 means DefaultMaxTokens/TokenBlock (8192
	// with the default token block), which covers 128K tokens.
	MaxBlocks int `json:"maxBlocks,omitempty" yaml:"maxBlocks,omitempty"`
	// Salt is mixed into every hash, like vLLM's per-request cache_salt: two
	// prompts with different salts never share a block.
	Salt string `json:"salt,omitempty" yaml:"salt,omitempty"`
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c HashConfig) withDefaults() HashConfig {
	if c.BlockBytes <= 0 {
		c.BlockBytes = DefaultBlockBytes
	}
	if c.TokenBlock <= 0 {
		c.TokenBlock = DefaultTokenBlock
	}
	if c.MaxBlocks <= 0 {
		c.MaxBlocks = (DefaultMaxTokens + c.TokenBlock - 1) / c.TokenBlock
	}
	return c
}

// Hasher cuts prompts into fixed-size blocks and returns their chained
// hashes: the hash of block i covers blocks 0..i, so two prompts share a
// prefix of k blocks exactly when their first k hashes are equal (up to
// 64-bit collisions). The chain is seeded with the model, the LoRA adapter
// and the salt, so the same text under another adapter shares nothing.
//
// Only full blocks are hashed, as vLLM's automatic prefix caching caches
// only full blocks (vLLM docs, "Automatic Prefix Caching" design); a prompt
// shorter than one block has no hashes.
//
// A Hasher's configuration is immutable and its methods are safe for
// concurrent use. A Hasher must not be copied after first use.
type Hasher struct {
	cfg     HashConfig
	prompts sync.Pool // *Prompt, scratch of HashBody
}

// NewHasher returns a Hasher for cfg; zero fields take their defaults.
func NewHasher(cfg HashConfig) *Hasher {
	return &Hasher{cfg: cfg.withDefaults()}
}

// Config returns the Hasher's configuration with defaults filled in.
func (h *Hasher) Config() HashConfig { return h.cfg }

// Domain tags keep text blocks and token blocks apart: the same bytes read
// as text and as token ids never hash alike.
const (
	domainText   = 0x74657874626c6b31 // "textblk1"
	domainTokens = 0x746f6b656e626c6b // "tokenblk"
)

// seed returns the chain's initial value for model, adapter and the salt.
func (h *Hasher) seed(domain uint64, model, adapter string) uint64 {
	s := hashString(domain, model)
	s = hashString(s, adapter)
	return hashString(s, h.cfg.Salt)
}

// HashText appends to dst the chained hashes of the full BlockBytes-sized
// blocks of text, an already rendered prompt, and returns the extended
// slice. At most MaxBlocks hashes are appended. It does not retain text.
func (h *Hasher) HashText(dst []uint64, model, adapter string, text []byte) []uint64 {
	bs := h.cfg.BlockBytes
	n := min(len(text)/bs, h.cfg.MaxBlocks)
	dst = grow(dst, n)
	prev := h.seed(domainText, model, adapter)
	if bs == DefaultBlockBytes {
		dst, _ = hashBlocks64(dst, prev, text[:n*64])
		return dst
	}
	for i := 0; i < n; i++ {
		prev = hashBytes(prev, text[i*bs:(i+1)*bs])
		dst = append(dst, prev)
	}
	return dst
}

// HashTokens appends to dst the chained hashes of the full TokenBlock-sized
// blocks of tokens and returns the extended slice. Token ids are hashed as
// 32-bit values. At most MaxBlocks hashes are appended. It does not retain
// tokens.
func (h *Hasher) HashTokens(dst []uint64, model, adapter string, tokens []int) []uint64 {
	tb := h.cfg.TokenBlock
	n := min(len(tokens)/tb, h.cfg.MaxBlocks)
	dst = grow(dst, n)
	prev := h.seed(domainTokens, model, adapter)
	for i := 0; i < n; i++ {
		prev = hashTokens(prev, tokens[i*tb:(i+1)*tb])
		dst = append(dst, prev)
	}
	return dst
}

// hashPieces appends the hashes of a Prompt's text whose pieces are out of
// buffer order (Prompt.reorder): exactly HashText of their concatenation.
// A block that straddles pieces is gathered in the Prompt's carry buffer.
func (h *Hasher) hashPieces(dst []uint64, model, adapter string, pr *Prompt) []uint64 {
	bs := h.cfg.BlockBytes
	left := min(len(pr.text)/bs, h.cfg.MaxBlocks)
	dst = grow(dst, left)
	prev := h.seed(domainText, model, adapter)
	if cap(pr.carry) < bs {
		pr.carry = make([]byte, bs)
	}
	carry := pr.carry[:bs]
	n := 0 // bytes in carry
	// block hashes one block: a carried one, or any when bs is not the
	// default (whole 64-byte runs go to hashBlocks64 below).
	block := func(b []byte) {
		prev = hashBytes(prev, b)
		dst = append(dst, prev)
		left--
	}
	for i := 0; i <= len(pr.segs) && left > 0; i++ {
		p := pr.text[pr.tail:]
		if i < len(pr.segs) {
			p = pr.text[pr.segs[i].start:pr.segs[i].end]
		}
		if n > 0 {
			k := copy(carry[n:], p)
			n += k
			p = p[k:]
			if n < bs {
				continue
			}
			block(carry)
			n = 0
		}
		if bs == DefaultBlockBytes {
			k := min(len(p)/64, left) * 64
			dst, prev = hashBlocks64(dst, prev, p[:k])
			left -= k / 64
			p = p[k:]
		}
		for len(p) >= bs && left > 0 {
			block(p[:bs])
			p = p[bs:]
		}
		n = copy(carry, p)
	}
	return dst
}

func grow(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) < n {
		nd := make([]uint64, len(dst), len(dst)+n)
		copy(nd, dst)
		dst = nd
	}
	return dst
}

// The hash is a wyhash-style construction: 64-bit words are mixed pairwise
// by a full 64×64→128-bit multiply folded by XOR ("mum"), with four
// independent lanes per 64 bytes so that the multiplies pipeline. Design
// and constants follow Wang Yi's wyhash (final version 4,
// github.com/wangyi-fudan/wyhash, public domain); the code is written here
// and the layout differs (fixed lanes per block, chained through prev).
//
// A block's lanes are folded into one word f, which does not depend on the
// chain, and the block is chained by link: f ^ perm(prev), where perm is a
// fixed bijection. The chain value must not be an operand of mum:
// mum(0, x) = 0 and mum(1, x) = x, and as the constants are public a block
// can be written so that the operand it controls is 0 or 1 (or a power of
// two, which makes mum a rotation). A final mum(f, prev^k) then made that
// block's hash 0 or a constant whatever came before it (the model, the
// adapter, the salt, the earlier blocks): prompts of different models or
// salts shared every hash from that block on. mum(f, prev^k) ^ prev does
// not help either, as with f = 1 it is the constant k. With link, the hash
// of a block is, for every content of the block, a bijection of prev: no
// input erases or merges the chain, and two chains that differ before a
// block still differ after it.
//
// The hash is not cryptographic: f is easy to steer, as the lanes are, so
// whoever knows a chain value can write blocks whose hashes under it are
// what they choose. The seed keeps models, adapters and salts apart for
// any content of the blocks, but not against a client that knows another
// seed (a public model name and an empty or known salt) and sets out to
// collide with a prompt under it; against that, give each tenant a salt
// of its own that it does not know.
const (
	p0 = 0xa0761d6478bd642f
	p1 = 0xe7037ed1a0b428db
	p2 = 0x8ebc6af09c88c6e3
	p3 = 0x589965cc75374cc3
)

// mum multiplies a and b into 128 bits and folds the halves.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// link chains a block, whose own mix is f, on the previous chain value:
// f ^ perm(prev), with perm(x) = (x ^ x>>30) * m, the first round of
// SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014; m from David Stafford's
// "Mix13"). An xorshift and a multiply by an odd constant are both
// invertible, so perm is a bijection and link is one in prev for every f:
// whatever a block holds, its hash still determines the chain before it
// (see the comment on the constants above). f ^ prev would be a bijection
// too, but blocks would commute: [A, B] and [B, A] would end on the same
// hash. On the chain's critical path link costs what the final mum it
// replaces did (a shift, two xors and a 64-bit multiply, for an xor, a
// 128-bit multiply and an xor), f is computed off that path, and a block
// takes as many multiplies as before.
func link(prev, f uint64) uint64 {
	return f ^ (prev^prev>>30)*0xbf58476d1ce4e5b9
}

func le64(p []byte) uint64 { return binary.LittleEndian.Uint64(p) }

// hashBlocks64Generic appends to dst the chained hashes of the 64-byte
// blocks of b, whose length must be a multiple of 64, starting the chain at
// prev; it returns the extended slice and the last hash (prev when b is
// empty). Each hash equals hashBytes of its block; the mixing is written
// out in the loop because a function per block is over the inlining budget
// and spilled the loop's state to the stack around every call. dst must
// have room for the hashes (grow). This loop is the prompt hashing's hot
// path (two thirds of the instructions of a 220 KB request's hashing and
// rendering), so hashBlocks64, which the hashers call, runs an assembly
// copy of it on amd64 (hash_amd64.s) and this one elsewhere; tests check
// that the two agree.
func hashBlocks64Generic(dst []uint64, prev uint64, b []byte) ([]uint64, uint64) {
	n := len(dst)
	out := dst[n : n+len(b)/64]
	for k := range out {
		blk := (*[64]byte)(b[k*64:])
		a := mum(le64(blk[0:])^p1, le64(blk[8:])^p0)
		c := mum(le64(blk[16:])^p2, le64(blk[24:])^p1)
		d := mum(le64(blk[32:])^p3, le64(blk[40:])^p2)
		e := mum(le64(blk[48:])^p0, le64(blk[56:])^p3)
		prev = link(prev, a^c^d^e^p1^64)
		out[k] = prev
	}
	return dst[:n+len(out)], prev
}

// hashBytes hashes a block of any length chained on prev.
func hashBytes(prev uint64, b []byte) uint64 {
	n := uint64(len(b))
	a, c, d, e := uint64(p0), uint64(p1), uint64(p2), uint64(p3)
	for len(b) >= 64 {
		a = mum(le64(b[0:])^p1, le64(b[8:])^a)
		c = mum(le64(b[16:])^p2, le64(b[24:])^c)
		d = mum(le64(b[32:])^p3, le64(b[40:])^d)
		e = mum(le64(b[48:])^p0, le64(b[56:])^e)
		b = b[64:]
	}
	for len(b) >= 16 {
		a = mum(le64(b[0:])^p1, le64(b[8:])^a) ^ c
		b = b[16:]
	}
	if len(b) > 0 {
		var t [16]byte
		copy(t[:], b)
		c = mum(le64(t[0:])^p2, le64(t[8:])^c^uint64(len(b)))
	}
	return link(prev, a^c^d^e^p1^n)
}

// hashTokens hashes a block of token ids chained on prev; each pair of
// 32-bit ids forms one 64-bit word.
func hashTokens(prev uint64, t []int) uint64 {
	n := uint64(len(t))
	a, c, d, e := uint64(p0), uint64(p1), uint64(p2), uint64(p3)
	for len(t) >= 16 {
		a = mum(pair(t[0], t[1])^p1, pair(t[2], t[3])^a)
		c = mum(pair(t[4], t[5])^p2, pair(t[6], t[7])^c)
		d = mum(pair(t[8], t[9])^p3, pair(t[10], t[11])^d)
		e = mum(pair(t[12], t[13])^p0, pair(t[14], t[15])^e)
		t = t[16:]
	}
	for len(t) >= 4 {
		a = mum(pair(t[0], t[1])^p1, pair(t[2], t[3])^a) ^ c
		t = t[4:]
	}
	if len(t) > 0 {
		var w [4]int
		copy(w[:], t)
		c = mum(pair(w[0], w[1])^p2, pair(w[2], w[3])^c^uint64(len(t)))
	}
	return link(prev, a^c^d^e^p3^n)
}

func pair(x, y int) uint64 { return uint64(uint32(x)) | uint64(uint32(y))<<32 }

// hashString folds s into seed; it seeds chains and is not on a hot path.
// Each 16 bytes are chained by link like a block, so that no string (an
// adapter or a salt) erases the seed before it (the model).
func hashString(seed uint64, s string) uint64 {
	h := link(seed, mum(uint64(len(s))^p0, p1))
	for len(s) >= 16 {
		h = link(h, mum(binary.LittleEndian.Uint64([]byte(s[:8]))^p2, binary.LittleEndian.Uint64([]byte(s[8:16]))^p1))
		s = s[16:]
	}
	var t [16]byte
	copy(t[:], s)
	return link(h, mum(le64(t[0:])^p3, le64(t[8:])^p0))
}
