package prefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// craftedTextBlock returns a 64-byte block whose lanes fold to 0: a block
// that made the chaining multiply of the first version of the hash
// (mum(lanes, prev^k)) take a zero operand, and so hash to 0 whatever the
// chain before it (the model, the adapter, the salt, the earlier blocks).
func craftedTextBlock() []byte { return craftedTextBlockFolding(0) }

// craftedTextBlockFolding returns a 64-byte block whose lanes fold to v:
// a^c^d^e^p1 = v, with the lanes c, d and e zero.
func craftedTextBlockFolding(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b[0:], p1^1)    // a = mum(1, w1^p0) = w1^p0
	binary.LittleEndian.PutUint64(b[8:], v^p1^p0) // a = v^p1
	binary.LittleEndian.PutUint64(b[16:], p2)     // c = 0
	binary.LittleEndian.PutUint64(b[24:], 0x1111111111111111)
	binary.LittleEndian.PutUint64(b[32:], p3) // d = 0
	binary.LittleEndian.PutUint64(b[40:], 0x2222222222222222)
	binary.LittleEndian.PutUint64(b[48:], p0) // e = 0
	binary.LittleEndian.PutUint64(b[56:], 0x3333333333333333)
	return b
}

// craftedTokenBlock is craftedTextBlock for a 16-id token block.
func craftedTokenBlock() []int { return craftedTokenBlockFolding(0) }

// craftedTokenBlockFolding is craftedTextBlockFolding for a 16-id token
// block: a^c^d^e^p3 = v.
func craftedTokenBlockFolding(v uint64) []int {
	ids := make([]int, 16)
	put := func(i int, w uint64) { ids[i], ids[i+1] = int(uint32(w)), int(uint32(w>>32)) }
	put(0, p1^1)    // a = pair(t2,t3)^p0
	put(2, v^p3^p0) // a = v^p3
	put(4, p2)      // c = 0
	put(8, p3)      // d = 0
	put(12, p0)     // e = 0
	for i := range ids {
		if ids[i] == 0 {
			ids[i] = 7 + i
		}
	}
	return ids
}

// TestCraftedTokenBlockMatchesAcrossModels: the chain is seeded with
// the model, the adapter and the salt so that "the same text under another
// adapter shares nothing", whatever the blocks hold: a block of 16 token
// ids whose lanes fold to 0 (which erased the seed from the first version
// of the hash) still hashes apart under another model, adapter and salt,
// through HashTokens and HashBody, and an index holding the prompt under
// one model holds nothing of it under the other.
func TestCraftedTokenBlockMatchesAcrossModels(t *testing.T) {
	ids := append(craftedTokenBlock(), make([]int, 48)...)
	for i := 16; i < len(ids); i++ {
		ids[i] = 1000 + i
	}
	h1 := NewHasher(HashConfig{})
	h2 := NewHasher(HashConfig{Salt: "tenant-b"})
	a := h1.HashTokens(nil, "model-a", "", ids)
	b := h2.HashTokens(nil, "model-b", "lora-x", ids)
	require.Len(t, a, 4)
	// Plain text ids through a body, as a client would send them.
	var sb strings.Builder
	sb.WriteString(`{"model":"model-b","prompt":[`)
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(id))
	}
	sb.WriteString(`]}`)
	c, _, err := h2.HashBody(nil, "model-b", "lora-x", []byte(sb.String()))
	require.NoError(t, err)
	require.Equal(t, b, c)

	for i := range a {
		assert.NotEqual(t, a[i], b[i], "block %d: same ids under another model, adapter and salt must not share a hash", i)
	}
	ix := newIndex(t, IndexConfig{})
	ep := newEndpoints(1)
	ix.Dispatched(&signals.Request{Model: "model-a", PromptBlocks: a}, ep[0])
	got := match(ix, b, ep)
	assert.Zero(t, got[0], "an endpoint holding model-a's prompt holds nothing of model-b's")
}

