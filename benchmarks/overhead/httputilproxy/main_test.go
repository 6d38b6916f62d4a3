package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewProxyRoundRobin checks that the baseline forwards the body and
// alternates between its upstreams, so that it loads the backends the way
// nginx's round-robin upstream does.
func TestNewProxyRoundRobin(t *testing.T) {
	var hits [2]int
	var bodies []string
	backend := func(i int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			hits[i]++
			bodies = append(bodies, string(b))
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
	}
	b0, b1 := backend(0), backend(1)
	defer b0.Close()
	defer b1.Close()
	rp, err := newProxy([]string{strings.TrimPrefix(b0.URL, "http://"), strings.TrimPrefix(b1.URL, "http://")})
	require.NoError(t, err)
	front := httptest.NewServer(rp)
	defer front.Close()

	for i := 0; i < 6; i++ {
		resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `{"ok":true}`, string(b))
	}
	assert.Equal(t, [2]int{3, 3}, hits)
	for _, b := range bodies {
		assert.Equal(t, `{"model":"m"}`, b)
	}
}

func TestNewProxyRejectsBadUpstreams(t *testing.T) {
	_, err := newProxy(nil)
	assert.Error(t, err)
	_, err = newProxy([]string{"http://127.0.0.1:1/"})
	assert.Error(t, err)
	_, err = newProxy([]string{""})
	assert.Error(t, err)
}

// TestNewProxyDeadUpstream checks that a request to an upstream that
// refuses connections is answered 502, not left hanging.
func TestNewProxyDeadUpstream(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	rp, err := newProxy([]string{addr})
	require.NoError(t, err)
	front := httptest.NewServer(rp)
	defer front.Close()
	resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
}
