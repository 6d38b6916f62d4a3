package workload

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tracesDir holds the shared traces; in CI it sits beside the checkout.
const tracesDir = "../../../shared/traces"

func openTrace(t testing.TB, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join(tracesDir, name))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// Expected values below are copied from the trace files (first and last
// rows) and from the statistics table of ../shared/traces/PROVENANCE.md,
// which were computed independently of this package.

func TestLoadMooncakeSyntheticTrace(t *testing.T) {
	w, err := LoadMooncake(openTrace(t, "mooncake_synthetic_trace.jsonl"))
	require.NoError(t, err)
	require.Len(t, w.Requests, 3993)

	first := w.Requests[0]
	assert.Equal(t, time.Duration(0), first.Arrival)
	assert.Equal(t, 40160, first.PromptTokens)
	assert.Equal(t, 6, first.OutputTokens)
	assert.Equal(t, 512, first.BlockTokens)
	require.Len(t, first.Blocks, 79) // hash_ids 0..78
	// A block is its hash_id tagged with the Mooncake namespace, 1<<56.
	assert.Equal(t, uint64(1)<<56, first.Blocks[0])
	assert.Equal(t, uint64(1)<<56|78, first.Blocks[78])
	assert.Equal(t, 40*time.Millisecond, w.Requests[2].Arrival)

	last := w.Requests[len(w.Requests)-1]
	assert.Equal(t, 1022025*time.Millisecond, last.Arrival)
	assert.Equal(t, 18440, last.PromptTokens)
	assert.Equal(t, 83, last.OutputTokens)
	require.Len(t, last.Blocks, 37)
	assert.Equal(t, uint64(1)<<56|17915, last.Blocks[0])
	assert.Equal(t, uint64(1)<<56|43923, last.Blocks[36])

	s := w.Stats()
	assert.Equal(t, 3993, s.Requests)
	assert.Equal(t, 1022025*time.Millisecond, s.Duration)
	assert.InDelta(t, 3.91, s.MeanRate, 0.005)
	assert.InDelta(t, 1.01, s.InterArrivalCV, 0.005)
	assert.Equal(t, []int{11587, 38615, 66458}, []int{s.PromptP50, s.PromptP90, s.PromptP99})
	assert.InDelta(t, 15325, s.PromptMean, 0.5)
	assert.Equal(t, []int{69, 389, 769}, []int{s.OutputP50, s.OutputP90, s.OutputP99})
	assert.InDelta(t, 149, s.OutputMean, 0.5)
	assert.InDelta(t, 0.651, s.SharedPrefixFraction, 0.0005)
	assert.InDelta(t, 0.640, s.SharedBlockFraction, 0.0005)

	idc1, _ := w.Burstiness(time.Second)
	idc60, _ := w.Burstiness(time.Minute)
	assert.InDelta(t, 1.09, idc1, 0.005)
	assert.InDelta(t, 13, idc60, 0.5)
}

func TestLoadAzureTraces(t *testing.T) {
	tests := []struct {
		file                   string
		rows                   int
		start                  time.Time
		lastArrival            time.Duration
		firstPrompt, firstOut  int
		rate, cv               float64
		prompt, output         []int // p50, p90, p99
		promptMean, outputMean float64
		idc1, peak1, idc10     float64
	}{
		{
			file: AzureCodeFile, rows: 8819,
			start:       time.Date(2023, 11, 16, 18, 17, 3, 979960000, time.UTC),
			lastArrival: 57*time.Minute + 15*time.Second + 948056*time.Microsecond, // 19:14:19.9280160 - 18:17:03.9799600
			firstPrompt: 4808, firstOut: 10,
			rate: 2.57, cv: 13.2,
			prompt: []int{1469, 5194, 7436}, promptMean: 2048,
			output: []int{13, 55, 252}, outputMean: 28,
			idc1: 13, peak1: 26, idc10: 71,
		},
		{
			file: AzureConvFile, rows: 19366,
			start:       time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC),
			lastArrival: 58*time.Minute + 21*time.Second + 721937*time.Microsecond, // 19:14:08.4025270 - 18:15:46.6805900
			firstPrompt: 374, firstOut: 44,
			rate: 5.53, cv: 1.09,
			prompt: []int{1020, 2735, 4142}, promptMean: 1155,
			output: []int{129, 424, 601}, outputMean: 211,
			idc1: 1.4, peak1: 2.9, idc10: 4.0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			w, err := LoadAzure(openTrace(t, tc.file), "tenant-x")
			require.NoError(t, err)
			require.Len(t, w.Requests, tc.rows)
			assert.Equal(t, "tenant-x", w.Name)
			assert.True(t, tc.start.Equal(w.Start), "start %v", w.Start)
			r0 := w.Requests[0]
			assert.Equal(t, time.Duration(0), r0.Arrival)
			assert.Equal(t, "tenant-x", r0.Tenant)
			assert.Equal(t, tc.firstPrompt, r0.PromptTokens)
			assert.Equal(t, tc.firstOut, r0.OutputTokens)
			assert.Len(t, r0.Blocks, (tc.firstPrompt+511)/512)
			assert.Equal(t, tc.lastArrival, w.Requests[tc.rows-1].Arrival)

			s := w.Stats()
			assert.InDelta(t, tc.rate, s.MeanRate, 0.005)
			assert.InDelta(t, tc.cv, s.InterArrivalCV, 0.05)
			assert.Equal(t, tc.prompt, []int{s.PromptP50, s.PromptP90, s.PromptP99})
			assert.Equal(t, tc.output, []int{s.OutputP50, s.OutputP90, s.OutputP99})
			assert.InDelta(t, tc.promptMean, s.PromptMean, 0.5)
			assert.InDelta(t, tc.outputMean, s.OutputMean, 0.5)
			assert.Zero(t, s.SharedPrefixFraction, "Azure blocks are unique per request")

			idc1, peak1 := w.Burstiness(time.Second)
			idc10, _ := w.Burstiness(10 * time.Second)
			assert.InDelta(t, tc.idc1, idc1, 0.05*tc.idc1)
			assert.InDelta(t, tc.peak1, peak1, 0.05*tc.peak1)
			assert.InDelta(t, tc.idc10, idc10, 0.05*tc.idc10)
		})
	}
}

