package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals"
)

// testSpeed runs the engine 50× faster than the modelled GPU so tests are
// quick; results do not depend on it.
const testSpeed = 50

// prompt640 is 640 bytes: 160 tokens at 4 bytes per token, 10 KV blocks.
var prompt640 = strings.Repeat("abcdefgh", 80)

func startPod(t *testing.T, o Options) *Pod {
	t.Helper()
	if o.Speed == 0 {
		o.Speed = testSpeed
	}
	if o.Lifetime == 0 {
		o.Lifetime = time.Minute
	}
	p, err := Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	return resp
}

// wireError is the error shape of vLLM's OpenAI server, as the recordings
// in ../shared/fixtures/openai show it: written apart from api.go's
// errorBody, so that a wrong tag there fails here.
type wireError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func decode[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v
}

// readSSE reads an event stream until EOF and returns the data payloads
// and the read error (nil at a clean EOF).
func readSSE(r io.Reader) ([]string, error) {
	var out []string
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if s, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			out = append(out, s)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

func TestCompletionsPrefixCache(t *testing.T) {
	p := startPod(t, Options{})
	body := `{"model":"` + DefaultModel + `","prompt":"` + prompt640 + `","max_tokens":5}`
	tests := []struct {
		name   string
		cached int
	}{
		// 160 tokens, nothing cached yet.
		{"cold", 0},
		// The same prompt again: vLLM reuses every full block but the one
		// holding the last prompt token, (160-1)/16 = 9 blocks of 16 tokens.
		{"warm", 144},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, p.URL()+"/v1/completions", body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.Equal(t, p.Name(), resp.Header.Get(HeaderPod))
			c := decode[completion](t, resp)
			assert.Equal(t, "text_completion", c.Object)
			assert.Equal(t, DefaultModel, c.Model)
			require.Len(t, c.Choices, 1)
			require.NotNil(t, c.Choices[0].FinishReason)
			assert.Equal(t, "length", *c.Choices[0].FinishReason)
			words := strings.Count(c.Choices[0].Text, " ") + strings.Count(c.Choices[0].Text, ",") + strings.Count(c.Choices[0].Text, ".")
			assert.Equal(t, 5, words, "one word per token: %q", c.Choices[0].Text)
			require.NotNil(t, c.Usage)
			assert.Equal(t, usage{PromptTokens: 160, CompletionTokens: 5, TotalTokens: 165,
				PromptTokensDetails: struct {
					CachedTokens int `json:"cached_tokens"`
				}{tt.cached}}, *c.Usage)
		})
	}
}

func TestChatNonStreaming(t *testing.T) {
	p := startPod(t, Options{Adapters: []string{"sql-lora"}})
	// Rendered chat prompt: separator, role, separator, content per message.
	resp := post(t, p.URL()+"/v1/chat/completions",
		`{"model":"sql-lora","messages":[{"role":"user","content":"Hello there"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	c := decode[completion](t, resp)
	assert.Equal(t, "chat.completion", c.Object)
	assert.Equal(t, "sql-lora", c.Model)
	require.Len(t, c.Choices, 1)
	require.NotNil(t, c.Choices[0].Message)
	assert.Equal(t, "assistant", c.Choices[0].Message.Role)
	require.NotNil(t, c.Choices[0].FinishReason)
	assert.Equal(t, "stop", *c.Choices[0].FinishReason, "no max_tokens: the emulated model stops by itself")
	require.NotNil(t, c.Usage)
	assert.Equal(t, DefaultMaxTokens, c.Usage.CompletionTokens)
	assert.Equal(t, c.Usage.PromptTokens+DefaultMaxTokens, c.Usage.TotalTokens)
}

func TestStreaming(t *testing.T) {
	p := startPod(t, Options{})
	tests := []struct {
		name      string
		path      string
		body      string
		usage     bool
		roleChunk bool
	}{
		{"chat with usage", "/v1/chat/completions",
			`{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":7}`, true, true},
		{"chat without usage", "/v1/chat/completions",
			`{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":7}`, false, true},
		{"completions with usage", "/v1/completions",
			`{"model":"` + DefaultModel + `","prompt":"` + prompt640 + `","stream":true,"stream_options":{"include_usage":true},"max_tokens":7}`, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, p.URL()+tt.path, tt.body)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
			data, err := readSSE(resp.Body)
			require.NoError(t, err)
			want := 7 + 1 // content chunks and [DONE]
			if tt.usage {
				want++
			}
			if tt.roleChunk {
				want++
			}
			require.Len(t, data, want)
			assert.Equal(t, "[DONE]", data[len(data)-1])
			content := data[:len(data)-1]
			if tt.usage {
				var u completion
				require.NoError(t, json.Unmarshal([]byte(content[len(content)-1]), &u))
				assert.Empty(t, u.Choices)
				require.NotNil(t, u.Usage)
				assert.Equal(t, 7, u.Usage.CompletionTokens)
				content = content[:len(content)-1]
			}
			if tt.roleChunk {
				var c completion
				require.NoError(t, json.Unmarshal([]byte(content[0]), &c))
				assert.Equal(t, "chat.completion.chunk", c.Object)
				assert.Equal(t, "assistant", c.Choices[0].Delta.Role)
				content = content[1:]
			}
			for i, s := range content {
				var c completion
				require.NoError(t, json.Unmarshal([]byte(s), &c), s)
				require.Len(t, c.Choices, 1)
				assert.Nil(t, c.Usage)
				if i == len(content)-1 {
					require.NotNil(t, c.Choices[0].FinishReason)
					assert.Equal(t, "length", *c.Choices[0].FinishReason)
				} else {
					assert.Nil(t, c.Choices[0].FinishReason)
				}
			}
		})
	}
}

