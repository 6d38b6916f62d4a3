package prefix

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fixtures = "../../../shared/fixtures/openai"

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, name))
	require.NoError(t, err)
	return b
}

// text returns n bytes of deterministic, non-repeating text.
func text(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223 // Numerical Recipes LCG
		b[i] = 'a' + byte(x>>24)%26
	}
	return b
}

func TestHashConfigDefaults(t *testing.T) {
	h := NewHasher(HashConfig{})
	c := h.Config()
	assert.Equal(t, 64, c.BlockBytes)
	assert.Equal(t, 16, c.TokenBlock)
	assert.Equal(t, 131072/16, c.MaxBlocks) // 128K tokens in blocks of 16
}

// TestHashBlocks64MatchesChain checks the hot loop against the generic
// hashBytes applied block by block: same hashes, appended after what dst
// held, and the last one returned to continue the chain.
func TestHashBlocks64MatchesChain(t *testing.T) {
	for _, blocks := range []int{0, 1, 2, 7, 100} {
		b := text(blocks*64, byte(blocks+3))
		for _, prev := range []uint64{0, 0xdeadbeef, ^uint64(0)} {
			want := []uint64{42}
			h := prev
			for k := range blocks {
				h = hashBytes(h, b[k*64:(k+1)*64])
				want = append(want, h)
			}
			got, last := hashBlocks64(grow([]uint64{42}, blocks), prev, b)
			assert.Equal(t, want, got, "%d blocks from %#x", blocks, prev)
			assert.Equal(t, h, last, "%d blocks from %#x", blocks, prev)
		}
	}
}

// FuzzHashBlocks64 checks hashBlocks64 (the assembly loop on amd64)
// against hashBlocks64Generic and against hashBytes applied block by
// block, for any bytes, any starting chain value and any offset of the
// blocks in their buffer.
func FuzzHashBlocks64(f *testing.F) {
	f.Add([]byte{}, uint64(0), uint8(0))
	f.Add(text(64, 1), uint64(0xdeadbeef), uint8(1))
	f.Add(text(7*64+13, 2), ^uint64(0), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, prev uint64, off uint8) {
		o := min(int(off)%8, len(data))
		b := data[o:]
		b = b[:len(b)/64*64]
		blocks := len(b) / 64
		got, last := hashBlocks64(grow([]uint64{7}, blocks), prev, b)
		gen, genLast := hashBlocks64Generic(grow([]uint64{7}, blocks), prev, b)
		if !slices.Equal(got, gen) || last != genLast {
			t.Fatalf("%d blocks from %#x: hashBlocks64 %x (last %#x), generic %x (last %#x)", blocks, prev, got, last, gen, genLast)
		}
		h := prev
		for k := range blocks {
			h = hashBytes(h, b[k*64:(k+1)*64])
			if got[1+k] != h {
				t.Fatalf("block %d of %d from %#x: %#x, hashBytes %#x", k, blocks, prev, got[1+k], h)
			}
		}
		if last != h || got[0] != 7 || len(got) != 1+blocks {
			t.Fatalf("%d blocks from %#x: last %#x (want %#x), dst %x", blocks, prev, last, h, got)
		}
	})
}

func TestHashTextBlocks(t *testing.T) {
	h := NewHasher(HashConfig{})
	tests := []struct {
		name   string
		n      int
		blocks int
	}{
		{"empty", 0, 0},
		{"shorter than a block", 63, 0},
		{"one block", 64, 1},
		{"one block and a partial", 127, 1},
		{"ten blocks", 640, 10},
		{"capped", 64 * 9000, 8192},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := h.HashText(nil, "m", "", text(tc.n, 1))
			assert.Len(t, got, tc.blocks)
		})
	}
}

func TestHashTextAppendsAndChains(t *testing.T) {
	h := NewHasher(HashConfig{})
	a := text(640, 1)
	b := append(append([]byte{}, a[:320]...), text(320, 2)...)
	ha := h.HashText([]uint64{42}, "m", "", a)
	require.Len(t, ha, 11)
	assert.Equal(t, uint64(42), ha[0], "dst is appended to")
	hb := h.HashText(nil, "m", "", b)
	assert.Equal(t, ha[1:6], hb[:5], "shared 5-block prefix")
	for i := 5; i < 10; i++ {
		assert.NotEqual(t, ha[1+i], hb[i], "block %d after divergence", i)
	}
	// A change in the first block changes every hash (chaining).
	c := append([]byte{}, a...)
	c[0] ^= 1
	hc := h.HashText(nil, "m", "", c)
	for i := range hc {
		assert.NotEqual(t, ha[1+i], hc[i], "block %d", i)
	}
	// Same text again after a different-length block equal in content: the
	// same block content at another position hashes differently.
	rep := append(append([]byte{}, a[:64]...), a[:64]...)
	hr := h.HashText(nil, "m", "", rep)
	assert.NotEqual(t, hr[0], hr[1])
}

