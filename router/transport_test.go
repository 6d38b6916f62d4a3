package router

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// overTransport prefixes the names of the tests in which newEnv builds
// proxies on NewTransport() rather than the built-in client.
const overTransport = "TestProxyOverNetHTTPTransport/"

// envsOverTransport counts the proxies newEnv built on NewTransport().
var envsOverTransport atomic.Int64

// TestProxyOverNetHTTPTransport runs the proxy's end-to-end tests again
// with Config.Transport set to NewTransport(), the path of HTTPS and
// HTTP/2 upstreams: retries, streaming, mid-stream failures, client
// disconnects, errors and header handling must not depend on which client
// reaches the endpoints.
func TestProxyOverNetHTTPTransport(t *testing.T) {
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"NonStreaming", TestProxyNonStreaming},
		{"StreamingFlushesEachEvent", TestProxyStreamingFlushesEachEvent},
		{"ModelRewrite", TestProxyModelRewrite},
		{"Retries", TestProxyRetries},
		{"MidStreamFailure", TestProxyMidStreamFailure},
		{"ClientDisconnect", TestProxyClientDisconnect},
		{"Errors", TestProxyErrors},
		{"HeaderSpoofing", TestProxyHeaderSpoofing},
		{"PoolHeader", TestProxyPoolHeader},
		{"Tracing", TestProxyTracing},
		{"FallbackRoute", TestProxyFallbackRoute},
		{"ConcurrentStreams", TestProxyConcurrentStreams},
	} {
		before := envsOverTransport.Load()
		t.Run(tc.name, tc.test)
		require.Greater(t, envsOverTransport.Load(), before, "%s built no proxy on NewTransport", tc.name)
	}
}

// tlsSeen is what a TLS backend saw of a request.
type tlsSeen struct {
	tls   bool
	proto int
	body  string
}

// tlsBackend is an HTTPS backend (HTTP/2 offered by ALPN) answering with
// h, and a client TLS configuration that trusts it.
func tlsBackend(t *testing.T, h http.HandlerFunc) (addr string, trust *tls.Config, got chan tlsSeen) {
	t.Helper()
	got = make(chan tlsSeen, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- tlsSeen{tls: r.TLS != nil, proto: r.ProtoMajor, body: string(b)}
		h(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	trust = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	return srv.Listener.Addr().String(), trust, got
}

func TestProxyHTTPSUpstream(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`

	t.Run("HTTP/1.1 over TLS with the transport's roots", func(t *testing.T) {
		addr, trust, got := tlsBackend(t, jsonHandler(200, ok, nil))
		tr := NewTransport()
		tr.TLSClientConfig = trust
		t.Cleanup(tr.CloseIdleConnections)
		e := newEnv(t, Config{Transport: tr, UpstreamScheme: "https"}, addr)
		r := e.post(t, "/v1/chat/completions", body, nil)
		require.Equal(t, 200, r.StatusCode)
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.Equal(t, string(ok), string(b))
		s := <-got
		assert.True(t, s.tls, "the request reached the endpoint over TLS")
		assert.Equal(t, 1, s.proto, "NewTransport speaks HTTP/1.1")
		assert.Equal(t, body, s.body)
		o := e.rec.next(t)
		assert.NoError(t, o.out.Err)
		assert.Equal(t, 377, o.out.CompletionTokens, "usage is read over TLS too")
		e.requireIdle(t)
	})

	t.Run("a stream over HTTP/2", func(t *testing.T) {
		addr, trust, got := tlsBackend(t, sseHandler(events, nil, nil))
		tr := NewTransport()
		tr.TLSClientConfig = trust
		tr.ForceAttemptHTTP2 = true
		t.Cleanup(tr.CloseIdleConnections)
		e := newEnv(t, Config{Transport: tr, UpstreamScheme: "https"}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"sql-lora","stream":true}`, nil)
		require.Equal(t, 200, r.StatusCode)
		assert.Equal(t, "text/event-stream", r.Header.Get("Content-Type"))
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.Equal(t, strings.Join(events, ""), string(b), "every event relayed, in order")
		assert.Equal(t, 2, (<-got).proto, "the transport negotiated HTTP/2")
		o := e.rec.next(t)
		assert.NoError(t, o.out.Err)
		assert.False(t, o.out.Buffered)
		e.requireIdle(t)
	})

	t.Run("without a Transport the system roots reject an unknown CA", func(t *testing.T) {
		untrusted, _, got := tlsBackend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{UpstreamScheme: "https"}, untrusted)
		require.Nil(t, e.proxy.h1, "https needs a net/http transport")
		r := e.post(t, "/v1/chat/completions", body, nil)
		requireAPIError(t, r, 502, "upstream_unreachable")
		assert.Empty(t, got, "no request completed on an unverified connection")
		o := e.rec.next(t)
		assert.True(t, o.out.ConnectError)
		assert.ErrorContains(t, o.out.Err, "certificate")
		assert.False(t, e.eps[0].Healthy(), "a failed handshake marks the endpoint down")
		e.requireIdle(t)
	})

	t.Run("without the scheme no TLS is attempted", func(t *testing.T) {
		addr, _, got := tlsBackend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, addr)
		r := e.post(t, "/v1/chat/completions", body, nil)
		b, _ := io.ReadAll(r.Body)
		assert.Equal(t, 400, r.StatusCode, "the TLS server's answer to plain HTTP is relayed")
		assert.Contains(t, string(b), "HTTP request to an HTTPS server")
		assert.Empty(t, got)
	})
}

func TestNewProxyUpstreamScheme(t *testing.T) {
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t), Models: []string{"m"}}}})
	require.NoError(t, err)
	for _, scheme := range []string{"", "http", "https"} {
		p, err := NewProxy(tab, Config{UpstreamScheme: scheme})
		require.NoError(t, err, "%q", scheme)
		assert.Equal(t, scheme == "https", p.h1 == nil, "%q: the built-in client serves plain http only", scheme)
	}
	for _, scheme := range []string{"HTTP", "ftp", "https://", "h2c"} {
		_, err := NewProxy(tab, Config{UpstreamScheme: scheme})
		assert.ErrorContains(t, err, "upstream scheme", "%q", scheme)
	}
}
