package emulator

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/engine"
)

// metricsFixtures is shared/fixtures/metrics, beside the checkout.
const metricsFixtures = "../../../shared/fixtures/metrics"

// families parses a text exposition page with Prometheus's own parser.
func families(t *testing.T, page []byte) map[string]*dto.MetricFamily {
	t.Helper()
	dec := expfmt.NewDecoder(bytes.NewReader(page), expfmt.NewFormat(expfmt.TypeTextPlain))
	out := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out[mf.GetName()] = mf
	}
}

// TestMetricTypesMatchRecordings parses the emulator's page and the real
// vLLM and llm-d-inference-sim recordings with Prometheus's text parser:
// every family the page shares with a recording must have the recording's
// type. The recordings declare counters under their sample name
// ("# TYPE vllm:prefix_cache_hits_total counter"); a declaration under
// another name leaves the samples in an untyped family of their own.
func TestMetricTypesMatchRecordings(t *testing.T) {
	want := map[string]dto.MetricType{}
	for _, f := range []string{"vllm-v0.prom", "llm-d-inference-sim-after-load.prom"} {
		b, err := os.ReadFile(filepath.Join(metricsFixtures, f))
		require.NoError(t, err)
		for name, mf := range families(t, b) {
			want[name] = mf.GetType()
		}
	}
	p := startPod(t, Options{Adapters: []string{"sql-lora"}})
	got := families(t, getMetrics(t, p))
	shared := 0
	for name, mf := range got {
		typ, ok := want[name]
		if !ok {
			continue
		}
		shared++
		assert.Equal(t, typ, mf.GetType(), name)
	}
	for _, name := range []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total"} {
		require.Contains(t, got, name)
		assert.Equal(t, dto.MetricType_COUNTER, got[name].GetType(), name)
	}
	assert.GreaterOrEqual(t, shared, 10, "the page shares most families with the recordings")
}

// TestRequestSuccessByFinishReason checks that vllm:request_success_total
// counts each request under the finish reason its response reported
// (vLLM labels the counter by finished_reason, see vllm-v0.prom).
func TestRequestSuccessByFinishReason(t *testing.T) {
	p := startPod(t, Options{})
	reasons := map[string]float64{}
	for _, body := range []string{
		`{"model":"` + DefaultModel + `","prompt":"hello","max_tokens":2}`,
		`{"model":"` + DefaultModel + `","prompt":"hello","max_tokens":3}`,
		`{"model":"` + DefaultModel + `","prompt":"hello"}`,
	} {
		resp := post(t, p.URL()+"/v1/completions", body)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		c := decode[completion](t, resp)
		require.Len(t, c.Choices, 1)
		require.NotNil(t, c.Choices[0].FinishReason)
		reasons[*c.Choices[0].FinishReason]++
	}
	require.Equal(t, map[string]float64{"length": 2, "stop": 1}, reasons)

	fams := families(t, getMetrics(t, p))
	got := map[string]float64{}
	var samples []*dto.Metric
	for _, name := range []string{"vllm:request_success_total", "vllm:request_success"} {
		if mf, ok := fams[name]; ok {
			samples = append(samples, mf.GetMetric()...)
		}
	}
	for _, m := range samples {
		v := m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" && v > 0 {
				got[l.GetValue()] += v
			}
		}
	}
	assert.Equal(t, reasons, got)
}

// TestHugeMaxTokens sends max_tokens = 2^63-1: prompt plus completion far
// exceed the context length, so the answer must be vLLM's context-length
// error (shape of ../shared/fixtures/openai/llm-d-inference-sim/
// error-400-context-length.response.json), with the exact sum, not a
// dropped connection.
func TestHugeMaxTokens(t *testing.T) {
	p := startPod(t, Options{})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			// "hello" renders to 5 bytes, 2 tokens at 4 bytes per token.
			body := `{"model":"` + DefaultModel + `","prompt":"hello","max_tokens":9223372036854775807}`
			want := "This model's maximum context length is 8192 tokens. However, you requested 9223372036854775809 tokens (2 in the messages, 9223372036854775807 in the completion). Please reduce the length of the messages or completion"
			if path == "/v1/chat/completions" {
				body = `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":9223372036854775807}`
				want = ""
			}
			resp, err := http.Post(p.URL()+path, "application/json", strings.NewReader(body))
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			e := decode[wireError](t, resp)
			assert.Equal(t, "BadRequestError", e.Error.Type)
			assert.Equal(t, 400, e.Error.Code)
			assert.Contains(t, e.Error.Message, "9223372036854775807 in the completion")
			if want != "" {
				assert.Equal(t, want, e.Error.Message)
			}
		})
	}
}