func TestHashSeeds(t *testing.T) {
	txt := text(256, 3)
	base := NewHasher(HashConfig{}).HashText(nil, "m", "", txt)
	tests := []struct {
		name string
		got  []uint64
	}{
		{"model", NewHasher(HashConfig{}).HashText(nil, "m2", "", txt)},
		{"adapter", NewHasher(HashConfig{}).HashText(nil, "m", "lora-a", txt)},
		{"salt", NewHasher(HashConfig{Salt: "tenant-1"}).HashText(nil, "m", "", txt)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tc.got, 4)
			for i := range base {
				assert.NotEqual(t, base[i], tc.got[i])
			}
		})
	}
	a := NewHasher(HashConfig{}).HashText(nil, "m", "lora-a", txt)
	b := NewHasher(HashConfig{}).HashText(nil, "m", "lora-b", txt)
	assert.NotEqual(t, a[0], b[0], "adapter A is not a hit for adapter B")
}

func TestHashTokens(t *testing.T) {
	h := NewHasher(HashConfig{})
	toks := make([]int, 100)
	for i := range toks {
		toks[i] = 1000 + i*7
	}
	got := h.HashTokens(nil, "m", "", toks)
	require.Len(t, got, 6) // 100/16
	other := append([]int{}, toks...)
	other[40] = 3 // block 2
	got2 := h.HashTokens(nil, "m", "", other)
	assert.Equal(t, got[:2], got2[:2])
	assert.NotEqual(t, got[2], got2[2])
	assert.NotEqual(t, got[5], got2[5])
	small := NewHasher(HashConfig{TokenBlock: 4, MaxBlocks: 3}).HashTokens(nil, "m", "", toks)
	assert.Len(t, small, 3)
}

func TestHashOtherBlockSizes(t *testing.T) {
	for _, bs := range []int{16, 24, 100, 128} {
		h := NewHasher(HashConfig{BlockBytes: bs})
		a := text(bs*5+3, 4)
		got := h.HashText(nil, "m", "", a)
		require.Len(t, got, 5)
		b := append([]byte{}, a...)
		b[bs*3+bs-1] ^= 0x20 // last byte of block 3
		got2 := h.HashText(nil, "m", "", b)
		assert.Equal(t, got[:3], got2[:3], "bs=%d", bs)
		assert.NotEqual(t, got[3], got2[3], "bs=%d", bs)
	}
}

// conversation builds the chat body of turn k (1-based) of a conversation.
func conversation(system string, turns int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", system}}
	for i := 0; i < turns; i++ {
		msgs = append(msgs, msg{"user", "Question " + strings.Repeat("about the river and the mountain ", i+1)})
		if i < turns-1 {
			msgs = append(msgs, msg{"assistant", "Answer " + strings.Repeat("the water flows down to the sea ", i+2)})
		}
	}
	b, _ := json.Marshal(map[string]any{"model": "llama", "messages": msgs, "max_tokens": 10})
	return b
}

func TestStabilityAcrossTurns(t *testing.T) {
	h := NewHasher(HashConfig{})
	system := "You are a careful assistant. " + strings.Repeat("Always cite your sources. ", 20)
	var prev []uint64
	for turn := 1; turn <= 5; turn++ {
		got, n, err := h.HashBody(nil, "llama", "", conversation(system, turn))
		require.NoError(t, err)
		require.Greater(t, n, 0)
		if prev != nil {
			require.Greater(t, len(got), len(prev), "turn %d grows", turn)
			// Every full block of the previous turn except the last (which
			// may straddle the end of the previous user message) is shared.
			assert.Equal(t, prev[:len(prev)-1], got[:len(prev)-1], "turn %d shares the history", turn)
		}
		prev = got
	}
	other, _, err := h.HashBody(nil, "llama", "", conversation(strings.Replace(system, "careful", "helpful", 1), 5))
	require.NoError(t, err)
	require.Len(t, other, len(prev))
	for i := range other {
		assert.NotEqual(t, prev[i], other[i], "system prompt change changes block %d", i)
	}
}

