package scrape

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// fixtureDir is shared/fixtures/metrics, beside the checkout.
const fixtureDir = "../../../shared/fixtures/metrics"

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, name))
	require.NoError(t, err)
	return b
}

func known(v float64) signals.Reading { return signals.Reading{Value: v, Known: true} }

var unknown = signals.Reading{}

// fixtureCase is one fixture file with the value of every signal written out
// by reading the file.
type fixtureCase struct {
	file   string
	engine string
	want   Page
}

var fixtureCases = []fixtureCase{
	{
		// running 0, waiting 0, kv 0, hits 32 of 147 queries; seven LoRA
		// series, the newest (1.796030231e+09) with empty lists; max_lora 1;
		// cache_config block_size 16, num_gpu_blocks 1024.
		file: "llm-d-inference-sim-after-load.prom", engine: EngineVLLM,
		want: Page{
			Running: known(0), Waiting: known(0), KVCacheUtilization: known(0),
			PrefixCacheHits: known(32), PrefixCacheQueries: known(147),
			LoRAKnown: true, RunningAdapters: "", WaitingAdapters: "", MaxLoRA: 1,
			BlockSize: 16, NumBlocks: 1024,
		},
	},
	{
		file: "llm-d-inference-sim-idle.prom", engine: EngineVLLM,
		want: Page{
			Running: known(0), Waiting: known(0), KVCacheUtilization: known(0),
			LoRAKnown: true, MaxLoRA: 1, BlockSize: 16, NumBlocks: 1024,
		},
	},
	{
		// Two LoRA series share the newest value 1.796030224e+09; both run
		// sql-lora, and the larger waiting list "chat-lora,sql-lora" wins.
		file: "llm-d-inference-sim-under-load-a.prom", engine: EngineVLLM,
		want: Page{
			Running: known(2), Waiting: known(3), KVCacheUtilization: known(0.0009765625),
			PrefixCacheHits: known(0), PrefixCacheQueries: known(30),
			LoRAKnown: true, RunningAdapters: "sql-lora", WaitingAdapters: "chat-lora,sql-lora", MaxLoRA: 1,
			BlockSize: 16, NumBlocks: 1024,
		},
	},
	{
		// Newest value 1.796030226e+09 is shared by {run "", wait
		// "chat-lora,sql-lora"} and {run "sql-lora", wait "chat-lora"}: the
		// larger running list wins.
		file: "llm-d-inference-sim-under-load-b.prom", engine: EngineVLLM,
		want: Page{
			Running: known(2), Waiting: known(1), KVCacheUtilization: known(0),
			PrefixCacheHits: known(0), PrefixCacheQueries: known(43),
			LoRAKnown: true, RunningAdapters: "sql-lora", WaitingAdapters: "chat-lora", MaxLoRA: 1,
			BlockSize: 16, NumBlocks: 1024,
		},
	},
	{
		// No cached_tokens_total: the counter pair is absent, the gauge
		// cache_hit_rate is read instead. No LoRA, no cache config.
		file: "sglang.prom", engine: EngineSGLang,
		want: Page{
			Running: known(162), Waiting: known(2826), KVCacheUtilization: known(0.28),
			PrefixCacheHitRate: known(0.007507552643049313),
		},
	},
	{
		file: "tgi.prom", engine: EngineTGI,
		want: Page{Running: known(0), Waiting: known(0)},
	},
	{
		// request_type scheduled 1, waiting 1; kv fraction 0.4875,
		// tokens_per 64, max 6239.
		file: "triton-trtllm.prom", engine: EngineTritonTensorRTLLM,
		want: Page{
			Running: known(1), Waiting: known(1), KVCacheUtilization: known(0.4875),
			BlockSize: 64, NumBlocks: 6239,
		},
	},
	{
		file: "triton-trtllm-v1-model-fragment.prom", engine: EngineTritonTensorRTLLM,
		want: Page{},
	},
	{
		// Both kv_cache_usage_perc and gpu_cache_usage_perc (0.0): the V1
		// name wins. prefix_cache_hits_total 64 of queries 117.
		file: "vllm-mixed-v0-v1-datadog-fixture.prom", engine: EngineVLLM,
		want: Page{
			Running: known(0), Waiting: known(0), KVCacheUtilization: known(0),
			PrefixCacheHits: known(64), PrefixCacheQueries: known(117),
			BlockSize: 16, NumBlocks: 7281,
		},
	},
	{
		// gpu_prefix_cache_hit_rate -1.0 (prefix caching off) is reported
		// as published; lora_requests_info with max_lora "0" and no adapters.
		file: "vllm-v0-aibrix-docs-partial.prom", engine: EngineVLLM,
		want: Page{
			Running: known(0), Waiting: known(0), KVCacheUtilization: known(0),
			PrefixCacheHitRate: known(-1),
			LoRAKnown:          true, MaxLoRA: 0,
			BlockSize: 16, NumBlocks: 81767,
		},
	},
	{
		file: "vllm-v0.prom", engine: EngineVLLM,
		want: Page{
			Running: known(0), Waiting: known(0), KVCacheUtilization: known(0),
			BlockSize: 16, NumBlocks: 7281,
		},
	},
}

