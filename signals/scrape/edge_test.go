package scrape

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// parseBoth parses page with the fast path and with the expfmt reference
// (ParseFull), each on a fresh parser.
func parseBoth(t *testing.T, m *MetricMap, page string) (fast Page, fastErr error, full Page, fullErr error) {
	t.Helper()
	p, err := NewParser(m)
	require.NoError(t, err)
	fast, fastErr = p.Parse([]byte(page))
	q, err := NewParser(m)
	require.NoError(t, err)
	full, fullErr = q.ParseFullBytes([]byte(page))
	return fast, fastErr, full, fullErr
}

// scraperWithEndpoint returns a test scraper on a fake clock that scrapes
// ep only.
func scraperWithEndpoint(t *testing.T, cfg Config, ep *signals.Endpoint) *Scraper {
	t.Helper()
	s := newTestScraper(t, cfg, WithClock(newFakeClock()))
	s.SetEndpoints([]*signals.Endpoint{ep})
	return s
}

// TestBlankBeforeLabelSet: the text format lets tokens be separated by any
// number of blanks or tabs, so `name {labels} value` is a valid sample line.
// The fast parser reads it as expfmt (the reference) does, and a pod serving
// it stays healthy.
func TestBlankBeforeLabelSet(t *testing.T) {
	page := "vllm:num_requests_running {engine=\"0\",model_name=\"m\"} 3\n" +
		"vllm:num_requests_waiting\t{engine=\"0\",model_name=\"m\"} 2\n"

	fast, fastErr, full, fullErr := parseBoth(t, VLLMMap(), page)
	require.NoError(t, fullErr, "the reference accepts the page")
	assert.Equal(t, known(3), full.Running)
	assert.Equal(t, known(2), full.Waiting)
	require.NoError(t, fastErr, "fast path must accept what the reference accepts")
	assert.Equal(t, full, fast)

	// End to end: a live pod serving this valid page stays healthy.
	srv := newPageServer(t, page)
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "v", Address: srv.addr()})
	s := scraperWithEndpoint(t, Config{}, ep)
	for i := 0; i < DefaultFailureThreshold; i++ {
		assert.NoError(t, s.Scrape(context.Background(), ep))
	}
	assert.True(t, ep.Healthy(), "a pod serving a valid page must not be marked down")
}

// TestDuplicateSeriesWrittenDifferently: a series is its label set, not the
// order the labels are written in, and an empty label value is the same as
// the label missing. A series repeated in another spelling makes the signal
// unknown (Page), rather than being summed.
func TestDuplicateSeriesWrittenDifferently(t *testing.T) {
	cases := map[string]string{
		"permuted labels": "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n" +
			"vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n",
		"empty label value equals absent label": "vllm:num_requests_running{engine=\"\"} 3\n" +
			"vllm:num_requests_running 3\n",
	}
	for name, page := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := NewParser(VLLMMap())
			require.NoError(t, err)
			got, err := p.Parse([]byte(page))
			require.NoError(t, err)
			assert.Equal(t, unknown, got.Running, "a repeated series must make the signal unknown, not be summed")
		})
	}
}

// TestLabelValueWithCommaIsNotDuplicate: label values may contain '=' and
// ',', and a series whose value spells out other labels
// (`{model_name="m,engine=0"}`) is still distinct from the series with
// those labels: both are summed, as the reference (expfmt) sees them.
func TestLabelValueWithCommaIsNotDuplicate(t *testing.T) {
	page := "vllm:num_requests_running{model_name=\"m,engine=0\"} 1\n" +
		"vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2\n"
	fast, fastErr, _, fullErr := parseBoth(t, VLLMMap(), page)
	require.NoError(t, fullErr)
	require.NoError(t, fastErr)
	assert.Equal(t, known(3), fast.Running, "two distinct series, summed")
}