func TestHashBodyPromptEqualsHashText(t *testing.T) {
	h := NewHasher(HashConfig{BlockBytes: 16})
	body := readFixture(t, "openai-api/completions-prompt-string.request.json")
	var v struct{ Prompt string }
	require.NoError(t, json.Unmarshal(body, &v))
	got, n, err := h.HashBody(nil, "babbage-002", "", body)
	require.NoError(t, err)
	assert.Equal(t, len(v.Prompt), n)
	assert.Equal(t, h.HashText(nil, "babbage-002", "", []byte(v.Prompt)), got)
	assert.Len(t, got, len(v.Prompt)/16)
}

func TestHashBodyTokens(t *testing.T) {
	h := NewHasher(HashConfig{TokenBlock: 8})
	// The ids of completions-prompt-token-array.request.json (31 tokens).
	ids := []int{755, 16178, 1471, 997, 262, 422, 308, 2717, 220, 16, 512, 286, 471, 308, 198, 262,
		775, 512, 286, 471, 16178, 1471, 12, 16, 8, 489, 16178, 1471, 12, 17, 8}
	want := h.HashTokens(nil, "babbage-002", "", ids)
	require.Len(t, want, 3)

	got, n, err := h.HashBody(nil, "babbage-002", "", readFixture(t, "openai-api/completions-prompt-token-array.request.json"))
	require.NoError(t, err)
	assert.Equal(t, 31*BytesPerToken, n)
	assert.Equal(t, want, got)

	got, n, err = h.HashBody(nil, "babbage-002", "", readFixture(t, "openai-api/completions-prompt-token-arrays.request.json"))
	require.NoError(t, err)
	assert.Equal(t, (31+18)*BytesPerToken, n, "both prompts of the batch counted")
	assert.Equal(t, want, got, "first prompt of the batch hashed")

	got, n, err = h.HashBody(nil, "e", "", readFixture(t, "openai-api/embeddings-token-array.request.json"))
	require.NoError(t, err)
	assert.Equal(t, 7*BytesPerToken, n)
	assert.Empty(t, got, "7 ids are less than a block of 8")
}

func TestRenderFixtures(t *testing.T) {
	h := NewHasher(HashConfig{})
	tests := []struct {
		file string
		want string
	}{
		{"llm-d-inference-sim/chat-completions-lora-stream.request.json",
			"\x1esystem\x1fYou are a helpful SQL assistant.\x1euser\x1fWrite a query that counts users by country."},
		{"openai-api/chat-completions-multiturn.request.json",
			"\x1edeveloper\x1fYou are a helpful assistant.\x1euser\x1fHello!\x1eassistant\x1fHello! How can I assist you today?" +
				"\x1euser\x1fAnswer in up to 5 words: What's the weather like?"},
		{"openai-api/chat-completions-multimodal-content-array.request.json",
			"\x1euser\x1fWhat is in this image?\x1d{\n          \"image_url\": {\n            \"url\": \"https://upload.wikimedia.org/wikipedia/commons/thumb/d/dd/Gfp-wisconsin-madison-the-nature-boardwalk.jpg/2560px-Gfp-wisconsin-madison-the-nature-boardwalk.jpg\"\n          },\n          \"type\": \"image_url\"\n        }"},
		{"llm-d-inference-sim/completions-prompt-string-array.request.json", "Hello, my name is"},
		{"llm-d-inference-sim/responses.request.json", "Hello!"},
		{"openai-openapi/responses-stream.request.json", "\x1esystem\x1fYou are a helpful assistant.Hello!"},
		{"openai-api/embeddings-string-base64.request.json", "Generate embeddings with specific dimensions"},
		{"openai-api/embeddings-string-array.request.json", "Hello 世界! 🌍"},
		{"openai-api/error-400-unsupported-parameter.request.json", "\x1euser\x1f"},
		{"openai-api/error-400-empty-messages.request.json", ""},
		{"vllm-docs/load-lora-adapter.request.json", ""},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			got, _, err := h.renderBody(nil, readFixture(t, tc.file))
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

func TestRenderToolsFirst(t *testing.T) {
	h := NewHasher(HashConfig{})
	body := readFixture(t, "openai-api/chat-completions-tools.request.json")
	got, n, err := h.renderBody(nil, body)
	require.NoError(t, err)
	assert.Equal(t, len(got), n)
	s := string(got)
	require.True(t, strings.HasPrefix(s, "\x1etools\x1f["), s)
	assert.Contains(t, s, `"name": "get_current_weather"`)
	assert.True(t, strings.HasSuffix(s, "\x1euser\x1fWhat is the weather like in Boston today?"), s)

	resp := readFixture(t, "openai-openapi/responses-tools.request.json")
	got, _, err = h.renderBody(nil, resp)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "\x1etools\x1f["))
	assert.True(t, strings.HasSuffix(string(got), "What is the weather like in Boston today?"))
}

