// Command backend is the model server stand-in of the overhead benchmark:
// a minimal net/http server that reads and discards the request body and
// answers every POST with the same small chat completion (as an SSE stream
// of chunks when the body asks for "stream":true), and /metrics with an
// idle vLLM page, so that what wrk measures through a proxy is the proxy's
// own cost.
//
// Usage:
//
//	backend -listen 127.0.0.1:18101
package main

import (
	"bytes"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// completion has the shape of a vLLM chat completion (compare
// shared/fixtures/openai/llm-d-inference-sim/chat-completions.response.json).
const completion = `{"id":"chatcmpl-overhead","object":"chat.completion","created":1796030229,` +
	`"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"finish_reason":"stop",` +
	`"message":{"role":"assistant","content":"I am fine, how "}}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":0}}}`

// chunks is the streamed form of completion, in vLLM's chunk shape (compare
// shared/fixtures/openai/llm-d-inference-sim/chat-completions-lora-stream.response.sse).
var chunks = []string{
	`{"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1796030229,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`,
	`{"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1796030229,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"I am fine, "},"finish_reason":null}]}`,
	`{"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1796030229,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"how "},"finish_reason":"stop"}]}`,
	`{"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1796030229,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`,
	`[DONE]`,
}

// metrics is an idle vLLM V1 page with the families the scraper reads.
const metrics = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1
`

func main() {
	listen := flag.String("listen", "127.0.0.1:18101", "listen address")
	flag.Parse()
	body := []byte(completion)
	page := []byte(metrics)
	clen := strconv.Itoa(len(body))
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(page)
	})
	bufs := sync.Pool{New: func() any { return new(bytes.Buffer) }}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		buf := bufs.Get().(*bytes.Buffer)
		buf.Reset()
		_, _ = buf.ReadFrom(r.Body)
		stream := bytes.Contains(buf.Bytes(), []byte(`"stream":true`))
		bufs.Put(buf)
		h := w.Header()
		if stream {
			h.Set("Content-Type", "text/event-stream")
			for _, c := range chunks {
				_, _ = io.WriteString(w, "data: "+c+"\n\n")
				w.(http.Flusher).Flush()
			}
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", clen)
		_, _ = w.Write(body)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