// TestAzureCodeConvMerged checks the "azure" scenario's workload: both
// services as two tenants on one wall clock. The code tenant alone is the
// bursty one (inter-arrival CV 13.15 measured, 13.2 in PROVENANCE.md);
// interleaved with the smooth conv stream the combined inter-arrival CV is
// 1.33 (measured), while its 1 s index of dispersion stays 5.1.
func TestAzureCodeConvMerged(t *testing.T) {
	w, err := LoadAzureCodeConv(tracesDir)
	require.NoError(t, err)
	require.Len(t, w.Requests, 8819+19366)
	assert.Equal(t, "azure", w.Name)
	assert.True(t, time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC).Equal(w.Start))

	// conv starts first; code's first request (18:17:03.97996) lands
	// 77.29937 s later.
	assert.Equal(t, AzureConvTenant, w.Requests[0].Tenant)
	code := w.Tenant(AzureCodeTenant)
	conv := w.Tenant(AzureConvTenant)
	require.Len(t, code.Requests, 8819)
	require.Len(t, conv.Requests, 19366)
	assert.Equal(t, 77299370*time.Microsecond, code.Requests[0].Arrival)
	assert.Equal(t, 4808, code.Requests[0].PromptTokens)

	assert.True(t, slices.IsSortedFunc(w.Requests, func(a, b Request) int { return int(a.Arrival - b.Arrival) }))

	s := w.Stats()
	assert.Equal(t, 2, s.Tenants)
	assert.InDelta(t, 1.33, s.InterArrivalCV, 0.005)
	assert.InDelta(t, 13.15, code.Stats().InterArrivalCV, 0.005)
	assert.InDelta(t, 1.09, conv.Stats().InterArrivalCV, 0.005)
	idc1, peak1 := w.Burstiness(time.Second)
	assert.InDelta(t, 5.10, idc1, 0.01)
	assert.InDelta(t, 8.23, peak1, 0.01)

	// Every block id is unique across both tenants.
	seen := map[uint64]bool{}
	for _, r := range w.Requests {
		for _, id := range r.Blocks {
			require.False(t, seen[id], "block id %x reused", id)
			seen[id] = true
			assert.Equal(t, uint64(2), id>>56, "Azure name space")
		}
	}
	assert.Zero(t, s.SharedPrefixFraction)
}

func TestLoadLengthsDatasets(t *testing.T) {
	tests := []struct {
		file                   string
		rows                   int
		first, last            [2]int
		promptP50, outputP50   int
		promptMean, outputMean float64
	}{
		{ShareGPTFile, 30731, [2]int{74, 918}, [2]int{2285, 363}, 1730, 415, 2340, 439},
		{ArxivFile, 28257, [2]int{3772, 54}, [2]int{3178, 313}, 2730, 167, 2588, 291},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			d, err := LoadLengths(openTrace(t, tc.file))
			require.NoError(t, err)
			require.Equal(t, tc.rows, d.Len())
			require.Len(t, d.Output, tc.rows)
			assert.Equal(t, tc.first, [2]int{d.Prompt[0], d.Output[0]})
			assert.Equal(t, tc.last, [2]int{d.Prompt[tc.rows-1], d.Output[tc.rows-1]})
			p, o := slices.Clone(d.Prompt), slices.Clone(d.Output)
			slices.Sort(p)
			slices.Sort(o)
			mid := (tc.rows+1)/2 - 1 // nearest rank ceil(n/2)
			assert.Equal(t, tc.promptP50, p[mid])
			assert.Equal(t, tc.outputP50, o[mid])
			var ps, os float64
			for i := range d.Prompt {
				ps += float64(d.Prompt[i])
				os += float64(d.Output[i])
			}
			assert.InDelta(t, tc.promptMean, ps/float64(tc.rows), 0.5)
			assert.InDelta(t, tc.outputMean, os/float64(tc.rows), 0.5)
		})
	}
}

