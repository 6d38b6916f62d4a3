package prefix

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkHashBodyVsLegacy runs HashBody and the first version of the
// renderer (legacyHashBody) on the same bodies in one run, so that their
// ratio is measured under the same machine load.
func BenchmarkHashBodyVsLegacy(b *testing.B) {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	for _, n := range benchSizes {
		body := chatBody(n)
		dst := make([]uint64, 0, n/64+8)
		for _, impl := range []struct {
			name string
			fn   func([]uint64, string, string, []byte) ([]uint64, int, error)
		}{{"new", h.HashBody}, {"legacy", h.legacyHashBody}} {
			b.Run(fmt.Sprintf("%dKB/%s", n>>10, impl.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					var err error
					dst, _, err = impl.fn(dst[:0], "m", "", body)
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPromptRead measures Prompt.Read alone, rendering without
// hashing, on four kinds of body: "chat" (chatBody, the hashing benchmarks'
// body), "router" (routerChatBody, the router benchmarks' body, with an
// escape every 31 bytes), "prose" (proseChatBody: a newline escape at the
// end of each paragraph of about 400 bytes) and "plain" (the same text
// without a single escape, like the overhead benchmark's 220 KB prompt).
func BenchmarkPromptRead(b *testing.B) {
	h := NewHasher(HashConfig{MaxBlocks: 1 << 20})
	type namedBody struct {
		name string
		body []byte
	}
	var bodies []namedBody
	for _, n := range benchSizes {
		bodies = append(bodies, namedBody{fmt.Sprintf("chat/%dKB", n>>10), chatBody(n)})
	}
	for _, n := range []int{1 << 10, 32 << 10, 220 << 10} {
		bodies = append(bodies, namedBody{fmt.Sprintf("router/%dKB", n>>10), routerChatBody(n)})
	}
	for _, n := range []int{1 << 10, 32 << 10, 220 << 10} {
		bodies = append(bodies, namedBody{fmt.Sprintf("prose/%dKB", n>>10), proseChatBody(n, `\n\n`)})
	}
	bodies = append(bodies, namedBody{"plain/220KB", proseChatBody(220<<10, " ")})
	for _, c := range bodies {
		pr := h.NewPrompt()
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pr.Read(c.body, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// routerChatBody is the body of the router's benchmarks: role before
// content, an escape every 31 bytes on average.
func routerChatBody(size int) []byte {
	var sb strings.Builder
	sentence := `The quick brown fox jumps over the lazy dog, then says \"hello\" and writes a line of code.\n`
	for sb.Len() < size-200 {
		sb.WriteString(sentence)
	}
	text := strings.TrimRight(sb.String()[:max(size-200, 0)], `\`)
	return fmt.Appendf(nil, `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"temperature":0.7,"user":"u-42"}`, text)
}

// proseChatBody is a chat body whose user message is about size bytes of
// paragraphs of about 400 bytes, each ending with sep (a JSON fragment: an
// escape such as \n\n, or a space for text without escapes).
func proseChatBody(size int, sep string) []byte {
	sentence := "The model server keeps the prompt's prefix in its cache, so the router sends the next turn to the same replica. "
	paragraph := strings.Repeat(sentence, 4) + sep
	text := strings.Repeat(paragraph, size/len(paragraph)+1)[:max(size-200, 0)]
	text = strings.TrimRight(text, `\`)
	return fmt.Appendf(nil, `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}],"max_tokens":256,"user":"u-42"}`, text)
}
