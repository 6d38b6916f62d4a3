package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/inferroute/inferroute/benchmarks/workload"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Status classifies what the client saw of one request.
type Status uint8

// Request statuses.
const (
	// OK: the stream ended with [DONE] after every requested token.
	OK Status = iota + 1
	// Shed: the gateway answered 429 (load shedding).
	Shed
	// Lost: the request failed before the first response byte (a non-200
	// status other than 429, or a transport error): the gateway neither
	// served it nor retried it successfully.
	Lost
	// Cut: the stream began and then failed, and the client was told so
	// (an SSE error event, or a broken connection).
	Cut
	// Truncated: the stream ended with [DONE] but carried fewer tokens than
	// requested, a silent truncation. Must never happen.
	Truncated
	// TimedOut: no response headers within LoadConfig.Timeout (an
	// overloaded fleet's queue, not a failure of the gateway).
	TimedOut
)

// String returns the status name.
func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Shed:
		return "shed"
	case Lost:
		return "lost"
	case Cut:
		return "cut"
	case Truncated:
		return "truncated"
	case TimedOut:
		return "timed out"
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// Outcome is what the client saw of one request.
type Outcome struct {
	// Index is the request's index in the workload.
	Index int
	// Priority is the request's priority header.
	Priority int
	// Status classifies the outcome.
	Status Status
	// HTTPStatus is the response status, 0 without a response.
	HTTPStatus int
	// RetryAfter is the Retry-After header of a 429.
	RetryAfter string
	// Sent is when the request was sent.
	Sent time.Time
	// TTFT is the wall time from sending to the first content chunk; 0
	// when none arrived.
	TTFT time.Duration
	// Tokens is the number of content chunks received.
	Tokens int
	// Err describes a failure.
	Err error
}

// LoadConfig configures an open-loop load run.
type LoadConfig struct {
	// URL is the gateway's base URL.
	URL string
	// Model is the model every request asks for (adapters from the
	// workload replace it).
	Model string
	// Workload gives each request's arrival, prompt content, lengths,
	// adapter and priority. Requests are sent at their arrival times
	// divided by Speed, whatever happens to earlier ones (open loop).
	Workload *workload.Workload
	// Speed compresses the arrival times, to match emulated pods running
	// Speed times faster than their GPU; 0 means 1.
	Speed float64
	// Timeout bounds each request; 0 means 2 minutes.
	Timeout time.Duration
	// Client sends the requests; nil means a client with a transport sized
	// for many concurrent streams.
	Client *http.Client
}

// Result is the outcome of a load run.
type Result struct {
	// Outcomes are per request, in workload order.
	Outcomes []Outcome
	// Elapsed is the wall time of the run.
	Elapsed time.Duration
}

// Count returns how many outcomes have status s.
func (r *Result) Count(s Status) int {
	n := 0
	for i := range r.Outcomes {
		if r.Outcomes[i].Status == s {
			n++
		}
	}
	return n
}

// TTFTs returns the client-side TTFTs in seconds of the OK requests, sorted,
// multiplied by speed (the emulated pods' speed factor) so that they read
// as the modelled GPU's seconds.
func (r *Result) TTFTs(speed float64) []float64 {
	if speed <= 0 {
		speed = 1
	}
	var out []float64
	for i := range r.Outcomes {
		if o := &r.Outcomes[i]; o.Status == OK {
			out = append(out, o.TTFT.Seconds()*speed)
		}
	}
	slices.Sort(out)
	return out
}

// Summary is the TTFT mean and percentiles of a sorted sample.
type Summary struct {
	N                   int
	Mean, P50, P90, P99 float64
}

// Summarize returns the summary of sorted, a sorted sample.
func Summarize(sorted []float64) Summary {
	s := Summary{N: len(sorted)}
	if len(sorted) == 0 {
		return s
	}
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	s.Mean = sum / float64(len(sorted))
	s.P50, s.P90, s.P99 = percentile(sorted, 0.5), percentile(sorted, 0.9), percentile(sorted, 0.99)
	return s
}

