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

// wantsStream reports whether body has a "stream" key whose value is true.
// It jumps from quote to quote with bytes.IndexByte instead of calling
// bytes.Contains: for a 13-byte needle in a body that opens with many short
// JSON strings, bytes.Contains soon gives up its first-byte skip and
// compares at every offset, 80 µs for run.sh's 220 KB body against 2.8 µs
// for this scan (BenchmarkWantsStream). A perf profile of the server CPU at
// the fixed rate found that search taking 18% of the CPU that the stand-in
// shares with the proxy under test. A quote inside a string can start a
// false match only with an escaped "stream" key in the text, which the
// benchmark bodies do not have.
func wantsStream(body []byte) bool {
	key := []byte(`"stream"`)
	for i := 0; ; {
		j := bytes.IndexByte(body[i:], '"')
		if j < 0 {
			return false
		}
		i += j
		if bytes.HasPrefix(body[i:], key) {
			v := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
			if len(v) > 0 && v[0] == ':' {
				v = bytes.TrimLeft(v[1:], " \t\r\n")
				return bytes.HasPrefix(v, []byte("true"))
			}
		}
		i++
	}
}

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
		stream := wantsStream(buf.Bytes())
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
