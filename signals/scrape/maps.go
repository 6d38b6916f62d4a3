package scrape

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Aggregation says how the samples that one Selector matches are combined
// into a single value.
type Aggregation string

// Aggregation modes. The zero Aggregation means the default of the field the
// selector is used for (sum for request counts and counters, mean for
// utilisation, max for rates and sizes).
const (
	// AggSum adds the matching series: request counts of the data-parallel
	// engines of one vLLM pod, which carry distinct `engine` labels.
	AggSum Aggregation = "sum"
	// AggMax takes the largest matching series: gauges that every
	// tensor-parallel rank reports identically (SGLang's `tp_rank`), where
	// summing would multiply the load by the TP degree.
	AggMax Aggregation = "max"
	// AggMean averages the matching series: KV-cache utilisation across
	// engines of equal size.
	AggMean Aggregation = "mean"
)

// Selector names one metric and the label values a series must carry to
// count, and how the matching series are aggregated.
//
// Metric is the sample name exactly as it appears in the text exposition
// format. For counters the `_total` suffix may be omitted: a selector used
// for a counter matches both `name` and `name_total`. Samples ending in
// `_created` are never matched by a counter selector. Labels are equality
// matchers; a matcher whose value is "" matches series that lack the label
// (Prometheus semantics).
type Selector struct {
	Metric      string            `yaml:"metric" json:"metric"`
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Aggregation Aggregation       `yaml:"aggregation,omitempty" json:"aggregation,omitempty"`
}

// CounterPair names the two cumulative counters from which a prefix-cache hit
// rate is computed as Δhits / Δqueries between two scrapes.
type CounterPair struct {
	Hits    Selector `yaml:"hits" json:"hits"`
	Queries Selector `yaml:"queries" json:"queries"`
}

// LoRAInfo names an info metric in the style of vLLM's
// `vllm:lora_requests_info`: one series per label combination ever seen,
// whose value is the Unix time of its last update. The series with the
// largest value is the current state.
type LoRAInfo struct {
	Metric string `yaml:"metric" json:"metric"`
	// RunningLabel and WaitingLabel hold comma-separated adapter names;
	// MaxLabel holds the number of adapter slots as a decimal string.
	RunningLabel string `yaml:"running_label" json:"running_label"`
	WaitingLabel string `yaml:"waiting_label" json:"waiting_label"`
	MaxLabel     string `yaml:"max_label" json:"max_label"`
}

// CacheConfigInfo names an info metric whose labels carry the KV-cache block
// size in tokens and the number of GPU blocks, as vLLM's
// `vllm:cache_config_info{block_size="16",num_gpu_blocks="7281"} 1`.
type CacheConfigInfo struct {
	Metric         string `yaml:"metric" json:"metric"`
	BlockSizeLabel string `yaml:"block_size_label" json:"block_size_label"`
	NumBlocksLabel string `yaml:"num_blocks_label" json:"num_blocks_label"`
}

// MetricMap says where each signal is read on one kind of model server.
//
// Every field is a list of alternatives tried in order: the first selector
// (or pair) that matches at least one series on the page provides the value,
// so newer metric names can be listed before deprecated ones. A signal whose
// list is empty, or none of whose selectors match, is reported unknown, never
// zero. A MetricMap is read-only once passed to New or NewParser.
type MetricMap struct {
	// Running is the number of requests in the running batch (default
	// aggregation: sum).
	Running []Selector `yaml:"running,omitempty" json:"running,omitempty"`
	// Waiting is the number of requests queued (default aggregation: sum).
	Waiting []Selector `yaml:"waiting,omitempty" json:"waiting,omitempty"`
	// KVCacheUtilization is the fraction of KV-cache blocks in use, 0–1
	// (default aggregation: mean).
	KVCacheUtilization []Selector `yaml:"kv_cache_utilization,omitempty" json:"kv_cache_utilization,omitempty"`
	// PrefixCacheCounters are cumulative hit and query counters; the hit
	// rate is their ratio of increments (default aggregation: sum).
	PrefixCacheCounters []CounterPair `yaml:"prefix_cache_counters,omitempty" json:"prefix_cache_counters,omitempty"`
	// PrefixCacheHitRate is a server-computed hit-rate gauge, used when no
	// counter pair gives a rate. A negative value means prefix caching is
	// disabled (vLLM V0 reports -1) and reads as unknown (default
	// aggregation: max).
	PrefixCacheHitRate []Selector `yaml:"prefix_cache_hit_rate,omitempty" json:"prefix_cache_hit_rate,omitempty"`
	// LoRA is the adapter info metric; nil when the server has none.
	LoRA *LoRAInfo `yaml:"lora,omitempty" json:"lora,omitempty"`
	// CacheConfig is the cache configuration info metric; nil when the
	// server has none. BlockSize and NumBlocks are used when it is absent.
	CacheConfig *CacheConfigInfo `yaml:"cache_config,omitempty" json:"cache_config,omitempty"`
	// BlockSize and NumBlocks read the cache geometry from numeric gauges
	// (TensorRT-LLM); default aggregation: max.
	BlockSize []Selector `yaml:"block_size,omitempty" json:"block_size,omitempty"`
	NumBlocks []Selector `yaml:"num_blocks,omitempty" json:"num_blocks,omitempty"`
}

