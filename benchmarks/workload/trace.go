package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Limits of the trace readers, so that a wrong file fails fast instead of
// filling memory.
const (
	// MaxLineBytes is the longest line a reader accepts. A Mooncake line
	// for a 1M-token prompt holds about 2,000 hash ids, well under this.
	MaxLineBytes = 1 << 20
	// MaxRows is the largest number of data rows a reader accepts.
	MaxRows = 5_000_000
	// MaxTokens is the largest prompt or output length, in tokens, a
	// reader accepts: above the longest context windows served today (10M
	// tokens), yet small enough that one row's block ids fit in 256 KiB
	// (MaxTokens/512 ids for the Azure traces, which have no hash ids to
	// bound them) and that sums of a few lengths cannot overflow an int.
	MaxTokens = 1 << 24
)

// MooncakeBlockTokens is the block size of Mooncake hash_ids (FAST25-release
// README: "each block contains 512 tokens").
const MooncakeBlockTokens = 512

// AzureBlockTokens is the block size used for Azure trace requests. The
// Azure traces carry no prefix information, so every block id is unique to
// its request; a large block keeps the id lists short.
const AzureBlockTokens = 512

// ParseError reports malformed trace input. Line is 1-based and counts the
// header line of CSV files.
type ParseError struct {
	// Format names the reader: "mooncake", "azure" or "lengths".
	Format string
	// Line is the 1-based line number of the offending line.
	Line int
	// Err describes the problem.
	Err error
}

// Error implements error.
func (e *ParseError) Error() string {
	return fmt.Sprintf("workload: %s trace line %d: %v", e.Format, e.Line, e.Err)
}

// Unwrap returns the underlying error.
func (e *ParseError) Unwrap() error { return e.Err }

// ErrTooManyRows is wrapped by a ParseError when input exceeds MaxRows.
var ErrTooManyRows = errors.New("too many rows")

// lineReader yields lines without their terminator (LF or CRLF), capped at
// MaxLineBytes, with 1-based line numbers.
type lineReader struct {
	sc     *bufio.Scanner
	format string
	line   int
}

func newLineReader(r io.Reader, format string) *lineReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	return &lineReader{sc: sc, format: format}
}

// next returns the next line; ok is false at the end of input or on error
// (see err).
func (l *lineReader) next() (line []byte, ok bool) {
	if !l.sc.Scan() {
		return nil, false
	}
	l.line++
	b := l.sc.Bytes()
	if l.line == 1 {
		b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf")) // UTF-8 byte-order mark
	}
	return bytes.TrimSuffix(b, []byte{'\r'}), true
}

// err returns the reading error, if any, as a ParseError.
func (l *lineReader) err() error {
	err := l.sc.Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, bufio.ErrTooLong) {
		return &ParseError{Format: l.format, Line: l.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
	}
	return &ParseError{Format: l.format, Line: l.line + 1, Err: err}
}

func (l *lineReader) errorf(format string, args ...any) error {
	return &ParseError{Format: l.format, Line: l.line, Err: fmt.Errorf(format, args...)}
}