// TestCraftedTextBlockBreaksChain: block i's hash covers every block
// before it, so two prompts that differ in their first block share
// nothing, even past a 64-byte text block whose lanes fold to 0 (which
// erased the chain in the first version of the hash): their hashes differ
// from that block on and the index matches nothing.
func TestCraftedTextBlockBreaksChain(t *testing.T) {
	h := NewHasher(HashConfig{})
	tail := text(64*4, 3)
	p := append(append(append([]byte{}, text(64*3, 1)...), craftedTextBlock()...), tail...)
	q := append(append(append([]byte{}, text(64*3, 2)...), craftedTextBlock()...), tail...)
	hp := h.HashText(nil, "m", "", p)
	hq := h.HashText(nil, "m", "", q)
	require.Len(t, hp, 8)
	require.NotEqual(t, hp[0], hq[0], "the prompts differ in their first block")
	for i := 3; i < len(hp); i++ {
		assert.NotEqual(t, hp[i], hq[i], "block %d: the chains diverged at block 0", i)
	}

	ix := newIndex(t, IndexConfig{}) // stride 4: blocks 3 and 7 indexed
	ep := newEndpoints(1)
	ix.Dispatched(&signals.Request{PromptBlocks: hp}, ep[0])
	got := match(ix, hq, ep)
	assert.Zero(t, got[0], "a chain that diverges at block 0 matches nothing")
}

// TestBlockHashKeepsTheChain: whatever a block holds, its hash is a
// bijection of the chain value before it, so no block erases the chain:
// blocks whose lanes fold to 0 (mum(0, x) = 0), 1 (mum(1, x) = x, which
// made mum(...) ^ prev a constant) or a power of two (mum a rotation) hash
// apart from distinct chain values, in hashBlocks64, hashBytes and
// hashTokens alike; and seeds stay apart through adapters and salts whose
// words made the first version of hashString return 0 or forget the seed.
func TestBlockHashKeepsTheChain(t *testing.T) {
	prevs := []uint64{0, 1, 2, 3, p0, p1, p2, p3, p2 ^ 64, p2 ^ 16, ^uint64(0), 1 << 63, 0xdeadbeef}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		prevs = append(prevs, rng.Uint64())
	}
	distinct := func(t *testing.T, what string, f func(prev uint64) uint64) {
		t.Helper()
		seen := map[uint64]uint64{}
		for _, prev := range prevs {
			h := f(prev)
			if q, dup := seen[h]; dup {
				t.Fatalf("%s: chains %#x and %#x both hash to %#x", what, q, prev, h)
			}
			seen[h] = prev
		}
	}
	for _, v := range []uint64{0, 1, 2, 1 << 32, 1 << 63, p1, p2 ^ 64, ^uint64(0)} {
		blk := craftedTextBlockFolding(v)
		distinct(t, fmt.Sprintf("hashBlocks64, fold %#x", v), func(prev uint64) uint64 {
			_, last := hashBlocks64(make([]uint64, 0, 1), prev, blk)
			return last
		})
		distinct(t, fmt.Sprintf("hashBytes, fold %#x", v), func(prev uint64) uint64 { return hashBytes(prev, blk) })
		ids := craftedTokenBlockFolding(v)
		distinct(t, fmt.Sprintf("hashTokens, fold %#x", v), func(prev uint64) uint64 { return hashTokens(prev, ids) })
		// Through the public API: two models, adapters and salts.
		txt := append(append([]byte{}, blk...), text(64, 5)...)
		a := NewHasher(HashConfig{}).HashText(nil, "model-a", "", txt)
		b := NewHasher(HashConfig{Salt: "s"}).HashText(nil, "model-b", "lora", txt)
		for i := range a {
			assert.NotEqual(t, a[i], b[i], "fold %#x: text block %d", v, i)
		}
		ta := NewHasher(HashConfig{}).HashTokens(nil, "model-a", "", ids)
		tb := NewHasher(HashConfig{Salt: "s"}).HashTokens(nil, "model-b", "lora", ids)
		assert.NotEqual(t, ta, tb, "fold %#x: token block", v)
	}
	// Strings whose words zeroed the first hashString: a 16-byte chunk
	// starting with p2, a tail starting with p3.
	word := func(w uint64) string {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], w)
		return string(b[:])
	}
	for _, s := range []string{word(p2) + "12345678", word(p3), word(p3) + "x", word(p2) + "12345678" + word(p3)} {
		distinct(t, fmt.Sprintf("hashString %q", s), func(prev uint64) uint64 { return hashString(prev, s) })
		a := NewHasher(HashConfig{}).seed(domainText, "model-a", s)
		b := NewHasher(HashConfig{}).seed(domainText, "model-b", s)
		assert.NotEqual(t, a, b, "adapter %q", s)
		a = NewHasher(HashConfig{Salt: s}).seed(domainText, "model-a", "")
		b = NewHasher(HashConfig{Salt: s}).seed(domainText, "model-a", "lora")
		assert.NotEqual(t, a, b, "salt %q", s)
	}
}