// TestMaxPageBytesMaxInt64: MaxPageBytes = math.MaxInt64 (no practical
// cap) is a valid setting: pages are read in full and scrapes succeed.
func TestMaxPageBytesMaxInt64(t *testing.T) {
	srv := newPageServer(t, "vllm:num_requests_running 3\n")
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "m", Address: srv.addr()})
	s := scraperWithEndpoint(t, Config{MaxPageBytes: math.MaxInt64}, ep)
	err := s.Scrape(context.Background(), ep)
	require.NoError(t, err)
	assert.Equal(t, known(3), ep.Metrics().Running)
}

// TestHalfCounterPair: PrefixCacheHits and PrefixCacheQueries are both
// known or neither, even when the first pair on the page has one side
// unknown (hits NaN, queries finite).
func TestHalfCounterPair(t *testing.T) {
	page := "vllm:prefix_cache_hits_total NaN\nvllm:prefix_cache_queries_total 20\n"
	p, err := NewParser(VLLMMap())
	require.NoError(t, err)
	got, err := p.Parse([]byte(page))
	require.NoError(t, err)
	assert.Equal(t, got.PrefixCacheHits.Known, got.PrefixCacheQueries.Known,
		"hits %+v, queries %+v: both or neither", got.PrefixCacheHits, got.PrefixCacheQueries)
}

// TestParseDoesNotRetainPage: Parse does not retain the page: once it
// returns, the parser holds no reference into the page (in the scraper, the
// outlier body buffer that fetch drops), so the page can be collected.
func TestParseDoesNotRetainPage(t *testing.T) {
	p, err := NewParser(VLLMMap())
	require.NoError(t, err)
	type box struct{ b [256 << 10]byte }
	bx := new(box)
	n := copy(bx.b[:], "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_waiting 1\n")
	got, err := p.Parse(bx.b[:n])
	require.NoError(t, err)
	require.Equal(t, known(3), got.Running)

	wp := weak.Make(bx)
	bx = nil
	for i := 0; i < 5 && wp.Value() != nil; i++ {
		runtime.GC()
	}
	assert.True(t, wp.Value() == nil, "the parser still references the page after Parse returned")
	runtime.KeepAlive(p)
}

// TestMalformedReadLinesRejected: a malformed line of a family the map
// reads is a *ParseError, as the reference (expfmt) rejects it: hex and
// digit-separated floats, unknown escapes, repeated or reserved label
// names, label values that are not UTF-8, and text after the value that is
// not a timestamp.
func TestMalformedReadLinesRejected(t *testing.T) {
	cases := map[string]string{
		"hex float":               "vllm:num_requests_waiting 0x1p3\n",
		"underscore in float":     "vllm:num_requests_waiting 1_000\n",
		"invalid escape":          "vllm:num_requests_waiting{model_name=\"a\\tb\"} 1\n",
		"duplicate label names":   "vllm:num_requests_waiting{engine=\"0\",engine=\"1\"} 1\n",
		"garbage after value":     "vllm:num_requests_waiting 1 abc\n",
		"garbage after timestamp": "vllm:num_requests_waiting 1 1700000000000 abc\n",
		"reserved label name":     "vllm:num_requests_waiting{__name__=\"x\"} 1\n",
		"label value not utf-8":   "vllm:num_requests_waiting{model_name=\"\xff\"} 1\n",
	}
	for name, page := range cases {
		t.Run(name, func(t *testing.T) {
			fast, fastErr, _, fullErr := parseBoth(t, VLLMMap(), page)
			require.Error(t, fullErr, "the reference rejects this line")
			var pe *ParseError
			assert.True(t, errors.As(fastErr, &pe), "fast path accepted it: Waiting=%+v err=%v", fast.Waiting, fastErr)
		})
	}
}

// TestGzipPage: a gzip-encoded page is decompressed and parsed.
func TestGzipPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte("vllm:num_requests_running 3\nvllm:num_requests_waiting 4\n"))
		_ = zw.Close()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(b.Bytes())
	}))
	defer srv.Close()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "g", Address: srv.Listener.Addr().String()})
	s := scraperWithEndpoint(t, Config{}, ep)
	require.NoError(t, s.Scrape(context.Background(), ep))
	assert.Equal(t, known(3), ep.Metrics().Running)
	assert.Equal(t, known(4), ep.Metrics().Waiting)
}

