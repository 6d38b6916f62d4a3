package main

import (
	"bytes"
	"strings"
	"testing"
)

// overheadBody is run.sh's make_body: a system prompt and a user message of
// size bytes of English text without quotes or escapes.
func overheadBody(size int) []byte {
	s := "The quick brown fox jumps over the lazy dog while the model server keeps its cache warm. "
	text := strings.Repeat(s, size/len(s)+1)[:size-220]
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` +
		text + `"}],"max_tokens":64,"temperature":0.7,"user":"bench"}`)
}

func TestWantsStream(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"model":"m","stream":true}`, true},
		{`{"stream" : true,"model":"m"}`, true},
		{"{\"stream\":\n\ttrue}", true},
		{`{"model":"m","stream":false}`, false},
		{`{"model":"m"}`, false},
		{`{"model":"m","stream_options":{"include_usage":true}}`, false},
		{`{"model":"m","stream_options":{"include_usage":true},"stream":true}`, true},
		{`{"stream"`, false},
		{`{"stream":`, false},
		{``, false},
		{`"`, false},
	} {
		if got := wantsStream([]byte(tc.body)); got != tc.want {
			t.Errorf("wantsStream(%q) = %v, want %v", tc.body, got, tc.want)
		}
	}
	big := overheadBody(220 << 10)
	if wantsStream(big) {
		t.Error("the 220 KB benchmark body does not stream")
	}
	streamed := bytes.Replace(big, []byte(`"max_tokens":64`), []byte(`"stream":true,"max_tokens":64`), 1)
	if !wantsStream(streamed) {
		t.Error("the 220 KB body with stream:true streams")
	}
}

// BenchmarkWantsStream compares the quote-to-quote scan with the
// bytes.Contains it replaced, on run.sh's 220 KB body.
func BenchmarkWantsStream(b *testing.B) {
	body := overheadBody(220 << 10)
	b.Run("quotes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if wantsStream(body) {
				b.Fatal("stream")
			}
		}
	})
	b.Run("bytes.Contains", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if bytes.Contains(body, []byte(`"stream":true`)) {
				b.Fatal("stream")
			}
		}
	})
}