// Engine names of the built-in metric maps. The empty engine name means
// EngineVLLM.
const (
	EngineVLLM              = "vllm"
	EngineSGLang            = "sglang"
	EngineTGI               = "tgi"
	EngineTritonTensorRTLLM = "triton-tensorrt-llm"
	EngineTRTLLMServe       = "trtllm-serve"
)

// ErrUnknownEngine is returned (wrapped) when an endpoint names an engine for
// which neither a built-in nor a configured MetricMap exists.
var ErrUnknownEngine = errors.New("scrape: unknown engine")

// The built-in maps follow shared/fixtures/METRICS.md, which cites the
// source file and revision of every name: vLLM vllm/v1/metrics/loggers.py and
// vllm/engine/metrics.py, SGLang python/sglang/srt/metrics/collector.py, TGI
// router/src/server.rs and backends/v3, the tensorrtllm_backend
// custom_metrics_reporter.cc, and the cross-server mapping of the Gateway API
// Inference Extension's model-server protocol (docs/proposals/003).

// VLLMMap returns the metric map for vLLM V1 with V0 fallbacks (also used by
// llm-d-inference-sim). Each call returns a fresh copy the caller may modify.
func VLLMMap() *MetricMap {
	return &MetricMap{
		Running: []Selector{{Metric: "vllm:num_requests_running", Aggregation: AggSum}},
		Waiting: []Selector{{Metric: "vllm:num_requests_waiting", Aggregation: AggSum}},
		KVCacheUtilization: []Selector{
			// V1 name first; gpu_cache_usage_perc is the V0 name and the
			// deprecated V1 alias (emitted around v0.9–0.10).
			{Metric: "vllm:kv_cache_usage_perc", Aggregation: AggMean},
			{Metric: "vllm:gpu_cache_usage_perc", Aggregation: AggMean},
		},
		PrefixCacheCounters: []CounterPair{
			{
				Hits:    Selector{Metric: "vllm:prefix_cache_hits_total", Aggregation: AggSum},
				Queries: Selector{Metric: "vllm:prefix_cache_queries_total", Aggregation: AggSum},
			},
			{
				Hits:    Selector{Metric: "vllm:gpu_prefix_cache_hits_total", Aggregation: AggSum},
				Queries: Selector{Metric: "vllm:gpu_prefix_cache_queries_total", Aggregation: AggSum},
			},
		},
		// V0 gauge; -1 when prefix caching is off.
		PrefixCacheHitRate: []Selector{{Metric: "vllm:gpu_prefix_cache_hit_rate", Aggregation: AggMax}},
		LoRA: &LoRAInfo{
			Metric:       "vllm:lora_requests_info",
			RunningLabel: "running_lora_adapters",
			WaitingLabel: "waiting_lora_adapters",
			MaxLabel:     "max_lora",
		},
		CacheConfig: &CacheConfigInfo{
			Metric:         "vllm:cache_config_info",
			BlockSizeLabel: "block_size",
			NumBlocksLabel: "num_gpu_blocks",
		},
	}
}

// SGLangMap returns the metric map for SGLang. Scheduler gauges are taken as
// the max over series because every tensor-parallel rank reports the same
// value. Each call returns a fresh copy.
func SGLangMap() *MetricMap {
	return &MetricMap{
		Running:            []Selector{{Metric: "sglang:num_running_reqs", Aggregation: AggMax}},
		Waiting:            []Selector{{Metric: "sglang:num_queue_reqs", Aggregation: AggMax}},
		KVCacheUtilization: []Selector{{Metric: "sglang:token_usage", Aggregation: AggMax}},
		PrefixCacheCounters: []CounterPair{{
			Hits:    Selector{Metric: "sglang:cached_tokens_total", Aggregation: AggSum},
			Queries: Selector{Metric: "sglang:prompt_tokens_total", Aggregation: AggSum},
		}},
		PrefixCacheHitRate: []Selector{{Metric: "sglang:cache_hit_rate", Aggregation: AggMax}},
		// Label names per GIE/llm-d; unverified in SGLang's source (see
		// METRICS.md).
		CacheConfig: &CacheConfigInfo{
			Metric:         "sglang:cache_config_info",
			BlockSizeLabel: "page_size",
			NumBlocksLabel: "num_pages",
		},
	}
}

// TGIMap returns the metric map for Hugging Face TGI, which publishes only
// its queue and batch sizes. Each call returns a fresh copy.
func TGIMap() *MetricMap {
	return &MetricMap{
		Running: []Selector{{Metric: "tgi_batch_current_size", Aggregation: AggSum}},
		Waiting: []Selector{{Metric: "tgi_queue_size", Aggregation: AggSum}},
	}
}