func TestRenderKeyOrderAndEscapes(t *testing.T) {
	h := NewHasher(HashConfig{})
	a := `{"model":"m","messages":[{"role":"user","name":"bob","content":"tab\there \"q\" \u00e9 \ud83d\ude00 \/"}]}`
	b := `{"messages":[ {"content":"tab\there \"q\" é 😀 /" , "name":"bob", "role":"user"} ],"model":"m"}`
	ra, _, err := h.renderBody(nil, []byte(a))
	require.NoError(t, err)
	rb, _, err := h.renderBody(nil, []byte(b))
	require.NoError(t, err)
	assert.Equal(t, "\x1euser\x1fbob\x1ftab\there \"q\" é 😀 /", string(ra))
	assert.Equal(t, string(ra), string(rb))
}

func TestRenderToolMessagesAndParts(t *testing.T) {
	h := NewHasher(HashConfig{})
	body := `{"messages":[
	  {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
	  {"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"72F"},{"text":" sunny","type":"text"}]}]}`
	got, _, err := h.renderBody(nil, []byte(body))
	require.NoError(t, err)
	want := "\x1eassistant\x1f\x1d" + `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]` +
		"\x1etool\x1f72F sunny\x1dc1"
	assert.Equal(t, want, string(got))

	items := `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"x","name":"f","arguments":"{}"}]}`
	got, _, err = h.renderBody(nil, []byte(items))
	require.NoError(t, err)
	assert.Equal(t, "\x1euser\x1fhi\x1e\x1d"+`{"type":"function_call","call_id":"x","name":"f","arguments":"{}"}`, string(got))
}

func TestHashBodyMalformed(t *testing.T) {
	h := NewHasher(HashConfig{})
	bad := []string{
		``,
		`[]`,
		`{"messages":[{"role":"user","content":"x"}`,
		`{"messages":"x"}`,
		`{"prompt":[1,2,"x"]}`,
		`{"prompt":"unterminated}`,
		`{"prompt":"bad escape \q"}`,
		`{"prompt":"bad \u12"}`,
		`{"model" "m"}`,
		`{"prompt":true}`,
		`{"prompt":[[1,2],"x"]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]]}`,
		`{"a":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`,
	}
	for _, b := range bad {
		t.Run(b[:min(len(b), 30)], func(t *testing.T) {
			dst := []uint64{1}
			got, n, err := h.HashBody(dst, "m", "", []byte(b))
			require.ErrorIs(t, err, ErrBadBody)
			assert.Equal(t, 0, n)
			assert.Equal(t, dst, got)
		})
	}
}

func TestHashBodyLongPromptStreamsLikeHashText(t *testing.T) {
	h := NewHasher(HashConfig{})
	long := string(text(70_000, 9))
	long = strings.ReplaceAll(long, "q", "\n") // escapes every ~26 bytes
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": long}}})
	require.NoError(t, err)
	got, n, err := h.HashBody(nil, "m", "", body)
	require.NoError(t, err)
	rendered := "\x1euser\x1f" + long
	assert.Equal(t, len(rendered), n)
	assert.Equal(t, h.HashText(nil, "m", "", []byte(rendered)), got)
}

func TestHashBodyToolsOrderDoesNotMatter(t *testing.T) {
	h := NewHasher(HashConfig{BlockBytes: 16})
	msgs := `"messages":[{"role":"system","content":"You are a weather bot."},{"role":"user","content":"Boston?"}]`
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]`
	instr := `"instructions":"Be brief."`
	bodies := []string{
		`{"model":"m",` + tools + `,` + instr + `,` + msgs + `}`,
		`{"model":"m",` + msgs + `,` + tools + `,` + instr + `}`,
		`{` + instr + `,` + msgs + `,"model":"m",` + tools + `}`,
	}
	want, wantN, err := h.HashBody([]uint64{7}, "m", "", []byte(bodies[0]))
	require.NoError(t, err)
	require.Greater(t, len(want), 5)
	for _, b := range bodies[1:] {
		got, n, err := h.HashBody([]uint64{7}, "m", "", []byte(b))
		require.NoError(t, err)
		assert.Equal(t, wantN, n)
		assert.Equal(t, want, got, b)
	}
	r, _, err := h.renderBody(nil, []byte(bodies[1]))
	require.NoError(t, err)
	assert.Equal(t, "\x1etools\x1f[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}]"+
		"\x1esystem\x1fBe brief.\x1esystem\x1fYou are a weather bot.\x1euser\x1fBoston?", string(r))
}