func TestFixturesCovered(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.prom"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	covered := map[string]bool{}
	for _, c := range fixtureCases {
		covered[c.file] = true
	}
	for _, f := range files {
		assert.True(t, covered[filepath.Base(f)], "fixture %s has no expected values", filepath.Base(f))
	}
}

func TestParseFixtures(t *testing.T) {
	for _, c := range fixtureCases {
		t.Run(strings.TrimSuffix(c.file, ".prom"), func(t *testing.T) {
			m, ok := BuiltinMap(c.engine)
			require.True(t, ok)
			p, err := NewParser(m)
			require.NoError(t, err)
			page := readFixture(t, c.file)

			got, err := p.Parse(page)
			require.NoError(t, err)
			assert.Equal(t, c.want, got, "fast path")

			// A second parse with the same (warm) parser gives the same page.
			again, err := p.Parse(page)
			require.NoError(t, err)
			assert.Equal(t, c.want, again, "fast path, warm parser")

			full, err := p.ParseFullBytes(page)
			require.NoError(t, err)
			assert.Equal(t, c.want, full, "full prom2json path")
		})
	}
}

// TestParseWrongEngine checks that a server lacking a signal reports it
// unknown, never zero: a TGI page read with the vLLM map.
func TestParseWrongEngine(t *testing.T) {
	p, err := NewParser(VLLMMap())
	require.NoError(t, err)
	got, err := p.Parse(readFixture(t, "tgi.prom"))
	require.NoError(t, err)
	assert.Equal(t, Page{}, got)
}

