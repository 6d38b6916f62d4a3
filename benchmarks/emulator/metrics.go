package emulator

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ttftBuckets are the bucket bounds of vLLM V1's
// vllm:time_to_first_token_seconds histogram (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger: histogram_time_to_first_token).
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// histogram is a Prometheus histogram: per-bucket (non-cumulative) counts,
// a count and a sum. Guarded by the pod's lock.
type histogram struct {
	bounds []float64
	counts []uint64
	count  uint64
	sum    float64
}

func (h *histogram) init(bounds []float64) {
	h.bounds = bounds
	h.counts = make([]uint64, len(bounds))
	h.count, h.sum = 0, 0
}

func (h *histogram) reset() { h.init(h.bounds) }

func (h *histogram) observe(v float64) {
	h.count++
	h.sum += v
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// finishReasons are the finish reasons of the emulated requests, in the
// order of Pod.ok: "length" when max_tokens was given, "stop" otherwise.
var finishReasons = [...]string{"length", "stop"}

// metricsContentType is the Prometheus text exposition format 0.0.4.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

// serveMetrics writes the pod's /metrics page: vLLM V1's metric names and
// label sets (vllm/v1/metrics/loggers.py; the sample lines of
// ../shared/fixtures/metrics/llm-d-inference-sim-*.prom and vllm-v0.prom).
func (p *Pod) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	b := p.appendMetrics(make([]byte, 0, 8<<10))
	w.Header().Set("Content-Type", metricsContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func (p *Pod) appendMetrics(b []byte) []byte {
	p.mu.Lock()
	st := p.eng.Stats()
	h := histogram{bounds: p.ttft.bounds, counts: append([]uint64(nil), p.ttft.counts...), count: p.ttft.count, sum: p.ttft.sum}
	ok := p.ok
	p.mu.Unlock()

	model := `{model_name="` + escapeLabel(p.model) + `"}`
	gauge := func(name, help string, v float64) {
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" gauge\n"+name+model+" "...)
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
		b = append(b, '\n')
	}
	// A counter's HELP and TYPE lines name it with its _total suffix, as
	// vLLM's prometheus_client writes them (../shared/fixtures/metrics/
	// vllm-v0.prom: "# TYPE vllm:num_preemptions_total counter"), so that
	// a text parser files the sample under the declared counter.
	counter := func(name, help string, v uint64) {
		name += "_total"
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" counter\n"+name+model+" "...)
		b = strconv.AppendUint(b, v, 10)
		b = append(b, '\n')
	}

	b = append(b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.\n"+
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\""...)
	b = strconv.AppendInt(b, int64(st.BlockSize), 10)
	b = append(b, `",enable_prefix_caching="`...)
	b = strconv.AppendBool(b, p.eng.Config().EnablePrefixCaching)
	b = append(b, `",num_gpu_blocks="`...)
	b = strconv.AppendInt(b, int64(st.NumBlocks), 10)
	b = append(b, "\"} 1\n"...)

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.Running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.Waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.KVCacheUsage)
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", st.PrefixQueries)
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", st.PrefixHits)
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.Preemptions)
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.PromptTokens)
	counter("vllm:generation_tokens", "Number of generation tokens processed.", st.GeneratedTokens)

	// One series per finish reason, labelled finished_reason as vLLM does
	// (../shared/fixtures/metrics/vllm-v0.prom: "length";
	// vllm-v0-aibrix-docs-partial.prom: "stop").
	b = append(b, "# HELP vllm:request_success_total Count of successfully processed requests.\n"+
		"# TYPE vllm:request_success_total counter\n"...)
	for i, reason := range finishReasons {
		b = append(b, `vllm:request_success_total{finished_reason="`+reason+`",model_name="`...)
		b = append(b, escapeLabel(p.model)...)
		b = append(b, "\"} "...)
		b = strconv.AppendUint(b, ok[i], 10)
		b = append(b, '\n')
	}

	// vllm:lora_requests_info's value is the time of the last update, in
	// seconds since the epoch; its state is in the labels.
	b = append(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n"+
		"# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\""...)
	b = strconv.AppendInt(b, int64(st.MaxLoRA), 10)
	b = append(b, `",running_lora_adapters="`...)
	b = append(b, escapeLabel(strings.Join(st.RunningAdapters, ","))...)
	b = append(b, `",waiting_lora_adapters="`...)
	b = append(b, escapeLabel(strings.Join(st.WaitingAdapters, ","))...)
	b = append(b, "\"} "...)
	b = strconv.AppendFloat(b, float64(time.Now().UnixNano())/1e9, 'e', 9, 64)
	b = append(b, '\n')

	const ttft = "vllm:time_to_first_token_seconds"
	b = append(b, "# HELP "+ttft+" Histogram of time to first token in seconds.\n# TYPE "+ttft+" histogram\n"...)
	var cum uint64
	for i, bound := range h.bounds {
		cum += h.counts[i]
		b = append(b, ttft+`_bucket{le="`...)
		b = strconv.AppendFloat(b, bound, 'f', -1, 64)
		b = append(b, `",model_name="`+escapeLabel(p.model)+`"} `...)
		b = strconv.AppendUint(b, cum, 10)
		b = append(b, '\n')
	}
	b = append(b, ttft+`_bucket{le="+Inf",model_name="`+escapeLabel(p.model)+`"} `...)
	b = strconv.AppendUint(b, h.count, 10)
	b = append(b, "\n"+ttft+"_count"+model+" "...)
	b = strconv.AppendUint(b, h.count, 10)
	b = append(b, "\n"+ttft+"_sum"+model+" "...)
	b = strconv.AppendFloat(b, h.sum, 'g', -1, 64)
	b = append(b, '\n')
	return b
}

// escapeLabel escapes a label value for the text exposition format:
// backslash, double quote and line feed.
func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return r.Replace(s)
}