// TestSlowDripHonoursTimeout: a server that keeps the body trickling
// is cut off at the scrape timeout.
func TestSlowDripHonoursTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for i := 0; i < 500; i++ {
			if _, err := w.Write([]byte("# x\n")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	defer srv.Close()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "d", Address: srv.Listener.Addr().String()})
	s := scraperWithEndpoint(t, Config{Timeout: 200 * time.Millisecond}, ep)
	start := time.Now()
	err := s.Scrape(context.Background(), ep)
	var se *Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, ReasonTimeout, se.Reason)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Nil(t, ep.Metrics())
}

// TestOpenMetricsPage: an OpenMetrics page (UNIT lines, float
// timestamps, exemplars, _created samples, # EOF) is read like text.
func TestOpenMetricsPage(t *testing.T) {
	page := func(hits, queries int) string {
		return `# HELP vllm:num_requests_running Number.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:prefix_cache_queries counter
# UNIT vllm:prefix_cache_queries tokens
vllm:prefix_cache_queries_total{engine="0",model_name="m"} ` + strconv.Itoa(queries) + ` 1.7e9
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} ` + strconv.Itoa(hits) + ` # {trace_id="x"} 1.0 1.7e9
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:cache_config info
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1
# EOF
`
	}
	var cur atomicString
	cur.set(page(4, 10))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
		_, _ = w.Write([]byte(cur.get()))
	}))
	defer srv.Close()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "o", Address: srv.Listener.Addr().String()})
	s := scraperWithEndpoint(t, Config{}, ep)
	require.NoError(t, s.Scrape(context.Background(), ep))
	m := ep.Metrics()
	assert.Equal(t, known(1), m.Running)
	assert.Equal(t, 16, m.BlockSize)
	assert.Equal(t, 100, m.NumBlocks)
	cur.set(page(10, 30))
	require.NoError(t, s.Scrape(context.Background(), ep))
	assert.Equal(t, known(6.0/20.0), ep.Metrics().PrefixCacheHitRate)
}

// TestDeadPodDownAndBackUp: a pod whose listener is gone is marked
// down after exactly FailureThreshold scrapes (one new generation), and the
// first good scrape after it comes back on the same address brings it up.
func TestDeadPodDownAndBackUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("vllm:num_requests_running 3\n"))
	})
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "p", Address: addr})
	s := scraperWithEndpoint(t, Config{Timeout: 500 * time.Millisecond}, ep)
	require.NoError(t, s.Scrape(context.Background(), ep))
	gen := ep.Generation()
	require.NoError(t, srv.Close())
	for i := 1; i <= DefaultFailureThreshold; i++ {
		var se *Error
		require.ErrorAs(t, s.Scrape(context.Background(), ep), &se)
		assert.Equal(t, ReasonConnect, se.Reason)
		assert.Equal(t, i < DefaultFailureThreshold, ep.Healthy(), "after %d failures", i)
	}
	assert.Equal(t, gen+1, ep.Generation())

	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s was taken meanwhile: %v", addr, err)
	}
	srv2 := &http.Server{Handler: h}
	go func() { _ = srv2.Serve(l2) }()
	defer srv2.Close()
	require.NoError(t, s.Scrape(context.Background(), ep))
	assert.True(t, ep.Healthy())
	st, _ := s.Status(ep)
	assert.Equal(t, 0, st.ConsecutiveFailures)
}