// TestBlocksDoNotCommute: the chain is not a plain XOR of the blocks' own
// hashes: the same blocks in another order end on another hash.
func TestBlocksDoNotCommute(t *testing.T) {
	h := NewHasher(HashConfig{})
	a, b := text(64, 1), text(64, 2)
	ab := h.HashText(nil, "m", "", append(append([]byte{}, a...), b...))
	ba := h.HashText(nil, "m", "", append(append([]byte{}, b...), a...))
	assert.NotEqual(t, ab[1], ba[1])
	aba := h.HashText(nil, "m", "", append(append(append([]byte{}, a...), b...), a...))
	assert.NotEqual(t, aba[0], aba[2], "a block repeated does not cancel")
}

// TestRepeatedToolsNullLastWins: of a repeated top-level key the last
// value stands (the renderer's rule, as for "messages"; encoding/json and
// the servers' readers agree), a null too. Tools or instructions given
// before the messages and repeated as null after them (or before them)
// are not part of the prompt the server sees, and the body hashes as one
// without them.
func TestRepeatedToolsNullLastWins(t *testing.T) {
	h := NewHasher(HashConfig{BlockBytes: 16})
	msgs := `"messages":[{"role":"user","content":"a message long enough for a few blocks of text"}]`
	want, wantN, err := h.HashBody(nil, "m", "", []byte(`{`+msgs+`}`))
	require.NoError(t, err)
	for _, body := range []string{
		`{"tools":[{"type":"function","function":{"name":"f"}}],` + msgs + `,"tools":null}`,
		`{"instructions":"be brief, be kind",` + msgs + `,"instructions":null}`,
		// The same rule when the later null comes before the messages.
		`{"tools":[{"type":"function","function":{"name":"f"}}],"tools":null,` + msgs + `}`,
	} {
		got, n, err := h.HashBody(nil, "m", "", []byte(body))
		require.NoError(t, err)
		assert.Equal(t, wantN, n, body)
		assert.Equal(t, want, got, body)
	}
}

// bodyGen writes random chat bodies: messages with their keys in random
// order, repeated message keys, escapes, parts, tool calls, random
// whitespace, and tools and instructions before or after the messages.
type bodyGen struct {
	rng *rand.Rand
	sb  strings.Builder
}

func (g *bodyGen) ws() {
	for g.rng.IntN(3) == 0 {
		g.sb.WriteByte(" \n\t\r"[g.rng.IntN(4)])
	}
}

// seq writes n items between open and close, separated by commas, each
// with optional whitespace around it.
func (g *bodyGen) seq(open, close byte, n int, item func(i int)) {
	g.sb.WriteByte(open)
	for i := 0; i < n; i++ {
		if i > 0 {
			g.sb.WriteByte(',')
		}
		g.ws()
		item(i)
		g.ws()
	}
	g.sb.WriteByte(close)
}

func (g *bodyGen) str(n int) {
	g.sb.WriteByte('"')
	for i := 0; i < n; i++ {
		switch k := g.rng.IntN(40); {
		case k == 0:
			g.sb.WriteString(`\n`)
		case k == 1:
			g.sb.WriteString(`\"`)
		case k == 2:
			g.sb.WriteString(`\u00e9`)
		case k == 3:
			g.sb.WriteString(`\ud83d\ude00`)
		case k == 4:
			g.sb.WriteString(`\\`)
		case k == 5:
			g.sb.WriteString("é")
		default:
			g.sb.WriteByte('a' + byte(g.rng.IntN(26)))
		}
	}
	g.sb.WriteByte('"')
}

