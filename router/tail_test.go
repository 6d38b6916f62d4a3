package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vllmResponse is a chat completion as vLLM v0.9 writes it (the member
// order of ChatCompletionResponse and its choice), with content as the
// answer: the usage is the third member from the end.
func vllmResponse(content string) []byte {
	c, _ := json.Marshal(content)
	return []byte(`{"id":"chatcmpl-4f1c","object":"chat.completion","created":1796030229,"model":"meta-llama/Llama-3.1-8B-Instruct",` +
		`"choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":` + string(c) + `,"tool_calls":[]},` +
		`"logprobs":null,"finish_reason":"stop","stop_reason":null}],` +
		`"usage":{"prompt_tokens":812,"total_tokens":1068,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":512}},` +
		`"prompt_logprobs":null,"kv_transfer_params":null}`)
}

// TestTailField checks the backward reader on the shapes responses take
// and on the text it must refuse to guess about: where it is sure it must
// agree with lastField, and it must be sure for the common shapes, or it
// saves nothing.
func TestTailField(t *testing.T) {
	tests := []struct {
		name        string
		obj, key    string
		found, sure bool
		value       string
	}{
		{"usage last", `{"id":"x","usage":{"prompt_tokens":1}}`, "usage", true, true, `{"prompt_tokens":1}`},
		{"vLLM", string(vllmResponse("hi")), "usage", true, true,
			`{"prompt_tokens":812,"total_tokens":1068,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":512}}`},
		{"usage before choices (llm-d)", `{"id":"x","usage":{"prompt_tokens":2},"choices":[{"message":{"content":"}]\"{["}}]}`, "usage", true, true, `{"prompt_tokens":2}`},
		{"blanks everywhere", " {\n \"usage\" :\t{ \"prompt_tokens\" : 3 } ,\r\n \"user\" : null \n}\n ", "usage", true, true, `{ "prompt_tokens" : 3 }`},
		{"strings with escaped quotes and backslashes after it", `{"usage":{},"a":"\"","b":"\\","c":"\\\"{","d":["]\"","\\"]}`, "usage", true, true, `{}`},
		{"the last of two", `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`, "usage", true, true, `{"prompt_tokens":2}`},
		{"a number value", `{"usage":-1.5e+3}`, "usage", true, true, `-1.5e+3`},
		{"absent from a short object", `{"id":"x","choices":[]}`, "usage", false, true, ""},
		{"empty object", ` { } `, "usage", false, true, ""},
		{"nested usage only", `{"choices":[{"usage":{}}]}`, "usage", false, true, ""},
		{"beyond the last six members", `{"usage":{},"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}`, "usage", false, false, ""},
		{"an escaped key after it", `{"usage":{},"us\u0061ge":null}`, "usage", false, false, ""},
		{"an escaped key itself", `{"us\u0061ge":{}}`, "usage", false, false, ""},
		{"not an object", `[{"usage":{}}]`, "usage", false, false, ""},
		{"data after the object", `{"usage":{}} x`, "usage", false, false, ""},
		{"truncated", `{"usage":{"prompt_tokens":1}`, "usage", false, false, ""},
		{"trailing comma", `{"usage":{},}`, "usage", false, false, ""},
		{"missing colon", `{"a" 1,"usage":{}}`, "a", false, false, ""},
		{"missing comma", `{"a":1 "usage":{}}`, "a", false, false, ""},
		{"mismatched brackets", `{"usage":[}}`, "usage", false, false, ""},
		{"unterminated string", `{"usage":"}`, "usage", false, false, ""},
		{"empty value", `{"usage":}`, "usage", false, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := []byte(tc.obj)
			v0, v1, found, sure := tailField(obj, tc.key)
			require.Equal(t, tc.sure, sure, "sure")
			require.Equal(t, tc.found, found, "found")
			if found {
				assert.Equal(t, tc.value, string(obj[v0:v1]))
			}
			if sure && json.Valid(obj) {
				w0, w1, ok := lastField(obj, tc.key)
				assert.Equal(t, ok, found, "lastField finds it too")
				assert.Equal(t, [2]int{w0, w1}, [2]int{v0, v1}, "the same span as lastField")
			}
		})
	}
}

// TestParseUsageLongAnswer: the usage of a long non-streaming answer is
// read from the end, whatever the answer holds, and agrees with
// encoding/json.
func TestParseUsageLongAnswer(t *testing.T) {
	answer := strings.Repeat(`A "usage": {"prompt_tokens": 1} \\ }]{[ `, 2000) // 80 KB of text that looks like JSON
	obj := vllmResponse(answer)
	_, _, found, sure := tailField(obj, "usage")
	require.True(t, sure && found, "read from the end")
	u, ok := parseUsage(obj)
	require.True(t, ok)
	var want struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Done    int `json:"completion_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(obj, &want))
	assert.Equal(t, usage{prompt: want.Usage.Prompt, cached: want.Usage.Details.Cached, completion: want.Usage.Done}, u)
	assert.Equal(t, usage{prompt: 812, cached: 512, completion: 256}, u)
}

// TestParseUsageFarFromTheEnd: a usage followed by more members than
// tailField reads is found by the forward reader, the last of two as
// encoding/json keeps it.
func TestParseUsageFarFromTheEnd(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":9,"completion_tokens":4}`)
	for i := range tailMembers {
		fmt.Fprintf(&b, `,"f%d":"}{"`, i)
	}
	b.WriteString(`}`)
	_, _, _, sure := tailField(b.Bytes(), "usage")
	require.False(t, sure)
	u, ok := parseUsage(b.Bytes())
	require.True(t, ok)
	assert.Equal(t, usage{prompt: 9, completion: 4}, u)
}

// FuzzTailField checks the backward reader against lastField: it never
// panics, it returns a span inside obj, and wherever it is sure about a
// valid JSON object it finds the same value lastField does.
func FuzzTailField(f *testing.F) {
	fuzzBodies(f)
	f.Add(vllmResponse(`a "usage":{} \" \\`))
	f.Add([]byte(`{"usage":{},"a":"\"","b":"\\","c":"\\\"{","d":["]\"","\\"]}`))
	f.Fuzz(func(t *testing.T, obj []byte) {
		for _, key := range []string{"usage", "response", "model", "a"} {
			v0, v1, found, sure := tailField(obj, key)
			if found && (!sure || v0 < 0 || v1 > len(obj) || v0 >= v1) {
				t.Fatalf("tailField(%q, %q) = [%d, %d) found %v sure %v", obj, key, v0, v1, found, sure)
			}
			if !sure || !json.Valid(obj) {
				continue
			}
			w0, w1, ok := lastField(obj, key)
			if ok != found || found && (w0 != v0 || w1 != v1) {
				t.Fatalf("tailField(%q, %q) = [%d, %d) %v, lastField [%d, %d) %v", obj, key, v0, v1, found, w0, w1, ok)
			}
		}
	})
}

// BenchmarkParseUsage reads the usage of vLLM chat completions whose
// answers are 256 bytes and 32 KB long (about 64 and 8,000 tokens).
func BenchmarkParseUsage(b *testing.B) {
	for _, n := range []int{256, 32 << 10} {
		obj := vllmResponse(strings.Repeat("token ", n/6))
		b.Run(fmt.Sprintf("answer=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(obj)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := parseUsage(obj); !ok {
					b.Fatal("no usage")
				}
			}
		})
	}
}