// TestHostileValuesNeverReachPicker: NaN, ±Inf, negatives,
// out-of-range utilisation, hits outrunning queries and nonsense cache
// geometry never give the picker a non-finite, negative or >1 value.
func TestHostileValuesNeverReachPicker(t *testing.T) {
	pages := []string{
		"vllm:num_requests_running -Inf\nvllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 7\n" +
			"vllm:prefix_cache_hits_total 50\nvllm:prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hit_rate NaN\n" +
			"vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"1e9\"} 1\n" +
			"vllm:lora_requests_info{max_lora=\"-1\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} NaN\n",
		"vllm:num_requests_running +Inf\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -Inf\n" +
			"vllm:prefix_cache_hits_total 100\nvllm:prefix_cache_queries_total 11\nvllm:gpu_prefix_cache_hit_rate 5\n",
		"vllm:num_requests_running 1e308\nvllm:num_requests_running{engine=\"1\"} 1e308\nvllm:kv_cache_usage_perc -0.0\n" +
			"vllm:prefix_cache_hits_total -1\nvllm:prefix_cache_queries_total -1\n",
	}
	var cur atomicString
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(cur.get()))
	}))
	defer srv.Close()
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "h", Address: srv.Listener.Addr().String()})
	clock := newFakeClock()
	s := newTestScraper(t, Config{}, WithClock(clock))
	s.SetEndpoints([]*signals.Endpoint{ep})
	finite01 := func(r signals.Reading, hi float64) {
		if r.Known {
			assert.False(t, math.IsNaN(r.Value) || math.IsInf(r.Value, 0), "%v", r)
			assert.GreaterOrEqual(t, r.Value, 0.0)
			assert.LessOrEqual(t, r.Value, hi)
		}
	}
	for i, pg := range pages {
		cur.set(pg)
		clock.Advance(50 * time.Millisecond)
		require.NoError(t, s.Scrape(context.Background(), ep), "page %d", i)
		m := ep.Metrics()
		finite01(m.Running, math.MaxFloat64)
		finite01(m.Waiting, math.MaxFloat64)
		finite01(m.KVCacheUtilization, 1)
		finite01(m.PrefixCacheHitRate, 1)
		assert.GreaterOrEqual(t, m.BlockSize, 0)
		assert.GreaterOrEqual(t, m.NumBlocks, 0)
		assert.GreaterOrEqual(t, m.MaxLoRA, 0)
		now := clock.Now()
		for _, v := range []float64{ep.QueueDepth(now, time.Second), ep.RunningRequests(now, time.Second)} {
			assert.False(t, math.IsNaN(v) || math.IsInf(v, 0) || v < 0, "page %d: %v", i, v)
		}
		if kv, ok := ep.KVCacheUtilization(now, time.Second); ok {
			assert.True(t, kv >= 0 && kv <= 1, "page %d: kv %v", i, kv)
		}
	}
	assert.False(t, ep.Metrics().LoRAKnown || len(ep.Metrics().RunningAdapters) > 0)
}

// TestHugeLabelValue: a multi-megabyte escaped label value on a read
// family is parsed (within the page cap), and the same parser then reads a
// normal page.
func TestHugeLabelValue(t *testing.T) {
	big := strings.Repeat("x\\\"y\\\\", 500_000) // 3 MB raw
	page := "vllm:num_requests_running{model_name=\"" + big + "\"} 2\nvllm:num_requests_waiting 1\n"
	p, err := NewParser(VLLMMap())
	require.NoError(t, err)
	got, err := p.Parse([]byte(page))
	require.NoError(t, err)
	assert.Equal(t, known(2), got.Running)
	assert.Equal(t, known(1), got.Waiting)
	got, err = p.Parse([]byte("vllm:num_requests_running{model_name=\"m\"} 5\n"))
	require.NoError(t, err)
	assert.Equal(t, known(5), got.Running)
	assert.Equal(t, unknown, got.Waiting)
}

// atomicString holds the page a test server serves.
type atomicString struct{ p atomic.Pointer[string] }

func (a *atomicString) set(s string) { a.p.Store(&s) }
func (a *atomicString) get() string {
	if p := a.p.Load(); p != nil {
		return *p
	}
	return ""
}