// TritonTensorRTLLMMap returns the metric map for Triton with the
// TensorRT-LLM backend (custom_metrics_reporter.cc). Each call returns a
// fresh copy.
func TritonTensorRTLLMMap() *MetricMap {
	req := func(t string) []Selector {
		return []Selector{{Metric: "nv_trt_llm_request_metrics", Labels: map[string]string{"request_type": t}, Aggregation: AggSum}}
	}
	kv := func(t string, agg Aggregation) []Selector {
		return []Selector{{Metric: "nv_trt_llm_kv_cache_block_metrics", Labels: map[string]string{"kv_cache_block_type": t}, Aggregation: agg}}
	}
	return &MetricMap{
		Running:            req("scheduled"),
		Waiting:            req("waiting"),
		KVCacheUtilization: kv("fraction", AggMean),
		BlockSize:          kv("tokens_per", AggMax),
		NumBlocks:          kv("max", AggMax),
	}
}

// TRTLLMServeMap returns the metric map for `trtllm-serve`. The names are
// those listed by GIE and llm-d and are unverified in TensorRT-LLM's source
// (METRICS.md). Each call returns a fresh copy.
func TRTLLMServeMap() *MetricMap {
	return &MetricMap{
		Running:            []Selector{{Metric: "trtllm_num_requests_running", Aggregation: AggSum}},
		Waiting:            []Selector{{Metric: "trtllm_num_requests_waiting", Aggregation: AggSum}},
		KVCacheUtilization: []Selector{{Metric: "trtllm_kv_cache_utilization", Aggregation: AggMean}},
		BlockSize:          []Selector{{Metric: "trtllm_kv_cache_tokens_per_block", Aggregation: AggMax}},
		NumBlocks:          []Selector{{Metric: "trtllm_kv_cache_max_blocks", Aggregation: AggMax}},
	}
}

// BuiltinMap returns a fresh copy of the built-in map for engine ("" means
// vLLM), or nil and false when there is none.
func BuiltinMap(engine string) (*MetricMap, bool) {
	switch strings.ToLower(engine) {
	case "", EngineVLLM:
		return VLLMMap(), true
	case EngineSGLang:
		return SGLangMap(), true
	case EngineTGI:
		return TGIMap(), true
	case EngineTritonTensorRTLLM:
		return TritonTensorRTLLMMap(), true
	case EngineTRTLLMServe:
		return TRTLLMServeMap(), true
	}
	return nil, false
}

// BuiltinEngines returns the names of the built-in maps, sorted.
func BuiltinEngines() []string {
	e := []string{EngineVLLM, EngineSGLang, EngineTGI, EngineTritonTensorRTLLM, EngineTRTLLMServe}
	sort.Strings(e)
	return e
}

// Validate reports the first problem of m: a selector without a metric name,
// an unknown aggregation, or an info metric without its label names.
func (m *MetricMap) Validate() error {
	if m == nil {
		return errors.New("scrape: nil metric map")
	}
	check := func(field string, sels []Selector) error {
		for i, s := range sels {
			if s.Metric == "" {
				return fmt.Errorf("scrape: %s[%d]: empty metric name", field, i)
			}
			switch s.Aggregation {
			case "", AggSum, AggMax, AggMean:
			default:
				return fmt.Errorf("scrape: %s[%d]: unknown aggregation %q (want sum, max or mean)", field, i, s.Aggregation)
			}
		}
		return nil
	}
	for _, f := range []struct {
		name string
		sels []Selector
	}{
		{"running", m.Running}, {"waiting", m.Waiting},
		{"kv_cache_utilization", m.KVCacheUtilization},
		{"prefix_cache_hit_rate", m.PrefixCacheHitRate},
		{"block_size", m.BlockSize}, {"num_blocks", m.NumBlocks},
	} {
		if err := check(f.name, f.sels); err != nil {
			return err
		}
	}
	for i, p := range m.PrefixCacheCounters {
		if err := check(fmt.Sprintf("prefix_cache_counters[%d].hits", i), []Selector{p.Hits}); err != nil {
			return err
		}
		if err := check(fmt.Sprintf("prefix_cache_counters[%d].queries", i), []Selector{p.Queries}); err != nil {
			return err
		}
	}
	if l := m.LoRA; l != nil && (l.Metric == "" || l.RunningLabel == "" || l.WaitingLabel == "" || l.MaxLabel == "") {
		return errors.New("scrape: lora: metric, running_label, waiting_label and max_label are required")
	}
	if c := m.CacheConfig; c != nil && (c.Metric == "" || c.BlockSizeLabel == "" || c.NumBlocksLabel == "") {
		return errors.New("scrape: cache_config: metric, block_size_label and num_blocks_label are required")
	}
	return nil
}
