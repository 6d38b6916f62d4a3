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

	"github.com/inferroute/inferroute/benchmarks/emulator"
)

func TestDemo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuf
	errc := make(chan error, 1)
	go func() { errc <- runDemo(ctx, ln, &out, slog.New(slog.DiscardHandler)) }()

	require.Eventually(t, func() bool { return answersOK(url + "/v1/models") },
		10*time.Second, 10*time.Millisecond)
	printed := out.String()
	for _, want := range []string{"h100-0", "a100-1", "l4-2", "l4-3", "curl -si " + url + "/v1/completions", "curl -sN " + url + "/v1/chat/completions"} {
		assert.Contains(t, printed, want)
	}

	tests := []struct {
		name, path, body string
		stream           bool
		model            string
	}{
		{"completion by alias", "/v1/completions", `{"model":"llama","prompt":"Say hello","max_tokens":8}`, false, "llama"},
		{"streaming chat on an adapter", "/v1/chat/completions",
			`{"model":"sql-lora","messages":[{"role":"user","content":"Count users by country"}],"stream":true,"max_tokens":5}`, true, "sql-lora"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(url+tt.path, "application/json", strings.NewReader(tt.body))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Regexp(t, `^(h100-0|a100-1|l4-2|l4-3)$`, resp.Header.Get(emulator.HeaderPod))
			if !tt.stream {
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				assert.Contains(t, string(b), `"model":"`+tt.model+`"`, "the alias is rewritten back")
				assert.Contains(t, string(b), `"completion_tokens":8`)
				return
			}
			var data []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if s, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					data = append(data, s)
				}
			}
			require.NoError(t, sc.Err())
			// Role chunk, 5 content chunks, [DONE].
			require.Len(t, data, 7)
			assert.Equal(t, "[DONE]", data[6])
			assert.Contains(t, data[1], `"model":"sql-lora"`)
		})
	}

	cancel()
	select {
	case err := <-errc:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the demo did not stop")
	}
}

func TestDemoConfig(t *testing.T) {
	f, err := emulator.StartFleet(context.Background(), []emulator.Options{
		{Name: "a", Lifetime: time.Minute}, {Name: "b", Profile: "l4-llama3-8b", Lifetime: time.Minute},
	})
	require.NoError(t, err)
	defer f.Close()
	cfg := demoConfig(f, "127.0.0.1:9")
	require.Len(t, cfg.Pools, 1)
	p := cfg.Pools[0]
	assert.Equal(t, []string{emulator.DefaultModel}, p.Models)
	assert.Equal(t, map[string]string{"sql-lora": emulator.DefaultModel, "chat-lora": emulator.DefaultModel}, p.Adapters)
	assert.Equal(t, map[string]string{"llama": emulator.DefaultModel}, p.Aliases)
	assert.Nil(t, p.Picker, "the default picker")
	require.Len(t, p.Endpoints, 2)
	assert.Equal(t, f.Pods[1].Addr(), p.Endpoints[1].Address)
	assert.Equal(t, "l4-llama3-8b", p.Endpoints[1].Labels["inferroute.io/gpu"])
	assert.Equal(t, "127.0.0.1:9", cfg.Listen)
}
