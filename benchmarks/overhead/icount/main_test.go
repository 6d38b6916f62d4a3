package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
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

// TestParseDumpSpec reads a dump written by hand to callgrind's format
// specification: name compression shared by fn= and cfn=, the inclusive
// cost after calls= left out, relative and repeated positions, a missing
// event, Ir in the second column, and a recursion level merged.
func TestParseDumpSpec(t *testing.T) {
	dump := `# callgrind format
version: 1
positions: line
events: Dr Ir
summary: 10 1000
ob=(1) /bin/x
fl=(1) a.go
fn=(1) main.f
10 5 100
+2 1 50
fi=(2) b.go
* 2 25
-1 7
cfn=(2) main.g
calls=1 20
16 40 400
fe=(1)
fn=(2)
20 1 300
fn=(3) main.g'2
21 1 20
fn=(1)
30 0 5
totals: 10 1000
`
	p, err := parseDump(strings.NewReader(dump))
	require.NoError(t, err)
	assert.Equal(t, int64(1000), p.total)
	assert.Equal(t, map[string]int64{"main.f": 100 + 50 + 25 + 5, "main.g": 300 + 20}, p.funcs)

	for _, bad := range []struct{ dump, want string }{
		{"version: 1\nevents: Ir\nfn=(1) f\n1 2\n", "no summary"},
		{"events: Ir\n1 2\nsummary: 2\n", "before any fn="},
		{"events: Ir\nfn=(4)\n1 2\nsummary: 2\n", "used before it is defined"},
		{"events: Dr\nsummary: 2\n", "no Ir"},
		{"events: Ir\nfn=f\n1 x\nsummary: 2\n", `cost "x"`},
		{"events: Ir\nfn=f\nwhat is this\n", "neither a cost line nor a key"},
		{"events: Ir\nfn=f\n1 9223372036854775807\n2 1\nsummary: 2\n", "overflows"},
	} {
		_, err := parseDump(strings.NewReader(bad.dump))
		assert.ErrorContains(t, err, bad.want, bad.dump)
	}
}

// TestParseDumpReal reads a real dump of instructions.sh (minproxy, 4000
// requests of 1 KB): its functions' self costs add up to the totals:
// line callgrind wrote (which callgrind_annotate 3.19's listing of the
// same dump did not: its rows summed to 71 times the total, charging
// runtime.newobject'2 alone 384% of it), and no function costs more than
// a fraction of the whole.
func TestParseDumpReal(t *testing.T) {
	f, err := os.Open("testdata/minproxy.callgrind.gz")
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.True(t, isDump(b))
	summary := lineValue(t, b, `(?m)^summary: (\d+)$`)
	totals := lineValue(t, b, `(?m)^totals: (\d+)$`)

	p, err := parseDump(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, summary, p.total)
	assert.Equal(t, totals, p.listed(), "the self costs add up to the dump's totals")
	for fn, v := range p.funcs {
		assert.Less(t, v, p.total/5, fn)
	}
	assert.Less(t, p.funcs["runtime.newobject"], p.total/20)
	assert.False(t, isDump([]byte("--------\nProfile data file 'x' (creator: callgrind-3.19.0)\n")))
}

func lineValue(t *testing.T, b []byte, re string) int64 {
	t.Helper()
	m := regexp.MustCompile(re).FindSubmatch(b)
	require.NotNil(t, m, re)
	v, err := strconv.ParseInt(string(m[1]), 10, 64)
	require.NoError(t, err)
	return v
}

// FuzzParseDump: any input gives a profile or an error, never a panic, and
// a profile's costs are the file's own numbers (none below zero unless the
// file wrote one).
func FuzzParseDump(f *testing.F) {
	f.Add("# callgrind format\nevents: Ir\nfn=(1) f\n1 5\ncfn=(2) g\ncalls=1 2\n3 4\nfn=(2)\n+1 7\nsummary: 12\n")
	f.Add("events: Dr Ir\npositions: instr line\nfn=f'2\n0x10 2 1 9\ntotals: 3 9\n")
	f.Add("fn=(1\n")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseDump(strings.NewReader(s))
		if err != nil {
			return
		}
		if !strings.Contains(s, "-") {
			for fn, v := range p.funcs {
				if v < 0 {
					t.Fatalf("%s costs %d from a file without a minus sign", fn, v)
				}
			}
		}
	})
}
