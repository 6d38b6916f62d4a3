package workload

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkTraceWorkload asserts the invariants every reader promises for a
// workload it returns: sorted arrivals from 0, positive lengths, and one
// block per BlockTokens tokens of prompt.
func checkTraceWorkload(t *testing.T, w *Workload) {
	t.Helper()
	for i, r := range w.Requests {
		if r.Arrival < 0 || i > 0 && r.Arrival < w.Requests[i-1].Arrival {
			t.Fatalf("request %d: arrival %v out of order", i, r.Arrival)
		}
		if r.PromptTokens < 1 || r.OutputTokens < 1 || r.BlockTokens < 1 {
			t.Fatalf("request %d: prompt %d output %d block %d", i, r.PromptTokens, r.OutputTokens, r.BlockTokens)
		}
		if want := (r.PromptTokens + r.BlockTokens - 1) / r.BlockTokens; len(r.Blocks) != want {
			t.Fatalf("request %d: %d blocks for %d tokens", i, len(r.Blocks), r.PromptTokens)
		}
	}
	if len(w.Requests) > 0 && w.Requests[0].Arrival != 0 {
		t.Fatalf("first arrival %v, want 0", w.Requests[0].Arrival)
	}
}

// checkParseError asserts that err is a *ParseError with a line number.
func checkParseError(t *testing.T, err error) {
	t.Helper()
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line < 1 {
		t.Fatalf("want a *ParseError with a line, got %T %v", err, err)
	}
}

// seedFromTrace adds the first bytes of a shared trace file to the corpus.
func seedFromTrace(f *testing.F, name string, n int) {
	data, err := os.ReadFile(filepath.Join(tracesDir, name))
	if err != nil {
		return
	}
	f.Add(data[:min(n, len(data))])
}

