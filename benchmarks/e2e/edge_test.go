package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/emulator"
	"github.com/inferroute/inferroute/benchmarks/sim"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// openaiFixtures is shared/fixtures/openai, beside the checkout.
const openaiFixtures = "../../../shared/fixtures/openai"

// replay starts a loopback server answering every completions request with
// the bytes of a recorded SSE stream.
func replay(t *testing.T, file string) string {
	t.Helper()
	sse, err := os.ReadFile(openaiFixtures + "/" + file)
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(sse)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func runOne(t *testing.T, url string, outputTokens int) Outcome {
	t.Helper()
	w := &workload.Workload{Requests: []workload.Request{{PromptTokens: 4, OutputTokens: outputTokens}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := RunLoad(ctx, LoadConfig{URL: url, Model: "sql-lora", Workload: w, Timeout: 5 * time.Second})
	require.NoError(t, err)
	require.Len(t, res.Outcomes, 1)
	return res.Outcomes[0]
}

// TestRunLoadCountsTokensOfARecordedStream replays llm-d-inference-sim's
// recorded /v1/completions stream: 8 chunks with text, then a finish chunk
// whose text is empty, then the usage chunk (completion_tokens 8) and
// [DONE]. The client must count 8 tokens: the finish chunk carries none.
func TestRunLoadCountsTokensOfARecordedStream(t *testing.T) {
	url := replay(t, "llm-d-inference-sim/completions-lora-stream.response.sse")
	o := runOne(t, url, 8)
	assert.Equal(t, OK, o.Status, "%v", o.Err)
	assert.Equal(t, 8, o.Tokens, "completion_tokens of the recorded usage chunk")

	// Asked for 9 tokens, the same stream is one short: a silent truncation.
	o = runOne(t, url, 9)
	assert.Equal(t, Truncated, o.Status)
	assert.Equal(t, 8, o.Tokens)
}

// TestRunLoadCountsTokensOfOpenAIStream replays OpenAI's recorded
// /v1/completions stream, whose finish reason rides on the last of its 25
// text chunks (usage: completion_tokens 25).
func TestRunLoadCountsTokensOfOpenAIStream(t *testing.T) {
	o := runOne(t, replay(t, "openai-api/completions-stream-include-usage.response.sse"), 25)
	assert.Equal(t, OK, o.Status, "%v", o.Err)
	assert.Equal(t, 25, o.Tokens)
}

// TestRunHTTPScrapesBeforeTraffic runs one request with the gateway's
// default scrape interval (GatewayConfig.ScrapeInterval 0, as Overload
// passes it): runHTTP promises one scrape round before traffic, so every
// endpoint must have scraped metrics when the load starts.
func TestRunHTTPScrapesBeforeTraffic(t *testing.T) {
	w := &workload.Workload{Requests: []workload.Request{{PromptTokens: 16, OutputTokens: 2}}}
	var scraped []bool
	run, err := runHTTP(context.Background(), []string{sim.H100, sim.L4}, 10, GatewayConfig{}, w,
		func(_ context.Context, _ *emulator.Fleet, g *Gateway) {
			for _, ep := range g.Endpoints() {
				scraped = append(scraped, ep.Metrics() != nil)
			}
		})
	require.NoError(t, err)
	assert.Equal(t, OK, run.Load.Outcomes[0].Status, "%v", run.Load.Outcomes[0].Err)
	assert.Equal(t, []bool{true, true}, scraped)
}

// TestWriteCompareShowsEveryOutcome: the HTTP TTFT summaries cover the
// answered requests only, so the table shows the requests that timed out
// or were shed next to the lost, cut and truncated ones: a policy must
// not look faster for the requests it never answered.
func TestWriteCompareShowsEveryOutcome(t *testing.T) {
	r := &CompareResult{Rate: 10, Capacity: 20, Policies: []PolicyResult{
		{Policy: RoundRobin, HTTP: Summary{N: 95, Mean: 1, P99: 2}, OK: 95, Lost: 1, Cut: 1, Truncated: 0, TimedOut: 2, Shed: 1},
	}}
	var sb strings.Builder
	require.NoError(t, WriteCompare(&sb, r))
	lines := strings.Split(strings.TrimSpace(sb.String()), "\n")
	require.Len(t, lines, 3)
	head, row := strings.Fields(lines[1]), strings.Fields(lines[2])
	assert.Contains(t, lines[1], "timed out")
	assert.Contains(t, lines[1], "shed")
	// The row's counts, in the header's order: lost, cut, truncated,
	// timed out, shed, then the wall time.
	require.GreaterOrEqual(t, len(row), 6)
	assert.Equal(t, []string{"1", "1", "0", "2", "1"}, row[len(row)-6:len(row)-1], "header %q", head)
}