func TestLoadFile(t *testing.T) {
	w, err := LoadFile(filepath.Join(tracesDir, MooncakeFile))
	require.NoError(t, err)
	assert.Equal(t, "mooncake_synthetic_trace", w.Name)
	assert.Len(t, w.Requests, 3993)

	w, err = LoadFile(filepath.Join(tracesDir, AzureCodeFile))
	require.NoError(t, err)
	assert.Equal(t, "AzureLLMInferenceTrace_code", w.Name)
	assert.Equal(t, "AzureLLMInferenceTrace_code", w.Requests[0].Tenant)
	assert.Len(t, w.Requests, 8819)

	d, err := LoadLengthsFile(filepath.Join(tracesDir, ArxivFile))
	require.NoError(t, err)
	assert.Equal(t, 28257, d.Len())
	_, err = LoadLengthsFile(filepath.Join(tracesDir, MooncakeFile))
	assert.ErrorContains(t, err, "mooncake_synthetic_trace.jsonl: workload: lengths trace line 1: header")
	assert.Less(t, len(err.Error()), 400, "the offending header is clipped")
	_, err = LoadLengthsFile(filepath.Join(tracesDir, "missing.csv"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	_, err = LoadFile(filepath.Join(tracesDir, "PROVENANCE.md"))
	assert.ErrorContains(t, err, "unknown trace format")
	_, err = LoadFile(filepath.Join(tracesDir, "missing.jsonl"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// A well-formed file with a parse error names the path and the line.
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n{oops\n"), 0o600))
	_, err = LoadFile(bad)
	var pe *ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 2, pe.Line)
	assert.Contains(t, err.Error(), "bad.jsonl")
}

func TestLoadMooncakeSmall(t *testing.T) {
	// Out-of-order rows are sorted (ties keep file order), blank lines are
	// skipped, timestamps are rebased to the earliest, output 0 reads as 1,
	// and CRLF line ends are accepted.
	in := "{\"timestamp\": 1500, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [7, 8]}\r\n" +
		"\n" +
		`{"timestamp": 1000.5, "input_length": 513, "output_length": 4, "hash_ids": [7, 9], "extra": true}` + "\n" +
		`{"timestamp": 1500, "input_length": 1, "output_length": 2, "hash_ids": [3]}`
	w, err := LoadMooncake(strings.NewReader(in))
	require.NoError(t, err)
	require.Len(t, w.Requests, 3)
	assert.Equal(t, []time.Duration{0, 499500 * time.Microsecond, 499500 * time.Microsecond},
		[]time.Duration{w.Requests[0].Arrival, w.Requests[1].Arrival, w.Requests[2].Arrival})
	assert.Equal(t, []int{513, 1024, 1}, []int{w.Requests[0].PromptTokens, w.Requests[1].PromptTokens, w.Requests[2].PromptTokens})
	assert.Equal(t, 1, w.Requests[1].OutputTokens)
	ns := uint64(1) << 56
	assert.Equal(t, []uint64{ns | 7, ns | 9}, w.Requests[0].Blocks)
	assert.Equal(t, []uint64{ns | 7, ns | 8}, w.Requests[1].Blocks)
	// Request 1 reuses block 7 of request 0: 512 of 1538 prompt tokens.
	assert.InDelta(t, 512.0/1538, w.Stats().SharedPrefixFraction, 1e-12)
}

func TestLoadAzureSmall(t *testing.T) {
	// Columns in another order, an extra column, LF endings, a zone offset
	// as in the 2024 traces, a BOM and unsorted rows.
	in := "\xef\xbb\xbfGeneratedTokens,extra,ContextTokens,TIMESTAMP\n" +
		"5,x,100,2024-05-10 00:00:01.5+00:00\n" +
		"0,y,1025,2024-05-10 00:00:00.25+00:00\n"
	w, err := LoadAzure(strings.NewReader(in), "")
	require.NoError(t, err)
	assert.Equal(t, "azure", w.Name)
	require.Len(t, w.Requests, 2)
	assert.True(t, time.Date(2024, 5, 10, 0, 0, 0, 250000000, time.UTC).Equal(w.Start))
	assert.Equal(t, time.Duration(0), w.Requests[0].Arrival)
	assert.Equal(t, 1025, w.Requests[0].PromptTokens)
	assert.Equal(t, 1, w.Requests[0].OutputTokens)
	assert.Len(t, w.Requests[0].Blocks, 3)
	assert.Equal(t, 1250*time.Millisecond, w.Requests[1].Arrival)
	assert.Equal(t, 100, w.Requests[1].PromptTokens)
	assert.Equal(t, 5, w.Requests[1].OutputTokens)
}

func TestTraceReadersRejectMalformedInput(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}` + "\n"
	azHeader := "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
	azRow := "2023-11-16 18:17:03.9799600,4808,10\r\n"
	lenHeader := "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
	long := strings.Repeat(" ", MaxLineBytes+1)
	tests := []struct {
		name   string
		load   func(string) error
		in     string
		line   int
		substr string
	}{
		{"mooncake bad json", mooncake, good + "{\"timestamp\": 1,\n", 2, "unexpected end"},
		{"mooncake wrong type", mooncake, good + good + `{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, 3, "timestamp"},
		{"mooncake missing timestamp", mooncake, `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`, 1, "missing timestamp"},
		{"mooncake missing input", mooncake, `{"timestamp": 1, "output_length": 1, "hash_ids": [1]}`, 1, "missing input_length"},
		{"mooncake missing output", mooncake, `{"timestamp": 1, "input_length": 1, "hash_ids": [1]}`, 1, "missing output_length"},
		{"mooncake missing hash ids", mooncake, `{"timestamp": 1, "input_length": 1, "output_length": 1}`, 1, "missing hash_ids"},
		{"mooncake negative time", mooncake, `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, 1, "timestamp"},
		{"mooncake zero input", mooncake, `{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}`, 1, "input_length 0"},
		{"mooncake negative output", mooncake, `{"timestamp": 1, "input_length": 1, "output_length": -2, "hash_ids": [1]}`, 1, "output_length -2"},
		{"mooncake too few ids", mooncake, good + `{"timestamp": 1, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`, 2, "want ceil(1025/512) = 3"},
		{"mooncake negative id", mooncake, `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`, 1, "out of range"},
		{"mooncake huge id", mooncake, `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [72057594037927936]}`, 1, "out of range"},
		{"mooncake line too long", mooncake, good + long + "\n", 2, "longer than"},
		{"azure empty", azure, "", 1, "empty input"},
		{"azure missing column", azure, "TIMESTAMP,ContextTokens\n", 1, "no GeneratedTokens column"},
		{"azure bad time", azure, azHeader + azRow + "16/11/2023 18:17,1,1\r\n", 3, "TIMESTAMP"},
		{"azure bad count", azure, azHeader + "2023-11-16 18:17:03,abc,1\r\n", 2, "ContextTokens \"abc\""},
		{"azure zero context", azure, azHeader + "2023-11-16 18:17:03,0,1\r\n", 2, "ContextTokens \"0\""},
		{"azure negative output", azure, azHeader + "2023-11-16 18:17:03,5,-1\r\n", 2, "GeneratedTokens \"-1\""},
		{"azure field count", azure, azHeader + azRow + azRow + "2023-11-16 18:17:03,5\r\n", 4, "2 fields, the header has 3"},
		{"azure line too long", azure, azHeader + long, 2, "longer than"},
		{"lengths empty", lengths, "", 1, "empty input"},
		{"lengths header", lengths, "a,b\n1,2\n", 1, "no num_prefill_tokens or ContextTokens or input_length column"},
		{"lengths no rows", lengths, lenHeader, 1, "no data rows"},
		{"lengths bad value", lengths, lenHeader + "10,5,15,2\n1.5,5,6.5,0.3\n", 3, "prompt length \"1.5\""},
		{"lengths zero prompt", lengths, lenHeader + "0,5,5,0\n", 2, "prompt length \"0\""},
		{"lengths negative output", lengths, lenHeader + "3,-5,5,0\n", 2, "output length \"-5\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load(tc.in)
			require.Error(t, err)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "want a *ParseError, got %T %v", err, err)
			assert.Equal(t, tc.line, pe.Line, "error: %v", err)
			assert.Contains(t, err.Error(), tc.substr)
			assert.Contains(t, err.Error(), "line ")
		})
	}
}

func mooncake(in string) error { _, err := LoadMooncake(strings.NewReader(in)); return err }
func azure(in string) error    { _, err := LoadAzure(strings.NewReader(in), "t"); return err }
func lengths(in string) error  { _, err := LoadLengths(strings.NewReader(in)); return err }

func TestLoadLengthsAcceptsOtherColumnNames(t *testing.T) {
	d, err := LoadLengths(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03,300,0\r\n2023-11-16 18:17:04,20.0,7\r\n"))
	require.NoError(t, err)
	assert.Equal(t, []int{300, 20}, d.Prompt)
	assert.Equal(t, []int{1, 7}, d.Output)
}
