package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
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
	require.Eventually(t, func() bool { return answersOK(url + "/v1/models") },
		10*time.Second, 10*time.Millisecond)

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

// TestDemoSecondSignalEndsAtOnce: in demo mode too, the first SIGTERM
// starts the drain and a second one ends the process at once, by the
// signal's default action, instead of being swallowed until the stream in
// flight or the drain timeout ends.
func TestDemoSecondSignalEndsAtOnce(t *testing.T) {
	bin := gatewayBinary(t)
	addr := deadAddr(t)
	cmd := exec.Command(bin, "--demo", "-listen", addr)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	url := "http://" + addr
	require.Eventually(t, func() bool { return answersOK(url + "/v1/models") },
		20*time.Second, 20*time.Millisecond, "the demo serves: %s", out.String())

	// A stream far longer than the demo's drain timeout.
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2000}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	first, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "data: "), first)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "draining") }, 10*time.Second, 5*time.Millisecond)
	// The second signal, repeated until the process is gone: the first
	// may come before the drain has given the signal back its default.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
wait:
	for {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			break wait
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the process did not exit: %s", out.String())
		}
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM,
		"killed by the second SIGTERM, not exited after the drain (%v)", cmd.ProcessState)
}