// TestDefaultName checks Options.Name's contract: "" means the profile
// name and the port.
func TestDefaultName(t *testing.T) {
	p := startPod(t, Options{Profile: "l4-llama3-8b"})
	_, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	assert.Equal(t, "l4-llama3-8b-"+port, p.Name())
}

// TestDefaultMaxTokensFitsTheContext: a request without max_tokens gets
// at most the context the prompt leaves, as vLLM defaults max_tokens to
// max_model_len minus the prompt, instead of a 400 for an output length
// the client never asked for; a prompt that leaves no room is still a 400.
func TestDefaultMaxTokensFitsTheContext(t *testing.T) {
	p := startPod(t, Options{MaxModelLen: 100})
	post := func(promptTokens int) *http.Response {
		t.Helper()
		body := `{"model":"` + DefaultModel + `","prompt":"` + strings.Repeat("abcd", promptTokens) + `"}`
		resp, err := http.Post(p.URL()+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		return resp
	}
	resp := post(90) // 90 prompt tokens, 10 left, DefaultMaxTokens is 64
	require.Equal(t, http.StatusOK, resp.StatusCode)
	c := decode[struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}](t, resp)
	assert.Equal(t, 90, c.Usage.PromptTokens)
	assert.Equal(t, 10, c.Usage.CompletionTokens, "the context left")
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "length", c.Choices[0].FinishReason)

	resp = post(100) // the prompt fills the context
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp.Body.Close()
}

// TestStallDoesNotCostGPUTime: steps run back to back on the pod's own
// timeline, so a stall of the emulator's loop (the process descheduled on
// a busy machine; here the pod's lock held for a while) only delays the
// tokens: the engine's virtual time from the request's arrival to its end
// is the sum of its steps' durations, computed independently by stepping
// a fresh engine of the same configuration, not that plus the stall.
func TestStallDoesNotCostGPUTime(t *testing.T) {
	const speed, outTokens = 2, 100
	const stall = 200 * time.Millisecond
	p := startPod(t, Options{Speed: speed})

	// The reference: the same request alone on an idle engine.
	p.mu.Lock()
	ref := engine.New(p.eng.Config())
	p.mu.Unlock()
	require.NoError(t, ref.Add(0, &engine.Request{PromptTokens: 2, OutputTokens: outTokens, BlockTokens: blockTokens}))
	var total time.Duration
	var evs []engine.Event
	for {
		d, ok := ref.StartStep(total)
		if !ok {
			break
		}
		total += d
		evs = ref.FinishStep(total, evs[:0])
	}
	require.True(t, ref.Idle())

	p.mu.Lock()
	v0 := p.vnowLocked()
	p.mu.Unlock()
	go func() {
		time.Sleep(stall / 4)
		p.mu.Lock()
		time.Sleep(stall)
		p.mu.Unlock()
	}()
	body := `{"model":"` + DefaultModel + `","prompt":"hello","max_tokens":` + strconv.Itoa(outTokens) + `}`
	resp, err := http.Post(p.URL()+"/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	p.mu.Lock()
	v1 := p.vt
	p.mu.Unlock()
	// The request's steps take total; the time from v0 to its first step
	// (the loop waking up) is well under the stall.
	assert.GreaterOrEqual(t, v1-v0, total)
	assert.Less(t, v1-v0, total+speed*stall/2, "the stall cost the pod GPU time: %v of virtual time for %v of steps", v1-v0, total)
}