func FuzzLoadMooncake(f *testing.F) {
	seedFromTrace(f, MooncakeFile, 2000)
	f.Add([]byte(`{"timestamp": 5, "input_length": 513, "output_length": 0, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": 1.5, "input_length": 1, "output_length": 3, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := LoadMooncake(bytes.NewReader(data))
		if err != nil {
			checkParseError(t, err)
			return
		}
		checkTraceWorkload(t, w)
	})
}

func FuzzLoadAzure(f *testing.F) {
	seedFromTrace(f, AzureCodeFile, 400)
	f.Add([]byte("GeneratedTokens,ContextTokens,TIMESTAMP\r\n0,1025,2024-05-10 00:00:00.25+00:00\r\n3,7,2024-05-10 00:00:00Z\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := LoadAzure(bytes.NewReader(data), "t")
		if err != nil {
			checkParseError(t, err)
			return
		}
		checkTraceWorkload(t, w)
	})
}

func FuzzLoadLengths(f *testing.F) {
	seedFromTrace(f, ShareGPTFile, 400)
	f.Add([]byte("input_length,output_length\n12.0,0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := LoadLengths(bytes.NewReader(data))
		if err != nil {
			checkParseError(t, err)
			return
		}
		if len(d.Prompt) == 0 || len(d.Prompt) != len(d.Output) {
			t.Fatalf("%d prompts, %d outputs", len(d.Prompt), len(d.Output))
		}
		for i := range d.Prompt {
			if d.Prompt[i] < 1 || d.Output[i] < 1 {
				t.Fatalf("row %d: prompt %d output %d", i, d.Prompt[i], d.Output[i])
			}
		}
	})
}

// TestReadersRejectAbsurdTokenCounts feeds each reader a row whose token
// count no model serves. Without a limit, LoadAzure allocated
// ceil(ContextTokens/512) block ids for it (a makeslice panic for 2^63-1,
// tens of gigabytes for 2^40), LoadMooncake overflowed computing
// ceil(input_length/512), and LoadLengths accepted lengths whose block
// count overflows in Generate. A row at the limit is still read.
func TestReadersRejectAbsurdTokenCounts(t *testing.T) {
	huge := strconv.Itoa(math.MaxInt64)
	limit := strconv.Itoa(MaxTokens)
	over := strconv.Itoa(MaxTokens + 1)
	azHeader := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	azRow := "2023-11-16 18:17:03.9799600,4808,10\n"
	lenHeader := "num_prefill_tokens,num_decode_tokens\n"
	tests := []struct {
		name, in string
		load     func(string) error
		line     int
		substr   string
	}{
		{"azure context", azHeader + azRow + "2023-11-16 18:17:04," + huge + ",1\n", azure, 3, "ContextTokens \"" + huge},
		{"azure context just over", azHeader + "2023-11-16 18:17:04," + over + ",1\n", azure, 2, "ContextTokens \"" + over},
		{"azure output", azHeader + "2023-11-16 18:17:04,7," + over + "\n", azure, 2, "GeneratedTokens \"" + over},
		{"mooncake input", `{"timestamp": 0, "input_length": ` + huge + `, "output_length": 1, "hash_ids": [1]}`, mooncake, 1, "input_length " + huge},
		{"mooncake output", `{"timestamp": 0, "input_length": 1, "output_length": ` + over + `, "hash_ids": [1]}`, mooncake, 1, "output_length " + over},
		{"lengths prompt", lenHeader + "10,5\n" + huge + ",5\n", lengths, 3, "prompt length \"" + huge},
		{"lengths output", lenHeader + "10," + over + "\n", lengths, 2, "output length \"" + over},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = tc.load(tc.in) })
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.line, pe.Line, "error: %v", err)
			assert.Contains(t, err.Error(), tc.substr)
			assert.Contains(t, err.Error(), limit, "the error names the limit")
		})
	}

	w, err := LoadAzure(strings.NewReader(azHeader+"2023-11-16 18:17:04,"+limit+","+limit+"\n"), "t")
	require.NoError(t, err)
	assert.Len(t, w.Requests[0].Blocks, MaxTokens/AzureBlockTokens)
	assert.Equal(t, MaxTokens, w.Requests[0].OutputTokens)
	d, err := LoadLengths(strings.NewReader(lenHeader + limit + "," + limit + "\n"))
	require.NoError(t, err)
	assert.Equal(t, []int{MaxTokens}, d.Prompt)
	assert.Equal(t, []int{MaxTokens}, d.Output)
}

// TestLoadAzureRejectsSpanBeyondDuration: arrivals are time.Duration
// offsets from the earliest timestamp, so two rows more than about 292
// years apart cannot both be represented. time.Time.Sub saturates, which
// silently put the later row at the largest Duration instead of its true
// offset; the reader now reports the row that makes the span too long, in
// either order.
func TestLoadAzureRejectsSpanBeyondDuration(t *testing.T) {
	header := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	early, late := "2000-01-01 00:00:00,1,1\n", "2300-01-01 00:00:00,1,1\n"
	for _, in := range []string{header + early + late, header + late + early} {
		_, err := LoadAzure(strings.NewReader(in), "t")
		var pe *ParseError
		require.ErrorAs(t, err, &pe, "input %q", in)
		assert.Equal(t, 3, pe.Line)
		assert.Contains(t, err.Error(), "TIMESTAMP")
	}
	// 290 years, 290·365 + 71 leap days = 105,921 days, are under the
	// 106,751-day maximum and still fit.
	w, err := LoadAzure(strings.NewReader(header+early+"2290-01-01 00:00:00,1,1\n"), "t")
	require.NoError(t, err)
	assert.Equal(t, 105921*24*time.Hour, w.Requests[1].Arrival)
}

// TestScaleSaturatesInsteadOfWrapping: scaling three arrivals at 0, 1 s and
// 2 s (1 req/s) to 1e-12 req/s multiplies them by 1e12, to 1e21 ns and
// 2e21 ns, beyond the largest Duration (about 9.2e18 ns). Converting such a
// float to an integer is implementation-defined in Go (on amd64 it gave
// math.MinInt64), so the workload came back with negative, unsorted
// arrivals. Like the generators' clock, Scale now saturates.
func TestScaleSaturatesInsteadOfWrapping(t *testing.T) {
	w := &Workload{Requests: []Request{reqAt(0, ""), reqAt(1000, ""), reqAt(2000, "")}}
	got := arrivals(w.Scale(1e-12))
	assert.Equal(t, []time.Duration{0, math.MaxInt64, math.MaxInt64}, got)

	// A factor that stays in range is applied as before: 1 req/s to
	// 0.25 req/s stretches the gaps four times.
	got = arrivals(w.Scale(0.25))
	assert.Equal(t, []time.Duration{0, 4 * time.Second, 8 * time.Second}, got)
}

// TestOnOffRejectsOverflowingCycle: On and Off are each valid (positive)
// but their sum, the cycle length, overflows to a negative Duration. With
// BurstRate 0 the Off phase then had a negative length, no arrival could
// ever be placed, and Next looped forever inside Generate. Generate must
// report the configuration instead.
func TestOnOffRejectsOverflowingCycle(t *testing.T) {
	half := time.Duration(math.MaxInt64/2 + 1)
	_, err := Generate(GenConfig{N: 3, Arrivals: &OnOff{BaseRate: 1, On: half, Off: half}, Lengths: Fixed{1, 1}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "OnOff")

	// The longest cycle that fits is still accepted.
	_, err = Generate(GenConfig{N: 3, Arrivals: &OnOff{BaseRate: 1, On: half, Off: half - 1}, Lengths: Fixed{1, 1}})
	require.NoError(t, err)
}

// TestOnOffSparseArrivalsSkipWholeCycles: with 1 µs On and Off periods
// and 1e-6 req/s in both, the mean gap, 1e6 s, spans 5e11 cycles. Next
// walked them one phase at a time, so Generate never returned; whole
// cycles without an arrival must be skipped at once. The process is then
// Poisson at 1e-6 req/s: the mean gap of 2000 arrivals is within 3
// standard errors (3/sqrt(2000) = 6.7%) of 1e6 s.
func TestOnOffSparseArrivalsSkipWholeCycles(t *testing.T) {
	const n = 2000
	w := gen(t, GenConfig{Seed: 1, N: n, Arrivals: &OnOff{BaseRate: 1e-6, BurstRate: 1e-6, On: time.Microsecond, Off: time.Microsecond}, Lengths: Fixed{1, 1}})
	mean := w.Requests[n-1].Arrival.Seconds() / n
	assert.InDelta(t, 1e6, mean, 0.067e6)
}
