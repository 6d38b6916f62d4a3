package prefix

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

var benchSizes = []int{1 << 10, 32 << 10, 512 << 10}

// BenchmarkHashText measures hashing throughput of rendered prompt text
// (issue 4 target: at least 3 GB/s).
func BenchmarkHashText(b *testing.B) {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	for _, n := range benchSizes {
		txt := text(n, 1)
		dst := make([]uint64, 0, n/64)
		b.Run(fmt.Sprintf("%dKB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				dst = h.HashText(dst[:0], "meta-llama/Llama-3.1-8B-Instruct", "", txt)
			}
		})
	}
}

// BenchmarkHashTokens measures hashing throughput of token-id prompts; the
// bytes are counted as BytesPerToken per id so the figure compares with
// BenchmarkHashText.
func BenchmarkHashTokens(b *testing.B) {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	for _, n := range benchSizes {
		toks := make([]int, n/BytesPerToken)
		for i := range toks {
			toks[i] = (i * 7919) % 128000
		}
		dst := make([]uint64, 0, len(toks)/16)
		b.Run(fmt.Sprintf("%dKB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				dst = h.HashTokens(dst[:0], "m", "", toks)
			}
		})
	}
}

// BenchmarkHashBody measures rendering plus hashing of a chat body whose
// prompt is about n bytes: a system prompt and user turns with the escapes
// (newlines, quotes) of real prompts.
func BenchmarkHashBody(b *testing.B) {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	for _, n := range benchSizes {
		body := chatBody(n)
		dst := make([]uint64, 0, n/64+8)
		b.Run(fmt.Sprintf("%dKB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				dst, _, err = h.HashBody(dst[:0], "m", "", body)
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chatBody returns a chat completions body with about n bytes of prompt.
func chatBody(n int) []byte {
	line := "The quick brown fox said \"hello\" and jumped over the lazy dog.\n"
	sys := strings.Repeat(line, max(n/2/len(line), 1))
	user := strings.Repeat(line, max(n/2/len(line), 1))
	body, _ := json.Marshal(map[string]any{
		"model": "m",
		"messages": []map[string]string{
			{"role": "system", "content": sys},
			{"role": "user", "content": user},
		},
	})
	return body
}
