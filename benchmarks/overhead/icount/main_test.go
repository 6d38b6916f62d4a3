package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The testdata listings are the head of two real callgrind_annotate
// outputs of instructions.sh (minproxy and the gateway, 4000 requests of
// 1 KB each) with a few of their function lines, the binary's temporary
// directory renamed.
func readProfile(t *testing.T, name string) profile {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	require.NoError(t, err)
	defer f.Close()
	p, err := parseAnnotate(f)
	require.NoError(t, err)
	return p
}

func TestParseAnnotate(t *testing.T) {
	p := readProfile(t, "gateway.txt")
	assert.Equal(t, int64(448_781_739), p.total, "the PROGRAM TOTALS line")
	// A function split over the files its code was inlined from counts
	// once, with the sum of its lines.
	assert.Equal(t, int64(9_972_802+1_054_809+671_349), p.funcs["runtime.mallocgcSmallScanNoHeader"])
	// Recursion levels (f'2) are the function itself.
	assert.Equal(t, int64(5_472_000+4_872_000), p.funcs["github.com/inferroute/inferroute/signals/prefix.(*scan).skip"])
	_, ok := p.funcs["github.com/inferroute/inferroute/signals/prefix.(*scan).skip'2"]
	assert.False(t, ok)
	assert.Equal(t, int64(593_485), p.funcs["net/http.(*conn).serve"])
	assert.Len(t, p.funcs, 6)

	_, err := parseAnnotate(strings.NewReader("not a listing\n 12 (1.0%) x.go:f\n"))
	assert.ErrorContains(t, err, "PROGRAM TOTALS")
}

func TestCategory(t *testing.T) {
	for fn, want := range map[string]string{
		"github.com/inferroute/inferroute/signals/prefix.(*scan).skip": "inferroute",
		"go.opentelemetry.io/otel/sdk/metric.(*float64Inst).Record":    "OpenTelemetry",
		"net/textproto.CanonicalMIMEHeaderKey":                         "net/textproto (header keys)",
		"runtime.mallocgcSmallScanNoHeader":                            "runtime: malloc",
		"runtime.(*mspan).writeHeapBitsSmall":                          "runtime: malloc",
		"runtime.gcDrain":                                              "runtime: GC",
		"runtime.(*mspan).typePointersOfUnchecked":                     "runtime: GC",
		"runtime.findRunnable":                                         "runtime: scheduler, netpoll, timers",
		"internal/runtime/maps.(*Map).getWithoutKeySmallFastStr":       "runtime: maps, hashing, memmove, other",
		"indexbytebody":             "runtime: maps, hashing, memmove, other",
		"internal/poll.(*FD).Read":  "syscalls",
		"net/http.(*conn).serve":    "net/http",
		"net/url.escape":            "net, net/url",
		"bufio.(*Reader).ReadSlice": "bufio, bytes, strings, strconv, time, sync, context",
		"main.(*proxy).ServeHTTP":   "proxy's main package",
		"type:.eq.github.com/inferroute/inferroute/router.attrKey":                "inferroute",
		"github.com/prometheus/client_golang/prometheus.(*Registry).Gather.func1": "other",
	} {
		assert.Equal(t, want, category(fn), fn)
	}
}

func TestReport(t *testing.T) {
	ps := [2]profile{readProfile(t, "minproxy.txt"), readProfile(t, "gateway.txt")}
	var out bytes.Buffer
	report(&out, 4000, [2]string{"minproxy", "gateway"}, ps, 3)
	s := out.String()
	// 448,781,739 / 4000 and minproxy's total / 4000.
	assert.Contains(t, s, "gateway 112195,")
	assert.Contains(t, s, "minproxy "+fmtPer(ps[0].total, 4000)+",")
	// The gateway's header-key row: CanonicalMIMEHeaderKey and
	// readMIMEHeader, per request, beside minproxy's.
	tp := ps[1].funcs["net/textproto.CanonicalMIMEHeaderKey"] + ps[1].funcs["net/textproto.readMIMEHeader"]
	assert.Contains(t, s, "| net/textproto (header keys)")
	assert.Contains(t, s, fmtPer(tp, 4000)+" |")
	lines := strings.Split(strings.TrimSpace(s), "\n")
	// The three costliest functions of the gateway, most first.
	require.GreaterOrEqual(t, len(lines), 3)
	assert.Contains(t, lines[len(lines)-3], "net/textproto.CanonicalMIMEHeaderKey")
	assert.Contains(t, lines[len(lines)-2], "runtime.mallocgcSmallScanNoHeader")
	assert.Contains(t, lines[len(lines)-1], "signals/prefix.(*scan).skip")
}

// fmtPer is how report prints v instructions over n requests.
func fmtPer(v, n int64) string { return fmt.Sprintf("%.0f", float64(v)/float64(n)) }

func TestLoad(t *testing.T) {
	var served, failing atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || string(b) != `{"model":"m"}` || r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if served.Add(1)%10 == 0 && failing.Load() == 1 {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	bad, err := load(srv.URL, []byte(`{"model":"m"}`), 50, 4)
	require.NoError(t, err)
	assert.Equal(t, int64(0), bad)
	assert.Equal(t, int64(50), served.Load())

	failing.Store(1)
	bad, err = load(srv.URL, []byte(`{"model":"m"}`), 50, 4)
	require.NoError(t, err)
	assert.Equal(t, int64(5), bad, "every tenth of 50 answered 502")

	srv.Close()
	_, err = load(srv.URL, []byte(`{"model":"m"}`), 3, 1)
	assert.Error(t, err, "a server that is gone")
}