// percentile is the nearest-rank percentile of a sorted sample.
func percentile(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// newClient returns a client for many concurrent streams to one host.
func newClient() *http.Client {
	t := router.NewTransport()
	t.MaxConnsPerHost = 0
	return &http.Client{Transport: t}
}

// RunLoad sends the workload to the gateway open-loop and waits for every
// request to end (or its Timeout). It returns an error only when ctx ends
// before the last request was sent.
func RunLoad(ctx context.Context, cfg LoadConfig) (*Result, error) {
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	client := cfg.Client
	if client == nil {
		client = newClient()
		defer client.CloseIdleConnections()
	}
	reqs := cfg.Workload.Requests
	res := &Result{Outcomes: make([]Outcome, len(reqs))}
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var err error
	for i := range reqs {
		at := start.Add(time.Duration(float64(reqs[i].Arrival) / cfg.Speed))
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.Outcomes[i] = send(ctx, client, cfg, i, &reqs[i])
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, err
}

// send sends one streaming completions request and reads its stream.
func send(ctx context.Context, client *http.Client, cfg LoadConfig, i int, r *workload.Request) Outcome {
	o := Outcome{Index: i, Priority: r.Priority}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	model := cfg.Model
	if r.Adapter != "" {
		model = r.Adapter
	}
	body := completionBody(model, r, uint64(i))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		o.Status, o.Err = Lost, err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	if r.Priority != 0 {
		req.Header.Set(router.HeaderPriority, strconv.Itoa(r.Priority))
	}
	o.Sent = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		o.Status, o.Err = Lost, err
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			o.Status = TimedOut
		}
		return o
	}
	defer resp.Body.Close()
	o.HTTPStatus = resp.StatusCode
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		o.Status, o.RetryAfter = Shed, resp.Header.Get("Retry-After")
		_, _ = io.Copy(io.Discard, resp.Body)
		return o
	case resp.StatusCode != http.StatusOK:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		o.Status, o.Err = Lost, fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return o
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	done := false
	for {
		line, rerr := br.ReadSlice('\n')
		if payload, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			payload = bytes.TrimRight(payload, "\r\n")
			switch {
			case string(payload) == "[DONE]":
				done = true
			case bytes.HasPrefix(payload, []byte(`{"error"`)):
				o.Status, o.Err = Cut, fmt.Errorf("error event: %s", payload)
				return o
			case hasText(payload):
				if o.Tokens == 0 {
					o.TTFT = time.Since(o.Sent)
				}
				o.Tokens++
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil && !errors.Is(rerr, bufio.ErrBufferFull) {
			o.Status, o.Err = Cut, rerr
			return o
		}
	}
	switch {
	case !done:
		o.Status, o.Err = Cut, errors.New("stream ended without [DONE]")
	case o.Tokens < r.OutputTokens:
		o.Status, o.Err = Truncated, fmt.Errorf("%d of %d tokens", o.Tokens, r.OutputTokens)
	default:
		o.Status = OK
	}
	return o
}

// hasText reports whether a completions chunk carries output text: a
// "text" field that is not the empty string. A finish chunk with empty
// text, as llm-d-inference-sim sends one after the last token
// (../shared/fixtures/openai/llm-d-inference-sim/completions-lora-stream.response.sse),
// carries no token.
func hasText(payload []byte) bool {
	_, v, ok := bytes.Cut(payload, []byte(`"text":`))
	if !ok {
		return false
	}
	v = bytes.TrimLeft(v, " \t")
	return !bytes.HasPrefix(v, []byte(`""`))
}

// completionBody returns a streaming /v1/completions body whose prompt is
// the request's content blocks as text: BytesPerToken bytes per token, so
// that a shared block prefix is a shared text prefix and the gateway's and
// the pods' prompt hashes see it. Tokens past the blocks get text unique to
// the request (seeded by uniq).
func completionBody(model string, r *workload.Request, uniq uint64) []byte {
	total := r.PromptTokens * prefix.BytesPerToken
	b := make([]byte, 0, total+256)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"prompt":"`...)
	start := len(b)
	bt := r.BlockTokens
	if bt <= 0 {
		bt = workload.DefaultBlockTokens
	}
	size := bt * prefix.BytesPerToken
	for _, id := range r.Blocks {
		if len(b)-start >= total {
			break
		}
		b = appendBlockText(b, id, min(size, total-(len(b)-start)))
	}
	for k := uint64(0); len(b)-start < total; k++ {
		b = appendBlockText(b, splitmix64(uniq<<20|k)^0x756e69717565, min(size, total-(len(b)-start)))
	}
	b = append(b, `","max_tokens":`...)
	b = strconv.AppendInt(b, int64(r.OutputTokens), 10)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
	return b
}

// filler is the text blocks are cut from after their tag: lower-case
// words, safe inside a JSON string.
const filler = "the router sends each request to the replica that holds its prefix and has room in its batch while the scraper reads queue depth and cache use from every pod "

// appendBlockText appends n bytes of the text of content block id: a tag of
// 16 letters spelling splitmix64(id) (distinct ids, distinct text), then
// filler from an offset chosen by the id.
func appendBlockText(dst []byte, id uint64, n int) []byte {
	h := splitmix64(id)
	for i := 0; i < 16 && n > 0; i++ {
		dst = append(dst, 'a'+byte(h>>(4*i))&0xf)
		n--
	}
	off := int(h % uint64(len(filler)))
	for n > 0 {
		k := min(n, len(filler)-off)
		dst = append(dst, filler[off:off+k]...)
		n -= k
		off = 0
	}
	return dst
}

// splitmix64 is the output function of Vigna's SplitMix64
// (https://prng.di.unimi.it/splitmix64.c), a bijection on uint64.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
