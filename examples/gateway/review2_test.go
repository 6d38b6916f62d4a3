package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemoDrainsStreams: stopping the demo (Ctrl-C) drains the gateway
// like any other run: a stream in flight finishes, because the emulated
// pods it is served by stay up until the gateway has drained.
func TestDemoDrainsStreams(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- runDemo(ctx, ln, io.Discard, slog.New(slog.DiscardHandler)) }()
	require.Eventually(t, func() bool {
		r, err := http.Get(url + "/v1/models")
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)

	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"llama","messages":[{"role":"user","content":"Count users by country"}],"stream":true,"max_tokens":40}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "data: "), first)

	cancel() // Ctrl-C
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream completed during the drain: %q", rest)
	select {
	case err := <-errc:
		assert.NoError(t, err, "a clean drain")
	case <-time.After(30 * time.Second):
		t.Fatal("the demo did not stop")
	}
}