func TestParseSynthetic(t *testing.T) {
	cases := []struct {
		name string
		m    *MetricMap
		page string
		want Page
	}{
		{
			name: "vllm data parallel engines: counts summed, kv averaged",
			m:    VLLMMap(),
			page: `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
`,
			want: Page{
				Running: known(7), Waiting: known(3), KVCacheUtilization: known(0.4),
				PrefixCacheHits: known(15), PrefixCacheQueries: known(150),
			},
		},
		{
			name: "sglang tensor parallel ranks: duplicates not summed",
			m:    SGLangMap(),
			page: `sglang:num_running_reqs{model_name="m",tp_rank="0"} 5
sglang:num_running_reqs{model_name="m",tp_rank="1"} 5
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 7
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 7
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
sglang:token_usage{model_name="m",tp_rank="1"} 0.5
sglang:cached_tokens_total{model_name="m"} 30
sglang:prompt_tokens_total{model_name="m"} 120
`,
			want: Page{
				Running: known(5), Waiting: known(7), KVCacheUtilization: known(0.5),
				PrefixCacheHits: known(30), PrefixCacheQueries: known(120),
			},
		},
		{
			name: "deprecated counter pair used when the new one is absent",
			m:    VLLMMap(),
			page: "vllm:gpu_prefix_cache_hits_total 3\nvllm:gpu_prefix_cache_queries_total 9\n",
			want: Page{PrefixCacheHits: known(3), PrefixCacheQueries: known(9)},
		},
		{
			name: "half a counter pair is no pair",
			m:    VLLMMap(),
			page: "vllm:prefix_cache_hits_total 3\nvllm:gpu_prefix_cache_queries_total 9\n",
			want: Page{},
		},
		{
			name: "NaN and Inf are unknown, negative kept raw",
			m:    VLLMMap(),
			page: "vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc -0.5\n",
			want: Page{KVCacheUtilization: known(-0.5)},
		},
		{
			name: "gauge declared twice is unknown",
			m:    VLLMMap(),
			page: `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{x="1"} 4
vllm:num_requests_waiting 1
`,
			want: Page{Waiting: known(1)},
		},
		{
			name: "same series twice is unknown",
			m:    VLLMMap(),
			page: "vllm:num_requests_running{a=\"1\"} 3\nvllm:num_requests_running{a=\"1\"} 4\nvllm:num_requests_waiting 2\n",
			want: Page{Waiting: known(2)},
		},
		{
			name: "escaped label values, CRLF, timestamps and blank lines",
			m: &MetricMap{
				Running: []Selector{{Metric: "x_running", Labels: map[string]string{"model": "a\"b\\c\nd"}}},
				Waiting: []Selector{{Metric: "x_waiting"}},
			},
			page: "\r\n  x_running{model=\"a\\\"b\\\\c\\nd\" , other=\"z\",} 4 1700000000000\r\nx_running{model=\"other\"} 100\r\n\nx_waiting 2.5e0\r\n",
			want: Page{Running: known(4), Waiting: known(2.5)},
		},
		{
			name: "user map: counter without _total matches _total, not _created",
			m: &MetricMap{
				PrefixCacheCounters: []CounterPair{{Hits: Selector{Metric: "srv_hits"}, Queries: Selector{Metric: "srv_lookups"}}},
				BlockSize:           []Selector{{Metric: "srv_block_tokens"}},
				NumBlocks:           []Selector{{Metric: "srv_blocks"}},
			},
			page: "srv_hits_total 5\nsrv_hits_created 1.7e9\nsrv_lookups_total 20\nsrv_lookups_created 1.7e9\nsrv_block_tokens 32\nsrv_blocks 100\n",
			want: Page{PrefixCacheHits: known(5), PrefixCacheQueries: known(20), BlockSize: 32, NumBlocks: 100},
		},
		{
			name: "lora ties resolved independently of line order",
			m:    VLLMMap(),
			page: `vllm:lora_requests_info{max_lora="4",running_lora_adapters="b",waiting_lora_adapters=""} 10
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,c",waiting_lora_adapters="d"} 10
vllm:lora_requests_info{max_lora="4",running_lora_adapters="z",waiting_lora_adapters=""} 9
`,
			want: Page{LoRAKnown: true, RunningAdapters: "b", MaxLoRA: 4},
		},
		{
			name: "quoted utf-8 metric names are skipped",
			m:    TGIMap(),
			page: "{\"tgi.queue\"} 9\ntgi_queue_size 1\n",
			want: Page{Waiting: known(1)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewParser(c.m)
			require.NoError(t, err)
			got, err := p.Parse([]byte(c.page))
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestParseErrors(t *testing.T) {
	big := strings.Repeat("# HELP x y\n", 10) + "vllm:num_requests_running 1"
	cases := []struct {
		name string
		page string
		line int // 0 = ErrEmptyPage
	}{
		{"empty", "", 0},
		{"html", "<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n", 1},
		{"json", "{\"error\": \"x\"}\n", 1},
		{"binary", "\x00\x01\x02\xff\n", 1},
		{"no newline at end", big, 11},
		{"name without value", "vllm:num_requests_running\n", 1},
		{"bad char in name", "vllm:num-requests 1\n", 1},
		{"bad value", "vllm:num_requests_running abc\n", 1},
		{"missing value", "vllm:num_requests_running{a=\"b\"}\n", 1},
		{"unterminated labels", "vllm:num_requests_running{a=\"b\" 1\n", 1},
		{"unterminated value", "vllm:num_requests_running{a=\"b} 1\n", 1},
		{"no equals", "vllm:num_requests_running{a \"b\"} 1\n", 1},
		{"bad label name", "vllm:num_requests_running{1a=\"b\"} 1\n", 1},
		{"garbage after label", "ok 1\nvllm:num_requests_running{a=\"b\"x} 1\n", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewParser(VLLMMap())
			require.NoError(t, err)
			_, err = p.Parse([]byte(c.page))
			require.Error(t, err)
			if c.line == 0 {
				require.ErrorIs(t, err, ErrEmptyPage)
				return
			}
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, c.line, pe.Line)
		})
	}
}

func TestMapValidate(t *testing.T) {
	cases := []struct {
		name string
		m    *MetricMap
		ok   bool
	}{
		{"nil", nil, false},
		{"empty is valid (everything unknown)", &MetricMap{}, true},
		{"missing metric", &MetricMap{Running: []Selector{{}}}, false},
		{"bad aggregation", &MetricMap{Running: []Selector{{Metric: "a", Aggregation: "median"}}}, false},
		{"bad pair", &MetricMap{PrefixCacheCounters: []CounterPair{{Hits: Selector{Metric: "a"}}}}, false},
		{"lora without labels", &MetricMap{LoRA: &LoRAInfo{Metric: "x"}}, false},
		{"cache config without labels", &MetricMap{CacheConfig: &CacheConfigInfo{Metric: "x"}}, false},
	}
	for _, e := range BuiltinEngines() {
		m, ok := BuiltinMap(e)
		require.True(t, ok)
		cases = append(cases, struct {
			name string
			m    *MetricMap
			ok   bool
		}{"builtin " + e, m, true})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.m.Validate()
			if c.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
	_, ok := BuiltinMap("nope")
	assert.False(t, ok)
	m, ok := BuiltinMap("")
	require.True(t, ok)
	assert.Equal(t, VLLMMap(), m)
}

// TestParseManySeries: a page of 50 000 series of one wanted family is read
// in linear time (the repeat check is bounded) and summed.
func TestParseManySeries(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 50000; i++ {
		b.WriteString("vllm:num_requests_running{engine=\"")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(string(rune('a' + i%26)))
		b.WriteString("\"} 1\n")
	}
	p, err := NewParser(VLLMMap())
	require.NoError(t, err)
	got, err := p.Parse([]byte(b.String()))
	require.NoError(t, err)
	// The first 256 series include repeats (only 7×26 distinct label
	// values), so the sum is unknown rather than 50000.
	assert.Equal(t, unknown, got.Running)
}