func TestModelsAndHealth(t *testing.T) {
	p := startPod(t, Options{Adapters: []string{"sql-lora", "chat-lora"}})
	resp, err := http.Get(p.URL() + "/v1/models")
	require.NoError(t, err)
	list := decode[struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}](t, resp)
	assert.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 3)
	assert.Equal(t, DefaultModel, list.Data[0].ID)
	assert.Nil(t, list.Data[0].Parent)
	for i, name := range []string{"sql-lora", "chat-lora"} {
		assert.Equal(t, name, list.Data[i+1].ID)
		require.NotNil(t, list.Data[i+1].Parent)
		assert.Equal(t, DefaultModel, *list.Data[i+1].Parent)
		assert.Equal(t, DefaultMaxModelLen, list.Data[i+1].MaxModelLen)
	}

	resp, err = http.Get(p.URL() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestErrors(t *testing.T) {
	p := startPod(t, Options{MaxModelLen: 200})
	tests := []struct {
		name   string
		body   string
		status int
		typ    string
		msg    string
	}{
		{"unknown model", `{"model":"no-such-lora","prompt":"x"}`, 404, "NotFoundError", "The model `no-such-lora` does not exist."},
		// 160 prompt tokens + 100 > 200.
		{"too long", `{"model":"` + DefaultModel + `","prompt":"` + prompt640 + `","max_tokens":100}`, 400, "BadRequestError",
			"This model's maximum context length is 200 tokens. However, you requested 260 tokens (160 in the messages, 100 in the completion). Please reduce the length of the messages or completion"},
		{"bad json", `{"model":`, 400, "BadRequestError", ""},
		{"zero max_tokens", `{"model":"` + DefaultModel + `","prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, p.URL()+"/v1/completions", tt.body)
			require.Equal(t, tt.status, resp.StatusCode)
			e := decode[wireError](t, resp)
			assert.Equal(t, tt.typ, e.Error.Type)
			assert.Equal(t, tt.status, e.Error.Code)
			assert.Nil(t, e.Error.Param)
			if tt.msg != "" {
				assert.Equal(t, tt.msg, e.Error.Message)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	tests := []struct {
		name string
		o    Options
	}{
		{"not loopback", Options{Addr: "0.0.0.0:0"}},
		{"bad address", Options{Addr: "nonsense"}},
		{"unknown profile", Options{Profile: "tpu-v9"}},
		{"bad engine", Options{Engine: engine.Config{Profile: engine.Profiles()[0], MaxNumSeqs: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Start(context.Background(), tt.o)
			assert.Error(t, err)
			assert.Nil(t, p)
		})
	}
}

func TestKillRestart(t *testing.T) {
	p := startPod(t, Options{})
	addr := p.Addr()
	// A long stream to be cut: 10000 tokens at 50× speed takes well over
	// the time to the first chunk.
	resp := post(t, p.URL()+"/v1/chat/completions",
		`{"model":"`+DefaultModel+`","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4000}`)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	_, err := br.ReadString('\n') // the first chunk arrived
	require.NoError(t, err)

	p.Kill()
	assert.False(t, p.Up())
	data, err := readSSE(br)
	require.Error(t, err, "a killed pod must break the stream, not end it")
	assert.NotContains(t, data, "[DONE]")

	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err, "a killed pod refuses connections")
	assert.Zero(t, p.Stats().PromptTokens, "the engine restarts empty")

	require.NoError(t, p.Restart())
	assert.Equal(t, addr, p.Addr())
	r2 := post(t, p.URL()+"/v1/completions", `{"model":"`+DefaultModel+`","prompt":"`+prompt640+`","max_tokens":2}`)
	c := decode[completion](t, r2)
	require.NotNil(t, c.Usage)
	assert.Equal(t, 0, c.Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, uint64(160), p.Stats().PromptTokens)
}

func TestFaults(t *testing.T) {
	body := `{"model":"` + DefaultModel + `","prompt":"hello","max_tokens":6,"stream":true}`
	t.Run("fail after", func(t *testing.T) {
		p := startPod(t, Options{Faults: Faults{FailAfter: 1}})
		r1 := post(t, p.URL()+"/v1/completions", body)
		_, _ = io.Copy(io.Discard, r1.Body)
		r1.Body.Close()
		assert.Equal(t, http.StatusOK, r1.StatusCode)
		r2 := post(t, p.URL()+"/v1/completions", body)
		r2.Body.Close()
		assert.Equal(t, http.StatusInternalServerError, r2.StatusCode)
		assert.Equal(t, int64(2), p.Received())
	})
	t.Run("die mid-stream", func(t *testing.T) {
		p := startPod(t, Options{Faults: Faults{DieMidStream: 3}})
		resp := post(t, p.URL()+"/v1/completions", body)
		defer resp.Body.Close()
		data, err := readSSE(resp.Body)
		require.Error(t, err)
		assert.True(t, errors.Is(err, io.ErrUnexpectedEOF), "got %v", err)
		assert.Len(t, data, 3)
	})
	t.Run("hang", func(t *testing.T) {
		p := startPod(t, Options{Faults: Faults{Hang: true}})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/v1/completions", strings.NewReader(body))
		require.NoError(t, err)
		_, err = http.DefaultClient.Do(req)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// Faults change at run time.
		p.SetFaults(Faults{})
		r := post(t, p.URL()+"/v1/completions", body)
		r.Body.Close()
		assert.Equal(t, http.StatusOK, r.StatusCode)
	})
	t.Run("request limit", func(t *testing.T) {
		p := startPod(t, Options{MaxRequests: 1})
		r1 := post(t, p.URL()+"/v1/completions", body)
		_, _ = io.Copy(io.Discard, r1.Body)
		r1.Body.Close()
		r2 := post(t, p.URL()+"/v1/completions", body)
		r2.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, r2.StatusCode)
	})
}

func TestLifetime(t *testing.T) {
	p := startPod(t, Options{Lifetime: 50 * time.Millisecond})
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the pod did not stop after its lifetime")
	}
	assert.False(t, p.Up())
}

func TestFleet(t *testing.T) {
	f, err := StartFleet(context.Background(), []Options{
		{Profile: "h100-llama3-8b", Speed: testSpeed, Lifetime: time.Minute},
		{Profile: "l4-llama3-8b", Speed: testSpeed, Lifetime: time.Minute, Adapters: []string{"a"}},
	})
	require.NoError(t, err)
	defer f.Close()
	specs := f.Specs()
	require.Len(t, specs, 2)
	assert.Equal(t, "h100-llama3-8b-0", specs[0].Name)
	assert.Equal(t, "l4-llama3-8b-1", specs[1].Name)
	assert.Equal(t, "vllm", specs[1].Engine)
	assert.Equal(t, []string{"a"}, specs[1].Adapters)
	assert.Equal(t, "l4-llama3-8b", specs[1].Labels[signals.LabelGPU])
	assert.NotEqual(t, specs[0].Address, specs[1].Address)
	eps := f.Endpoints()
	require.Len(t, eps, 2)
	assert.True(t, eps[0].Healthy())

	_, err = StartFleet(context.Background(), []Options{{}, {Profile: "nope"}})
	require.Error(t, err)
}

// The emulated output is one vocabulary word per token.
func TestWord(t *testing.T) {
	var b bytes.Buffer
	for i := range 3 {
		b.WriteString(word(1, i))
	}
	// id 1: offsets 7, 8, 9.
	assert.Equal(t, " replica that can", b.String())
}