// mooncakeRow is one line of a Mooncake trace. Pointers detect missing
// fields.
type mooncakeRow struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// LoadMooncake reads a trace in the Mooncake FAST'25 release format
// (github.com/kvcache-ai/Mooncake, FAST25-release/README.md): one JSON
// object per line with timestamp (milliseconds from the trace start),
// input_length, output_length and hash_ids (one id per 512-token block;
// equal ids at equal positions are a shared prefix). Blank lines are
// skipped; unknown fields are ignored.
//
// Each request gets BlockTokens = MooncakeBlockTokens and one block per
// hash id (ids in the Mooncake name space). Arrivals are offsets from the
// earliest timestamp; rows are sorted by timestamp, keeping file order for
// ties. An output_length of 0 is read as 1 (the request still produces its
// first token). LoadMooncake returns a *ParseError for a malformed line: bad
// JSON, a missing or negative field, a length over MaxTokens, hash ids that do not cover
// input_length in 512-token blocks, or a line over MaxLineBytes. It reads r
// to the end and does not close it.
func LoadMooncake(r io.Reader) (*Workload, error) {
	lr := newLineReader(r, "mooncake")
	w := &Workload{Name: "mooncake"}
	for {
		line, ok := lr.next()
		if !ok {
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if len(w.Requests) >= MaxRows {
			return nil, &ParseError{Format: lr.format, Line: lr.line, Err: ErrTooManyRows}
		}
		var row mooncakeRow
		if err := json.Unmarshal(line, &row); err != nil {
			return nil, lr.errorf("%v", err)
		}
		switch {
		case row.Timestamp == nil:
			return nil, lr.errorf("missing timestamp")
		case row.InputLength == nil:
			return nil, lr.errorf("missing input_length")
		case row.OutputLength == nil:
			return nil, lr.errorf("missing output_length")
		case row.HashIDs == nil:
			return nil, lr.errorf("missing hash_ids")
		}
		ts, in, out := *row.Timestamp, *row.InputLength, *row.OutputLength
		if math.IsNaN(ts) || ts < 0 || ts > float64(math.MaxInt64/int64(time.Millisecond)) {
			return nil, lr.errorf("timestamp %v out of range (milliseconds from the trace start)", ts)
		}
		if in < 1 || in > MaxTokens {
			return nil, lr.errorf("input_length %d must be in [1, %d]", in, MaxTokens)
		}
		if out < 0 || out > MaxTokens {
			return nil, lr.errorf("output_length %d must be in [0, %d]", out, MaxTokens)
		}
		want := (in + MooncakeBlockTokens - 1) / MooncakeBlockTokens
		if len(row.HashIDs) != want {
			return nil, lr.errorf("%d hash_ids for input_length %d, want ceil(%d/%d) = %d", len(row.HashIDs), in, in, MooncakeBlockTokens, want)
		}
		blocks := make([]uint64, len(row.HashIDs))
		for i, id := range row.HashIDs {
			if id < 0 || uint64(id) > MaxTraceBlockID {
				return nil, lr.errorf("hash_ids[%d] = %d out of range [0, 2^56)", i, id)
			}
			blocks[i] = nsMooncake | uint64(id)
		}
		w.Requests = append(w.Requests, Request{
			Arrival:      time.Duration(math.Round(ts * float64(time.Millisecond))),
			Blocks:       blocks,
			BlockTokens:  MooncakeBlockTokens,
			PromptTokens: in,
			OutputTokens: max(out, 1),
		})
	}
	if err := lr.err(); err != nil {
		return nil, err
	}
	rebase(w.Requests)
	return w, nil
}

// rebase sorts requests by arrival (stable) and shifts them so that the
// earliest arrives at 0.
func rebase(rs []Request) {
	sortByArrival(rs)
	if len(rs) == 0 {
		return
	}
	first := rs[0].Arrival
	for i := range rs {
		rs[i].Arrival -= first
	}
}

// csvHeader maps the columns the readers need to their indexes.
type csvHeader struct {
	cols  []int
	width int
}

// parseHeader finds each wanted column (any of its accepted names,
// case-insensitive) in the header line.
func parseHeader(lr *lineReader, line []byte, wanted [][]string) (csvHeader, error) {
	fields := splitCSV(line)
	h := csvHeader{cols: make([]int, len(wanted)), width: len(fields)}
	for i, names := range wanted {
		h.cols[i] = -1
		for j, f := range fields {
			for _, n := range names {
				if strings.EqualFold(f, n) {
					h.cols[i] = j
				}
			}
		}
		if h.cols[i] < 0 {
			return h, lr.errorf("header %q has no %s column", clip(string(line), 80), strings.Join(names, " or "))
		}
	}
	return h, nil
}

// clip shortens s to at most n bytes for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// splitCSV splits a simple CSV line (no quoted commas, which the trace
// formats never need) and trims spaces and surrounding quotes.
func splitCSV(line []byte) []string {
	parts := strings.Split(string(line), ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if len(p) >= 2 && p[0] == '"' && p[len(p)-1] == '"' {
			p = p[1 : len(p)-1]
		}
		parts[i] = p
	}
	return parts
}

// azureTimeLayouts are the timestamp forms accepted in Azure traces: the
// 2023 traces' "2023-11-16 18:17:03.9799600" (fractional seconds of any
// length are accepted after the seconds field), the same with a zone
// offset as in the 2024 week-long traces, and RFC 3339.
var azureTimeLayouts = []string{
	"2006-01-02 15:04:05",
	"2006-01-02 15:04:05Z07:00",
	time.RFC3339Nano,
}

func parseAzureTime(s string) (time.Time, error) {
	for _, layout := range azureTimeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("TIMESTAMP %q is not a date-time like 2023-11-16 18:17:03.9799600", s)
}

// LoadAzure reads an Azure LLM inference trace in the format of
// github.com/Azure/AzurePublicDataset (AzureLLMInferenceTrace_{code,conv}.csv;
// Patel et al., "Splitwise", ISCA 2024): a header naming TIMESTAMP,
// ContextTokens and GeneratedTokens (any order, case-insensitive, extra
// columns ignored), then one row per request. Line endings may be LF or
// CRLF. The trace has no prefix information, so each request's blocks
// (AzureBlockTokens tokens each) are unique to it and to the tenant, and
// every request carries the given tenant name (also the workload's Name;
// "azure" if empty).
//
// Arrivals are offsets from the earliest timestamp, which is the
// workload's Start; rows are sorted by time, keeping file order for ties.
// Timestamps without a zone are read as UTC. A GeneratedTokens of 0 is read as 1.
// It returns a *ParseError for a bad header or row (including a token
// count over MaxTokens, or a timestamp more than a time.Duration, about
// 292 years, from another), or a line over MaxLineBytes. It reads r to the end and does not close it.
func LoadAzure(r io.Reader, tenant string) (*Workload, error) {
	lr := newLineReader(r, "azure")
	name := tenant
	if name == "" {
		name = "azure"
	}
	w := &Workload{Name: name}
	line, ok := lr.next()
	if !ok {
		if err := lr.err(); err != nil {
			return nil, err
		}
		return nil, &ParseError{Format: lr.format, Line: 1, Err: errors.New("empty input: want a header TIMESTAMP,ContextTokens,GeneratedTokens")}
	}
	h, err := parseHeader(lr, line, [][]string{{"TIMESTAMP"}, {"ContextTokens"}, {"GeneratedTokens"}})
	if err != nil {
		return nil, err
	}
	tenantHash := hashString(tenant)
	var times []time.Time
	var lo, hi time.Time // earliest and latest timestamp so far
	for {
		line, ok := lr.next()
		if !ok {
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if len(w.Requests) >= MaxRows {
			return nil, &ParseError{Format: lr.format, Line: lr.line, Err: ErrTooManyRows}
		}
		f := splitCSV(line)
		if len(f) != h.width {
			return nil, lr.errorf("%d fields, the header has %d", len(f), h.width)
		}
		t, err := parseAzureTime(f[h.cols[0]])
		if err != nil {
			return nil, lr.errorf("%v", err)
		}
		if len(times) == 0 || t.Before(lo) {
			lo = t
		}
		if len(times) == 0 || t.After(hi) {
			hi = t
		}
		// Arrivals are Durations from the earliest timestamp; Sub
		// saturates, so a span it cannot represent would go unnoticed.
		if !lo.Add(hi.Sub(lo)).Equal(hi) {
			return nil, lr.errorf("TIMESTAMP %q: the trace would span more than %v, the longest time.Duration", f[h.cols[0]], time.Duration(math.MaxInt64))
		}
		in, err := strconv.Atoi(f[h.cols[1]])
		if err != nil || in < 1 || in > MaxTokens {
			return nil, lr.errorf("ContextTokens %q must be an integer in [1, %d]", f[h.cols[1]], MaxTokens)
		}
		out, err := strconv.Atoi(f[h.cols[2]])
		if err != nil || out < 0 || out > MaxTokens {
			return nil, lr.errorf("GeneratedTokens %q must be an integer in [0, %d]", f[h.cols[2]], MaxTokens)
		}
		row := uint64(len(w.Requests))
		nb := (in + AzureBlockTokens - 1) / AzureBlockTokens
		blocks := make([]uint64, nb)
		base := idBase(tagAzure, tenantHash, row)
		for b := range blocks {
			blocks[b] = blockID(nsAzure, base, b)
		}
		times = append(times, t)
		w.Requests = append(w.Requests, Request{
			Tenant:       tenant,
			Blocks:       blocks,
			BlockTokens:  AzureBlockTokens,
			PromptTokens: in,
			OutputTokens: max(out, 1),
		})
	}
	if err := lr.err(); err != nil {
		return nil, err
	}
	if len(times) > 0 {
		for i, t := range times {
			w.Requests[i].Arrival = t.Sub(lo)
		}
		w.Start = lo
	}
	rebase(w.Requests)
	return w, nil
}

// LoadLengths reads an empirical distribution of (prompt, output) token
// counts from a CSV file with a header: the ShareGPT and arXiv
// summarization statistics of Vidur / Sarathi-Serve (columns
// num_prefill_tokens, num_decode_tokens, ...), or any file with
// ContextTokens/GeneratedTokens or input_length/output_length columns (so
// an Azure trace also works). Rows with a prompt < 1 or output < 0, or
// either over MaxTokens, are errors; an output of 0 is read as 1. It returns a *ParseError for
// malformed input and an error if there are no rows.
func LoadLengths(r io.Reader) (LengthDist, error) {
	lr := newLineReader(r, "lengths")
	line, ok := lr.next()
	if !ok {
		if err := lr.err(); err != nil {
			return LengthDist{}, err
		}
		return LengthDist{}, &ParseError{Format: lr.format, Line: 1, Err: errors.New("empty input: want a header with num_prefill_tokens,num_decode_tokens")}
	}
	h, err := parseHeader(lr, line, [][]string{
		{"num_prefill_tokens", "ContextTokens", "input_length"},
		{"num_decode_tokens", "GeneratedTokens", "output_length"},
	})
	if err != nil {
		return LengthDist{}, err
	}
	var d LengthDist
	for {
		line, ok := lr.next()
		if !ok {
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if len(d.Prompt) >= MaxRows {
			return LengthDist{}, &ParseError{Format: lr.format, Line: lr.line, Err: ErrTooManyRows}
		}
		f := splitCSV(line)
		if len(f) != h.width {
			return LengthDist{}, lr.errorf("%d fields, the header has %d", len(f), h.width)
		}
		p, err := parseCount(f[h.cols[0]])
		if err != nil || p < 1 || p > MaxTokens {
			return LengthDist{}, lr.errorf("prompt length %q must be an integer in [1, %d]", f[h.cols[0]], MaxTokens)
		}
		o, err := parseCount(f[h.cols[1]])
		if err != nil || o < 0 || o > MaxTokens {
			return LengthDist{}, lr.errorf("output length %q must be an integer in [0, %d]", f[h.cols[1]], MaxTokens)
		}
		d.Prompt = append(d.Prompt, p)
		d.Output = append(d.Output, max(o, 1))
	}
	if err := lr.err(); err != nil {
		return LengthDist{}, err
	}
	if len(d.Prompt) == 0 {
		return LengthDist{}, &ParseError{Format: lr.format, Line: lr.line, Err: errors.New("no data rows")}
	}
	return d, nil
}

// parseCount parses a token count written as an integer or as an
// integral float ("412" or "412.0", as pandas writes them).
func parseCount(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<40 {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	return int(f), nil
}

// LoadFile opens a trace file and reads it with the matching reader: a
// .jsonl or .json file as a Mooncake trace, a .csv file as an Azure trace
// whose tenant is the file's base name without extension. The workload's
// Name is the base name. Errors name the path.
func LoadFile(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	base := filepath.Base(path)
	ext := strings.ToLower(filepath.Ext(base))
	stem := strings.TrimSuffix(base, filepath.Ext(base))
	var w *Workload
	switch ext {
	case ".jsonl", ".json":
		w, err = LoadMooncake(f)
	case ".csv":
		w, err = LoadAzure(f, stem)
	default:
		return nil, fmt.Errorf("workload: %s: unknown trace format %q (want .jsonl for Mooncake or .csv for Azure)", path, ext)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.Name = stem
	return w, nil
}

// Names of the other trace files in ../shared/traces.
const (
	MooncakeFile = "mooncake_synthetic_trace.jsonl"
	ShareGPTFile = "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
	ArxivFile    = "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
)

// LoadLengthsFile reads a length-distribution CSV (see LoadLengths) from
// path. Errors name the path.
func LoadLengthsFile(path string) (LengthDist, error) {
	f, err := os.Open(path)
	if err != nil {
		return LengthDist{}, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	d, err := LoadLengths(f)
	if err != nil {
		return LengthDist{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Names of the Azure LLM inference 2023 trace files in ../shared/traces and
// the tenant names LoadAzureCodeConv gives them.
const (
	AzureCodeFile   = "AzureLLMInferenceTrace_code.csv"
	AzureConvFile   = "AzureLLMInferenceTrace_conv.csv"
	AzureCodeTenant = "code"
	AzureConvTenant = "conv"
)

// LoadAzureCodeConv reads the Azure code and conv traces from dir and
// merges them, aligned on the wall clock, as two tenants "code" and "conv"
// (two different Azure OpenAI services, per the dataset's description).
// The result is named "azure".
func LoadAzureCodeConv(dir string) (*Workload, error) {
	var ws []*Workload
	for _, f := range []struct{ file, tenant string }{{AzureCodeFile, AzureCodeTenant}, {AzureConvFile, AzureConvTenant}} {
		path := filepath.Join(dir, f.file)
		fh, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		w, err := LoadAzure(fh, f.tenant)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		ws = append(ws, w)
	}
	m := Merge(ws...)
	m.Name = "azure"
	return m, nil
}
