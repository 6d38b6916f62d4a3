package emulator

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// vocabulary is the emulated output text, one word per token.
var vocabulary = [...]string{
	" The", " model", " routes", " each", " request", " to", " the", " replica",
	" that", " can", " serve", " it", " first", ",", " using", " its",
	" cache", " and", " queue", ".", " Tokens", " stream", " back", " as",
	" they", " are", " decoded", " by", " a", " batch", " of", " steps",
}

// word returns the text of output token i of request id.
func word(id uint64, i int) string {
	return vocabulary[(id*7+uint64(i))%uint64(len(vocabulary))]
}

// response writes one chat or completions answer in vLLM's shapes
// (vllm/entrypoints/openai/serving_chat.py and serving_completion.py;
// ../shared/fixtures/openai/*/{chat-completions,completions}*.response.*).
type response struct {
	pod          *Pod
	w            http.ResponseWriter
	chat         bool
	model        string
	id           string
	created      int64
	promptTokens int
	finishReason string
	includeUsage bool
	buf          []byte
}

func jsonString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// head appends the fields every object of the response starts with.
func (rs *response) head(b []byte, object string) []byte {
	b = append(b, `{"id":`...)
	b = jsonString(b, rs.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, rs.created, 10)
	b = append(b, `,"model":`...)
	return jsonString(b, rs.model)
}

func (rs *response) usage(b []byte, completion, cached int) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(rs.promptTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(rs.promptTokens+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(cached), 10)
	return append(b, "}}"...)
}

func (rs *response) chunkObject() string {
	if rs.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

// chunk appends one SSE event carrying text; finish is "" or the finish
// reason; role adds the assistant role (the first chat chunk).
func (rs *response) chunk(b []byte, text string, finish string, role bool) []byte {
	b = append(b, "data: "...)
	b = rs.head(b, rs.chunkObject())
	b = append(b, `,"choices":[{"index":0,`...)
	if rs.chat {
		b = append(b, `"delta":{`...)
		if role {
			b = append(b, `"role":"assistant","content":""`...)
		} else {
			b = append(b, `"content":`...)
			b = jsonString(b, text)
		}
		b = append(b, `},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `"text":`...)
		b = jsonString(b, text)
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	}
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = jsonString(b, finish)
	}
	return append(b, "}]}\n\n"...)
}

// stream answers with SSE chunks as the engine produces tokens. Headers go
// out with the first token, as the first chunk; a pod killed before then
// breaks the connection before any response byte. dieAfter > 0 cuts the
// connection after that many content chunks.
func (rs *response) stream(r *http.Request, j *job, dieAfter int) {
	rc := http.NewResponseController(rs.w)
	sent := 0
	started := false
	for {
		select {
		case <-j.notify:
		case <-r.Context().Done():
			return
		}
		pr := j.progress()
		if pr.err != nil {
			panic(http.ErrAbortHandler)
		}
		if pr.tokens == 0 {
			continue
		}
		b := rs.buf[:0]
		if !started {
			started = true
			h := rs.w.Header()
			h.Set("Content-Type", "text/event-stream; charset=utf-8")
			h.Set("Cache-Control", "no-cache")
			rs.w.WriteHeader(http.StatusOK)
			if rs.chat {
				b = rs.chunk(b, "", "", true)
			}
		}
		for sent < pr.tokens {
			finish := ""
			if pr.finished && sent == pr.tokens-1 {
				finish = rs.finishReason
			}
			b = rs.chunk(b, word(j.req.ID, sent), finish, false)
			sent++
			if dieAfter > 0 && sent >= dieAfter && !(pr.finished && sent == pr.tokens) {
				_, _ = rs.w.Write(b)
				_ = rc.Flush()
				panic(http.ErrAbortHandler)
			}
		}
		if pr.finished {
			if rs.includeUsage {
				b = append(b, "data: "...)
				b = rs.head(b, rs.chunkObject())
				b = append(b, `,"choices":[],`...)
				b = rs.usage(b, pr.tokens, pr.cached)
				b = append(b, "}\n\n"...)
			}
			b = append(b, "data: [DONE]\n\n"...)
		}
		if _, err := rs.w.Write(b); err != nil {
			return
		}
		_ = rc.Flush()
		rs.buf = b
		if pr.finished {
			return
		}
	}
}

// whole answers with one JSON object once the request finished.
func (rs *response) whole(r *http.Request, j *job) {
	for {
		select {
		case <-j.notify:
		case <-r.Context().Done():
			return
		}
		pr := j.progress()
		if pr.err != nil {
			panic(http.ErrAbortHandler)
		}
		if !pr.finished {
			continue
		}
		text := make([]byte, 0, pr.tokens*8)
		for i := range pr.tokens {
			text = append(text, word(j.req.ID, i)...)
		}
		var b []byte
		if rs.chat {
			b = rs.head(b, "chat.completion")
			b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
			b = jsonString(b, string(text))
			b = append(b, `},"logprobs":null,"finish_reason":`...)
		} else {
			b = rs.head(b, "text_completion")
			b = append(b, `,"choices":[{"index":0,"text":`...)
			b = jsonString(b, string(text))
			b = append(b, `,"logprobs":null,"finish_reason":`...)
		}
		b = jsonString(b, rs.finishReason)
		b = append(b, "}],"...)
		b = rs.usage(b, pr.tokens, pr.cached)
		b = append(b, '}')
		h := rs.w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(b)))
		rs.w.WriteHeader(http.StatusOK)
		_, _ = rs.w.Write(b)
		return
	}
}
