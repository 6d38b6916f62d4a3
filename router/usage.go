package router

import (
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// usage is the token usage of a response.
type usage struct {
	prompt, cached, completion int
}

func (u usage) apply(o *signals.Outcome) {
	o.PromptTokens, o.CachedTokens, o.CompletionTokens = u.prompt, u.cached, u.completion
}

// parseUsage reads the "usage" object of a response or SSE chunk:
// prompt_tokens, completion_tokens and prompt_tokens_details.cached_tokens
// (chat completions, completions, embeddings), or input_tokens,
// output_tokens and input_tokens_details.cached_tokens (responses, whose
// stream carries it in the "response" object of its response.completed
// event). A null or absent usage is not ok. Where a key repeats, the last
// counts, as encoding/json reads it. The usage is looked for from the end
// of obj (lateField), so a long answer before it costs nothing.
func parseUsage(obj []byte) (usage, bool) {
	var u usage
	v0, v1, found := lateField(obj, "usage")
	if !found || obj[v0] != '{' {
		if r0, r1, ok := lateField(obj, "response"); ok && obj[r0] == '{' {
			return parseUsage(obj[r0:r1])
		}
		return u, false
	}
	v := obj[v0:v1]
	_, err := prefix.Fields(v, func(k []byte, a, b int) error {
		switch string(k) {
		case "prompt_tokens", "input_tokens":
			u.prompt, _ = intValue(v[a:b])
		case "completion_tokens", "output_tokens":
			u.completion, _ = intValue(v[a:b])
		case "prompt_tokens_details", "input_tokens_details":
			d := v[a:b]
			if c0, c1, ok := lastField(d, "cached_tokens"); ok {
				u.cached, _ = intValue(d[c0:c1])
			}
		}
		return nil
	})
	return u, err == nil
}

// rewriteModelField returns obj with the string value of its top-level
// "model" key replaced by to, or, when it has none, that of the "model" of
// its "response" object (the responses API's stream events carry the
// response there, as parseUsage reads its usage); or obj itself when it has
// neither (or already says to). A rewritten result is a new slice.
func rewriteModelField(obj []byte, to string) []byte {
	v0, v1, ok := findField(obj, "model")
	if !ok {
		r0, r1, ok := findField(obj, "response")
		if !ok || obj[r0] != '{' {
			return obj
		}
		if v0, v1, ok = findField(obj[r0:r1], "model"); !ok {
			return obj
		}
		v0, v1 = r0+v0, r0+v1
	}
	if obj[v0] != '"' {
		return obj
	}
	if cur, ok := stringValue(obj[v0:v1]); ok && cur == to {
		return obj
	}
	return splice(obj, v0, v1, to)
}
