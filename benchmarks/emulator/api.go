package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals/prefix"
)

// HeaderPod is the response header naming the pod that served a request.
const HeaderPod = "X-Inference-Pod"

// maxBodyBytes bounds a request body.
const maxBodyBytes = 8 << 20

// bytesPerToken is the rendered prompt bytes per token: the library's
// convention (signals/prefix.BytesPerToken, from OpenAI's "1 token ≈ 4
// characters" guide), so a 64-byte hash block is a 16-token KV block.
const bytesPerToken = prefix.BytesPerToken

// blockTokens is the number of tokens per content block: the hasher's
// 64-byte blocks at 4 bytes per token.
const blockTokens = prefix.DefaultBlockBytes / bytesPerToken

func (p *Pod) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { p.serveGenerate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { p.serveGenerate(w, r, false) })
	mux.HandleFunc("GET /v1/models", p.serveModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /metrics", p.serveMetrics)
	return mux
}

// errorBody is vLLM's error shape (vllm/entrypoints/openai/protocol.py,
// ErrorResponse; ../shared/fixtures/openai/llm-d-inference-sim/error-*.json).
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// apiError writes an errorBody with the status as its code.
func apiError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: typ, Code: status}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// serveModels lists the base model and the loaded adapters, in the shape of
// ../shared/fixtures/openai/llm-d-inference-sim/models.response.json.
func (p *Pod) serveModels(w http.ResponseWriter, _ *http.Request) {
	created := p.start.Unix()
	cards := []modelCard{{ID: p.model, Object: "model", Created: created, OwnedBy: "vllm", Root: p.model, MaxModelLen: p.opts.MaxModelLen}}
	for _, a := range p.opts.Adapters {
		parent := p.model
		cards = append(cards, modelCard{ID: a, Object: "model", Created: created, OwnedBy: "vllm",
			Root: "/models/" + a, Parent: &parent, MaxModelLen: p.opts.MaxModelLen})
	}
	b, _ := json.Marshal(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", cards})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// genRequest is the part of a chat or completions body the emulator reads;
// the prompt itself is rendered by the prefix hasher.
type genRequest struct {
	Model               string `json:"model"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	Stream              bool   `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// serveGenerate serves /v1/chat/completions (chat) and /v1/completions.
func (p *Pod) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	// The pod's name, as llm-d-inference-sim sends it
	// (../shared/fixtures/openai/llm-d-inference-sim/*.response.headers),
	// so a client behind a gateway sees which pod served it.
	w.Header().Set(HeaderPod, p.name)
	n := p.received.Add(1)
	f := p.Faults()
	if n > int64(p.opts.MaxRequests) {
		apiError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "the emulated pod has served its request limit")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return
	}
	if len(body) > maxBodyBytes {
		apiError(w, http.StatusRequestEntityTooLarge, "BadRequestError", "request body too large")
		return
	}
	if f.FailAfter > 0 && n > int64(f.FailAfter) {
		apiError(w, http.StatusInternalServerError, "InternalServerError", "EngineCore encountered an issue. See stack trace (above) for the root cause.")
		return
	}
	if f.Hang {
		select {
		case <-r.Context().Done():
		case <-p.stop:
		}
		panic(http.ErrAbortHandler)
	}
	var gr genRequest
	if err := json.Unmarshal(body, &gr); err != nil {
		apiError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	adapter := ""
	switch {
	case gr.Model == p.model:
	case slices.Contains(p.opts.Adapters, gr.Model):
		adapter = gr.Model
	default:
		apiError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", gr.Model))
		return
	}
	blocks, promptBytes, err := p.hasher.HashBody(nil, "", "", body)
	if err != nil {
		apiError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	promptTokens := max((promptBytes+bytesPerToken-1)/bytesPerToken, 1)
	outTokens, explicit := p.opts.DefaultMaxTokens, false
	for _, v := range []*int{gr.MaxCompletionTokens, gr.MaxTokens} {
		if v != nil {
			if *v < 1 {
				apiError(w, http.StatusBadRequest, "BadRequestError", "max_tokens must be at least 1")
				return
			}
			outTokens, explicit = *v, true
			break
		}
	}
	stop := !explicit // the emulated model ends its answer on its own
	if room := p.opts.MaxModelLen - promptTokens; !explicit && room < outTokens {
		// vLLM defaults max_tokens to the context the prompt leaves
		// (max_model_len − prompt tokens), and the answer stops there.
		// A prompt that leaves no room still fails below.
		outTokens, stop = max(room, 1), false
	}
	// Compared without the sum, which a max_tokens near 2^63 overflows;
	// both terms are positive, so their sum fits in a uint64.
	if outTokens > p.opts.MaxModelLen-promptTokens {
		apiError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion",
			p.opts.MaxModelLen, uint64(promptTokens)+uint64(outTokens), promptTokens, outTokens))
		return
	}
	j := newJob(stop, engine.Request{
		ID:           p.nextID.Add(1),
		Blocks:       blocks,
		BlockTokens:  blockTokens,
		PromptTokens: promptTokens,
		OutputTokens: outTokens,
		Adapter:      adapter,
	})
	if err := p.submit(j); err != nil {
		switch {
		case errors.Is(err, ErrKilled):
			panic(http.ErrAbortHandler)
		case errors.Is(err, engine.ErrTooLarge):
			apiError(w, http.StatusBadRequest, "BadRequestError", "the request does not fit in the KV cache")
		default:
			apiError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		}
		return
	}
	rs := &response{
		pod: p, w: w, chat: chat, model: gr.Model, promptTokens: promptTokens,
		finishReason: finishReasons[j.finishStop()], created: time.Now().Unix(), id: p.responseID(chat, j.req.ID),
	}
	if gr.Stream {
		rs.includeUsage = gr.StreamOptions != nil && gr.StreamOptions.IncludeUsage
		rs.stream(r, j, f.DieMidStream)
		return
	}
	rs.whole(r, j)
}

func (p *Pod) responseID(chat bool, id uint64) string {
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	return prefix + p.name + "-" + strconv.FormatUint(id, 10)
}