func (g *bodyGen) value(kind string) {
	r := g.rng
	switch kind {
	case "role":
		switch r.IntN(8) {
		case 0:
			g.sb.WriteString(`"us\u0065r"`)
		case 1:
			g.sb.WriteString(`null`)
		default:
			g.sb.WriteString([]string{`"user"`, `"assistant"`, `"system"`, `"tool"`}[r.IntN(4)])
		}
	case "name":
		if r.IntN(5) == 0 {
			g.sb.WriteString(`null`)
		} else {
			g.str(r.IntN(12))
		}
	case "content":
		switch r.IntN(10) {
		case 0:
			g.sb.WriteString(`null`)
		case 1:
			g.sb.WriteString(`42`)
		case 2, 3:
			g.seq('[', ']', r.IntN(4), func(int) {
				switch r.IntN(4) {
				case 0:
					g.str(r.IntN(90))
				case 1:
					g.sb.WriteString(`{"type":"image_url","image_url":{"url":"data:x"}}`)
				case 2:
					g.sb.WriteString(`{"text":`)
					g.str(r.IntN(90))
					g.sb.WriteString(`,"type":"text"}`)
				default:
					g.sb.WriteString(`{"type":"input_text",` + "\n" + `"text":`)
					g.str(r.IntN(90))
					g.sb.WriteString(`}`)
				}
			})
		default:
			g.str(r.IntN(200))
		}
	case "tool_calls":
		if r.IntN(3) == 0 {
			g.sb.WriteString(`null`)
		} else {
			g.sb.WriteString(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`)
		}
	case "tool_call_id":
		if r.IntN(4) == 0 {
			g.sb.WriteString(`7`)
		} else {
			g.str(r.IntN(8))
		}
	default:
		g.sb.WriteString(`{"x":[1,2,{"y":"z"}]}`)
	}
}

func (g *bodyGen) message() {
	r := g.rng
	keys := []string{"role", "name", "content", "tool_calls", "tool_call_id", "extra"}
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	keys = keys[:r.IntN(len(keys)+1)]
	if r.IntN(4) == 0 && len(keys) > 0 {
		keys = append(keys, keys[r.IntN(len(keys))]) // a repeated key
	}
	g.seq('{', '}', len(keys), func(i int) {
		g.sb.WriteString(`"` + keys[i] + `"`)
		g.ws()
		g.sb.WriteByte(':')
		g.ws()
		g.value(keys[i])
	})
}

func (g *bodyGen) body() string {
	r := g.rng
	g.sb.Reset()
	keys := []string{"model", "messages", "tools", "instructions", "stream", "prompt", "input"}
	if r.IntN(2) == 0 {
		keys = keys[:5]
	}
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	keys = keys[:2+r.IntN(len(keys)-1)]
	g.ws()
	g.seq('{', '}', len(keys), func(i int) {
		k := keys[i]
		g.sb.WriteString(`"` + k + `":`)
		g.ws()
		switch k {
		case "model":
			g.sb.WriteString(`"m"`)
		case "stream":
			g.sb.WriteString(`true`)
		case "tools":
			if r.IntN(3) == 0 {
				g.sb.WriteString(`null`)
			} else {
				g.sb.WriteString(`[{"type":"function","function":{"name":"get_weather","parameters":{}}}]`)
			}
		case "instructions":
			switch r.IntN(4) {
			case 0:
				g.sb.WriteString(`null`)
			case 1:
				g.sb.WriteString(`5`)
			default:
				g.str(r.IntN(80))
			}
		case "prompt", "input":
			switch r.IntN(6) {
			case 0:
				g.sb.WriteString(`[1, 2,3 ,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]`)
			case 1:
				g.sb.WriteString(`[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],[4,5]]`)
			case 2:
				g.sb.WriteByte('[')
				g.str(r.IntN(150))
				g.sb.WriteString(` , `)
				g.str(r.IntN(30))
				g.sb.WriteByte(']')
			case 3:
				g.sb.WriteByte('[')
				g.message()
				g.sb.WriteByte(']')
			case 4:
				g.sb.WriteString(`null`)
			default:
				g.str(r.IntN(300))
			}
		case "messages":
			g.seq('[', ']', r.IntN(6), func(int) { g.message() })
		}
	})
	return g.sb.String()
}

// TestRandomChatBodiesMatchReference renders random chat bodies
// (random key orders inside messages, repeated message keys, escapes,
// parts, whitespace, tools and instructions anywhere) and checks HashBody,
// the bytes count and Prompt.Hash under other models against the
// encoding/json reference, for several block sizes and caps.
func TestRandomChatBodiesMatchReference(t *testing.T) {
	g := &bodyGen{rng: rand.New(rand.NewPCG(11, 12))}
	compared := 0
	for i := 0; i < 2500; i++ {
		body := g.body()
		ref, ok := referenceRender([]byte(body))
		if !ok {
			continue
		}
		compared++
		for _, cfg := range append(testConfigs, HashConfig{BlockBytes: 7}, HashConfig{BlockBytes: 64, MaxBlocks: 2}) {
			h := NewHasher(cfg)
			got, n, err := h.HashBody(nil, "m", "", []byte(body))
			if ref.err {
				require.ErrorIs(t, err, ErrBadBody, body)
				continue
			}
			require.NoError(t, err, body)
			require.Equal(t, ref.bytes, n, body)
			require.Equal(t, ref.hash(h), got, "cfg %+v body %s", cfg, body)
			pr := h.NewPrompt()
			_, err = pr.Read([]byte(body), nil)
			require.NoError(t, err)
			if ref.tokens {
				require.Equal(t, h.HashTokens(nil, "m2", "a", ref.ids), pr.Hash(nil, "m2", "a"), body)
			} else {
				require.Equal(t, h.HashText(nil, "m2", "a", ref.text), pr.Hash(nil, "m2", "a"), body)
			}
			require.Equal(t, got, pr.Hash(nil, "m", ""), "Hash twice: %s", body)
		}
	}
	require.Greater(t, compared, 900)
}

// TestHashDeterministicAcrossHashers: the hashes are a function of
// the text, the model, the adapter and the salt only: fresh hashers, a
// pooled Prompt reused across bodies of other shapes, and concurrent use
// give the same result.
func TestHashDeterministicAcrossHashers(t *testing.T) {
	body := []byte(`{"messages":[{"content":"` + string(text(500, 4)) + `","role":"user"},{"role":"assistant","content":"ok"}]}`)
	h := NewHasher(HashConfig{})
	want, _, err := h.HashBody(nil, "m", "a", body)
	require.NoError(t, err)
	// 500 bytes of content plus the heads: 8 full 64-byte blocks.
	require.Len(t, want, 8)
	other := []byte(`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32]}`)
	for i := 0; i < 50; i++ {
		_, _, err := h.HashBody(nil, "m", "a", other)
		require.NoError(t, err)
		got, _, err := NewHasher(HashConfig{}).HashBody(nil, "m", "a", body)
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, _, err = h.HashBody(nil, "m", "a", body)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	done := make(chan []uint64, 8)
	for i := 0; i < 8; i++ {
		go func() {
			var last []uint64
			for j := 0; j < 100; j++ {
				last, _, _ = h.HashBody(last[:0], "m", "a", body)
			}
			done <- last
		}()
	}
	for i := 0; i < 8; i++ {
		assert.Equal(t, want, <-done)
	}
}

// TestIndexCapacityUnderHostileTraffic: per-endpoint capacity holds
// for one giant prompt, for many distinct prompts, and when the scraped
// capacity shrinks; entries never exceed the sum of the capacities.
func TestIndexCapacityUnderHostileTraffic(t *testing.T) {
	for _, stride := range []int{1, 4} {
		t.Run(fmt.Sprintf("stride=%d", stride), func(t *testing.T) {
			ix := newIndex(t, IndexConfig{Stride: stride, DefaultCapacity: 1000})
			capEntries := (1000 + stride - 1) / stride
			eps := newEndpoints(3)
			giant := chain(nil, 50_000, 1)
			ix.Dispatched(&signals.Request{PromptBlocks: giant}, eps[0])
			require.Equal(t, capEntries, ix.Entries(eps[0]))
			// What it kept is the head of the giant prompt.
			got := match(ix, giant[:capEntries*stride], eps[:1])
			assert.Equal(t, 1.0, got[0])
			ix.Completed(&signals.Request{PromptBlocks: giant}, eps[0], signals.Outcome{})
			require.Equal(t, capEntries, ix.Entries(eps[0]))
			for i := 0; i < 20_000; i++ {
				b := chain(nil, 1+i%9, uint64(i+10))
				ep := eps[i%3]
				ix.Dispatched(&signals.Request{PromptBlocks: b}, ep)
				if i%2 == 0 {
					ix.Completed(&signals.Request{PromptBlocks: b}, ep, signals.Outcome{})
				}
				require.LessOrEqual(t, ix.Entries(ep), capEntries)
			}
			require.LessOrEqual(t, ix.Stats().Entries, 3*capEntries)
			// The scrape says the cache is small now: 160 tokens, 10 blocks.
			eps[1].SetMetrics(&signals.Metrics{BlockSize: 16, NumBlocks: 10})
			ix.Dispatched(&signals.Request{PromptBlocks: chain(nil, 3, 999)}, eps[1])
			assert.LessOrEqual(t, ix.Entries(eps[1]), (10+stride-1)/stride)
			st := ix.Stats()
			assert.Equal(t, ix.Entries(eps[0])+ix.Entries(eps[1])+ix.Entries(eps[2]), st.Entries)
		})
	}
}

// TestIndexMemoryReturnsAfterEndpointChurn: many endpoints added,
// filled and removed (by Forget, Retain, restarts) leave the index no
// larger than one round of them: memory is bounded by what is held now.
func TestIndexMemoryReturnsAfterEndpointChurn(t *testing.T) {
	ix := newIndex(t, IndexConfig{Stride: 1, DefaultCapacity: 64})
	shared := chain(nil, 32, 1)
	round := func(r int) []*signals.Endpoint {
		eps := newEndpoints(300)
		for i, ep := range eps {
			b := chain(shared[:1+i%32], 20, uint64(r*1000+i))
			ix.Dispatched(&signals.Request{PromptBlocks: b}, ep)
		}
		return eps
	}
	var peak int64
	for r := 0; r < 12; r++ {
		eps := round(r)
		st := ix.Stats()
		require.LessOrEqual(t, st.Entries, 300*64)
		if r == 1 {
			peak = st.Bytes
		}
		if r > 1 {
			require.LessOrEqual(t, st.Bytes, peak*11/10, "round %d: memory grows with churn", r)
		}
		switch r % 3 {
		case 0:
			ix.Forget(eps...)
		case 1:
			ix.Retain(nil)
		default:
			for _, ep := range eps {
				ep.MarkRestarted()
			}
			ix.Retain(nil)
		}
		st = ix.Stats()
		require.Zero(t, st.Entries, "round %d", r)
		require.Zero(t, st.Blocks, "round %d", r)
		require.Zero(t, st.Endpoints, "round %d", r)
	}
}

// TestLookupDivergingChains: a chain that diverges midway matches
// only up to the divergence, to the stride, for every stride and every
// divergence point, against Lookup, Fill, Fraction and Match.
func TestLookupDivergingChains(t *testing.T) {
	for _, stride := range []int{1, 2, 3, 4, 7} {
		for n := 1; n <= 24; n++ {
			base := chain(nil, n, 1)
			for div := 0; div <= n; div++ {
				q := chain(base[:div], n-div, 77)
				ix := newIndex(t, IndexConfig{Stride: stride})
				eps := newEndpoints(2)
				ix.Dispatched(&signals.Request{PromptBlocks: base}, eps[0])
				// The reference: the last indexed position of q below div.
				matched := 0
				for p := stride - 1; ; p += stride {
					p = min(p, n-1)
					if p >= div {
						break
					}
					matched = p + 1
					if p == n-1 {
						break
					}
				}
				want := float64(matched) / float64(n)
				got := match(ix, q, eps)
				require.InDelta(t, want, got[0], 1e-12, "stride %d n %d div %d", stride, n, div)
				require.Zero(t, got[1])
				var m Matches
				ix.Lookup(&signals.Request{PromptBlocks: q}, &m)
				require.InDelta(t, want, m.Fraction(eps[0]), 1e-12)
			}
		}
	}
}

// holdersOf returns the slots of block h's holder set.
func holdersOf(ix *Index, h uint64) []int32 {
	v := ix.blocks.Get(h)
	var out []int32
	switch v & tagMask {
	case bitsetTag:
		for i, w := range ix.set(v) {
			for ; w != 0; w &= w - 1 {
				out = append(out, int32(i*64+bitsTrailing(w)))
			}
		}
	case listTag:
		for _, s := range ix.list(v) {
			if s >= 0 {
				out = append(out, s)
			}
		}
	default:
		for f := 0; f < 3; f++ {
			if s := int32((v>>(f*fieldBits))&fieldMask) - 1; s >= 0 {
				out = append(out, s)
			}
		}
	}
	return out
}

func bitsTrailing(w uint64) int {
	n := 0
	for w&1 == 0 {
		w >>= 1
		n++
	}
	return n
}

// checkIndexConsistent checks the index's internal consistency: every entry
// of an endpoint's LRU is in its block's holder set and back, the counts
// agree, and capacities hold.
func checkIndexConsistent(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	total := 0
	want := map[uint64]map[int32]bool{}
	for ep, st := range ix.eps {
		require.Same(t, st, ix.bySlot[st.slot])
		require.LessOrEqual(t, st.lru.Len(), st.cap, "%s over capacity", ep.Name)
		n := 0
		st.lru.Each(func(h uint64) {
			n++
			if want[h] == nil {
				want[h] = map[int32]bool{}
			}
			want[h][st.slot] = true
		})
		require.Equal(t, st.lru.Len(), n)
		total += n
	}
	require.Equal(t, total, ix.entries)
	require.Equal(t, len(want), ix.blocks.Len(), "distinct blocks")
	for h, slots := range want {
		got := map[int32]bool{}
		for _, s := range holdersOf(ix, h) {
			got[s] = true
		}
		require.Equal(t, slots, got, "holders of %#x", h)
	}
}

// TestIndexConcurrentChurn runs dispatches, completions (failed and
// not), restarts, capacity changes, Forget, Retain, Lookup and Match from
// many goroutines over a pool that grows past 64 and 256 slots (bitsets
// and lists), then checks the index's consistency and bounds.
func TestIndexConcurrentChurn(t *testing.T) {
	ix := newIndex(t, IndexConfig{Stride: 2, DefaultCapacity: 60})
	pool := newEndpoints(400)
	shared := chain(nil, 40, 1)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			var m Matches
			out := make([]float64, 64)
			for i := 0; i < 3000; i++ {
				ep := pool[rng.IntN(len(pool))]
				b := chain(shared[:1+rng.IntN(len(shared))], rng.IntN(30), uint64(rng.IntN(50)))
				req := &signals.Request{PromptBlocks: b}
				switch op := rng.IntN(100); {
				case op < 50:
					ix.Dispatched(req, ep)
					var out signals.Outcome
					if rng.IntN(3) == 0 {
						out.Err = errors.New("refused")
					}
					ix.Completed(req, ep, out)
				case op < 52:
					ep.MarkRestarted()
				case op < 54:
					ix.Forget(ep)
				case op < 55:
					ix.Retain(pool[:rng.IntN(len(pool))])
				case op < 57:
					ep.SetMetrics(&signals.Metrics{BlockSize: 16, NumBlocks: 1 + rng.IntN(6)})
				case op < 80:
					ix.Lookup(req, &m)
					start := rng.IntN(len(pool) - 64)
					m.Fill(pool[start:start+64], out)
					for _, f := range out {
						if f < 0 || f > 1 {
							t.Errorf("fraction %v", f)
							return
						}
					}
				default:
					start := rng.IntN(len(pool) - 64)
					ix.Match(req, pool[start:start+64], out)
				}
			}
		}(g)
	}
	wg.Wait()
	checkIndexConsistent(t, ix)
	st := ix.Stats()
	require.LessOrEqual(t, st.Entries, 400*30)
	ix.Retain(nil)
	checkIndexConsistent(t, ix)
	st = ix.Stats()
	require.Zero(t, st.Entries)
	require.Zero(t, st.Blocks)
}

// TestLookupManyDistinctLengths: many endpoints each holding a
// different prefix of one long prompt (the deepest bisection: one group
// per endpoint) are all resolved exactly.
func TestLookupManyDistinctLengths(t *testing.T) {
	for _, stride := range []int{1, 4} {
		giant := chain(nil, 5000, 9)
		eps := newEndpoints(300)
		ix := newIndex(t, IndexConfig{Stride: stride, DefaultCapacity: 1 << 20})
		rng := rand.New(rand.NewPCG(5, uint64(stride)))
		lens := make([]int, len(eps))
		for i, ep := range eps {
			lens[i] = 1 + rng.IntN(len(giant))
			ix.Dispatched(&signals.Request{PromptBlocks: giant[:lens[i]]}, ep)
		}
		for _, q := range []int{len(giant), 4999, 1234, 7, 1} {
			query := giant[:q]
			got := match(ix, query, eps)
			for i := range eps {
				held := map[uint64]bool{}
				for p, h := range giant[:lens[i]] {
					if (p+1)%stride == 0 || p == lens[i]-1 {
						held[h] = true
					}
				}
				require.InDelta(t, refFraction(held, query, stride), got[i], 1e-12, "stride %d query %d endpoint %d (len %d)", stride, q, i, lens[i])
			}
		}
	}
}

// TestCompletionFromEarlierGenerationChangesNothing: a completion of a
// request dispatched to an earlier generation of an endpoint (its
// Outcome.Generation, which the picker sets, is not the current one)
// changes nothing, even after the endpoint's state was reset for its new
// generation by a dispatch or by Retain: a late success (or a failure
// after the first token) does not put the old request's prefix back on the
// restarted server, and a late failure does not take away the placement
// of a request dispatched since. A completion from before Forget, once the
// endpoint is back in the same generation, confirms its blocks: the same
// server process computed them.
func TestCompletionFromEarlierGenerationChangesNothing(t *testing.T) {
	old := chain(nil, 16, 1)
	fresh := chain(nil, 16, 2)
	t.Run("late success after a restart", func(t *testing.T) {
		ix := newIndex(t, IndexConfig{})
		ep := newEndpoints(1)[0]
		oldReq := &signals.Request{PromptBlocks: old}
		gen := ep.Generation()
		ix.Dispatched(oldReq, ep)
		ep.MarkRestarted()
		ix.Dispatched(&signals.Request{PromptBlocks: fresh}, ep) // the new generation's first request
		ix.Completed(oldReq, ep, signals.Outcome{TTFT: time.Second, Err: errors.New("stream cut by the restart"), Generation: gen})
		assert.Zero(t, match(ix, old, []*signals.Endpoint{ep})[0], "the restarted server does not hold the old prompt")
		assert.Equal(t, 4, ix.Entries(ep), "only the new request's entries")
	})
	t.Run("late failure after a restart", func(t *testing.T) {
		ix := newIndex(t, IndexConfig{})
		ep := newEndpoints(1)[0]
		oldReq := &signals.Request{PromptBlocks: old}
		gen := ep.Generation()
		ix.Dispatched(oldReq, ep)
		ep.MarkRestarted()
		newReq := &signals.Request{PromptBlocks: old}
		ix.Dispatched(newReq, ep) // the same prompt, in flight on the new generation
		ix.Completed(oldReq, ep, signals.Outcome{Err: errors.New("refused"), Generation: gen})
		assert.Equal(t, 1.0, match(ix, old, []*signals.Endpoint{ep})[0],
			"the failure of a request from before the restart takes away the placement of the one in flight")
		ix.Completed(newReq, ep, signals.Outcome{Generation: ep.Generation()})
		assert.Equal(t, 1.0, match(ix, old, []*signals.Endpoint{ep})[0], "the new request's success confirms it")
	})
	t.Run("late success after Retain", func(t *testing.T) {
		ix := newIndex(t, IndexConfig{})
		ep := newEndpoints(1)[0]
		oldReq := &signals.Request{PromptBlocks: old}
		gen := ep.Generation()
		ix.Dispatched(oldReq, ep)
		ep.MarkRestarted()
		ix.Retain([]*signals.Endpoint{ep})
		ix.Completed(oldReq, ep, signals.Outcome{Generation: gen})
		assert.Zero(t, match(ix, old, []*signals.Endpoint{ep})[0])
		assert.Zero(t, ix.Entries(ep))
	})
	t.Run("success after Forget and back in the same generation", func(t *testing.T) {
		ix := newIndex(t, IndexConfig{})
		ep := newEndpoints(1)[0]
		oldReq := &signals.Request{PromptBlocks: old}
		ix.Dispatched(oldReq, ep)
		ix.Forget(ep) // left the pool, not restarted
		ix.Dispatched(&signals.Request{PromptBlocks: fresh}, ep)
		ix.Completed(oldReq, ep, signals.Outcome{Generation: ep.Generation()})
		assert.Equal(t, 1.0, match(ix, old, []*signals.Endpoint{ep})[0], "the server computed the prompt")
	})
}
