package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawServer is a TCP server that reads HTTP/1.1 requests with net/http's
// parser and answers each with a scripted raw response, so that the
// client's framing can be checked byte for byte.
type rawServer struct {
	ln    net.Listener
	conns atomic.Int32

	mu   sync.Mutex
	open []net.Conn
	reqs []*http.Request
	body []string

	// respond returns the raw response to the n-th request (from 0) and
	// whether to close the connection after writing it.
	respond func(n int, r *http.Request) (raw string, closeAfter bool)
	wg      sync.WaitGroup
}

func newRawServer(t *testing.T, respond func(n int, r *http.Request) (string, bool)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &rawServer{ln: ln, respond: respond}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) addr() string { return s.ln.Addr().String() }

func (s *rawServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		s.mu.Lock()
		s.open = append(s.open, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.handle(c)
	}
}

func (s *rawServer) handle(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, r)
		s.body = append(s.body, string(b))
		s.mu.Unlock()
		raw, closeAfter := s.respond(n, r)
		if raw == "" {
			// No answer: wait for the client to go away.
			_, _ = io.Copy(io.Discard, br)
			return
		}
		if _, err := io.WriteString(c, raw); err != nil || closeAfter {
			return
		}
	}
}

func (s *rawServer) request(i int) (*http.Request, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[i], s.body[i]
}

func postTo(addr, body string) *h1Request {
	return &h1Request{
		method: http.MethodPost, addr: addr, path: "/v1/chat/completions",
		header: http.Header{"Content-Type": {"application/json"}}, body: []byte(body), sendLength: true,
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

func TestH1ClientFraming(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		raw       string
		status    int
		body      string
		length    int64
		header    http.Header // expected subset of the response header
		absent    []string    // header keys that must not be there
		reuse     bool        // a second request reuses the connection
		chunkedTE bool
		close     bool // the server closes the connection after the response
	}{
		{
			name:   "content-length",
			raw:    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
			status: 200, body: `{"ok":true}`, length: 11,
			header: http.Header{"Content-Type": {"application/json"}}, reuse: true,
		},
		{
			name:   "chunked with trailer",
			raw:    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
			status: 200, body: "data: hello", length: -1, reuse: true, chunkedTE: true,
		},
		{
			name:   "until close",
			raw:    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
			status: 200, body: "until the end", length: -1, reuse: false, close: true,
		},
		{
			name:   "connection close",
			raw:    "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
			status: 200, body: "ok", length: 2, reuse: false,
		},
		{
			name:   "http/1.0 without keep-alive",
			raw:    "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
			status: 200, body: "ok", length: 2, reuse: false,
		},
		{
			name:   "http/1.0 keep-alive",
			raw:    "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
			status: 200, body: "ok", length: 2, reuse: true,
		},
		{
			// HTTP/1.0 has no chunked coding (RFC 9112 section 6.1): read
			// to the close, as net/http does (found by FuzzUpstreamResponse).
			name:   "http/1.0 with transfer-encoding",
			raw:    "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			status: 200, body: "2\r\nok\r\n0\r\n\r\n", length: -1, absent: []string{"Transfer-Encoding"}, reuse: false, close: true,
		},
		{
			name:   "folded header with an empty first line",
			raw:    "HTTP/1.1 200 OK\r\nX-Fold:\r\n  folded\r\nX-Empty: a\r\n \r\nContent-Length: 2\r\n\r\nok",
			status: 200, body: "ok", length: 2, header: http.Header{"X-Fold": {"folded"}, "X-Empty": {"a "}}, reuse: true,
		},
		{
			name:   "interim 100 continue",
			raw:    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nyes",
			status: 201, body: "yes", length: 3, reuse: true,
		},
		{
			name:   "no content",
			raw:    "HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n",
			status: 204, body: "", length: 0, header: http.Header{"X-A": {"b"}}, reuse: true,
		},
		{
			name:   "head has no body",
			method: http.MethodHead,
			raw:    "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
			status: 200, body: "", length: -1, reuse: true,
		},
		{
			name: "lower-case keys, repeated fields, folding, bare LF",
			raw: "HTTP/1.1 200 OK\ncontent-type: application/json\nx-request-id: abc\nset-cookie: a=1\nset-cookie: b=2\n" +
				"x-folded: one\n  two\ncontent-length: 2\n\nok",
			status: 200, body: "ok", length: 2, reuse: true,
			header: http.Header{
				"Content-Type": {"application/json"}, "X-Request-Id": {"abc"},
				"Set-Cookie": {"a=1", "b=2"}, "X-Folded": {"one two"},
			},
		},
		{
			name:   "transfer-encoding overrides content-length",
			raw:    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			status: 200, body: "ok", length: -1, absent: []string{"Content-Length"}, reuse: false, chunkedTE: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) { return tt.raw, tt.close })
			cl := newH1Client()
			for i := range 2 {
				req := postTo(s.addr(), `{"model":"m"}`)
				if tt.method != "" {
					req.method, req.body, req.sendLength = tt.method, nil, false
				}
				resp, err := cl.do(context.Background(), req)
				require.NoError(t, err, "request %d", i)
				assert.Equal(t, tt.status, resp.StatusCode)
				assert.Equal(t, tt.length, resp.ContentLength)
				for k, v := range tt.header {
					assert.Equal(t, v, resp.Header[k], k)
				}
				for _, k := range tt.absent {
					assert.NotContains(t, resp.Header, k)
				}
				if tt.chunkedTE {
					assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
				}
				assert.Equal(t, tt.body, readAll(t, resp))
			}
			want := int32(2)
			if tt.reuse {
				want = 1
			}
			assert.Equal(t, want, s.conns.Load(), "connections opened for two requests")
		})
	}
}

func TestH1ClientMalformedResponses(t *testing.T) {
	// protocol: the error is ErrUpstreamProtocol (the server answered
	// garbage), not a pod that died mid-answer.
	tests := []struct {
		name, raw, err string
		protocol       bool
	}{
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", "malformed status line", true},
		{"http/2 preface", "HTTP/2 200\r\n\r\n", "unsupported protocol", true},
		{"bad code", "HTTP/1.1 2000 OK\r\n\r\n", "malformed status code", true},
		{"bad header line", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed response header line", true},
		{"bad content-length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length", true},
		{"signed content-length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "malformed Content-Length", true},
		{"overflowing content-length", "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\n", "malformed Content-Length", true},
		{"conflicting content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "conflicting Content-Length", true},
		{"cut in the headers", "HTTP/1.1 200 OK\r\nContent-", "unexpected EOF", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) { return tt.raw, true })
			_, err := newH1Client().do(context.Background(), postTo(s.addr(), "{}"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.err)
			if tt.protocol {
				assert.ErrorIs(t, err, ErrUpstreamProtocol)
			} else {
				assert.NotErrorIs(t, err, ErrUpstreamProtocol, "a pod that dies mid-answer is not sending garbage")
			}
		})
	}
}

func TestH1ClientTruncatedBodies(t *testing.T) {
	tests := []struct {
		name, raw string
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) { return tt.raw, true })
			resp, err := newH1Client().do(context.Background(), postTo(s.addr(), "{}"))
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			require.NoError(t, resp.Body.Close())
		})
	}
}

func TestH1ClientWritesRequest(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false
	})
	cl := newH1Client()
	big := strings.Repeat("x", 100<<10) // past the single-write size: written with writev
	tests := []struct {
		name string
		req  h1Request
	}{
		{"small post", h1Request{method: http.MethodPost, path: "/v1/completions", query: "a=1&b=%20",
			header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}}, body: []byte(`{"model":"m"}`), sendLength: true}},
		{"large post", h1Request{method: http.MethodPost, path: "/v1/chat/completions",
			header: http.Header{"Content-Type": {"application/json"}}, body: []byte(big), sendLength: true}},
		{"empty post", h1Request{method: http.MethodPost, path: "/v1/x", header: http.Header{}, sendLength: true}},
		{"get", h1Request{method: http.MethodGet, path: "", header: http.Header{}}},
		{"endpoint header replaces the client's", h1Request{method: http.MethodPost, path: "/v1/x",
			header: http.Header{http.CanonicalHeaderKey(HeaderDestination): {"10.0.0.1:1"}}, extraKey: http.CanonicalHeaderKey(HeaderDestination),
			extraValue: "127.0.0.1:2", body: []byte("{}"), sendLength: true}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.addr = s.addr()
			resp, err := cl.do(context.Background(), &req)
			require.NoError(t, err)
			readAll(t, resp)
			got, body := s.request(i)
			assert.Equal(t, req.method, got.Method)
			wantURI := req.path
			if wantURI == "" {
				wantURI = "/"
			}
			if req.query != "" {
				wantURI += "?" + req.query
			}
			assert.Equal(t, wantURI, got.RequestURI)
			assert.Equal(t, s.addr(), got.Host)
			assert.Equal(t, string(req.body), body)
			if req.sendLength || len(req.body) > 0 {
				assert.Equal(t, int64(len(req.body)), got.ContentLength)
			} else {
				assert.Empty(t, got.Header.Get("Content-Length"))
			}
			for k, v := range req.header {
				if k == req.extraKey {
					continue
				}
				assert.Equal(t, v, got.Header[k], k)
			}
			if req.extraKey != "" {
				assert.Equal(t, []string{req.extraValue}, got.Header[req.extraKey])
			}
		})
	}
	assert.Equal(t, int32(1), s.conns.Load(), "one keep-alive connection for every request")
}

func TestH1ClientRetriesStaleConnection(t *testing.T) {
	// The server answers once per connection and closes it without saying
	// so, like a server whose keep-alive timeout passed while the
	// connection sat idle in the pool.
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true
	})
	cl := newH1Client()
	for i := range 3 {
		resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
		require.NoError(t, err, "request %d", i)
		assert.Equal(t, "ok", readAll(t, resp))
	}
	assert.Equal(t, int32(3), s.conns.Load())
}

func TestH1ClientNoRetryOnFreshConnection(t *testing.T) {
	// Close the listener's connections as soon as they are accepted: a new
	// connection that fails is an error, not a retry.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	_, err = newH1Client().do(context.Background(), postTo(ln.Addr().String(), "{}"))
	require.Error(t, err)
	assert.ErrorIs(t, err, errNoResponse)
}

func TestH1ClientCancel(t *testing.T) {
	got := make(chan struct{})
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		close(got)
		return "", false // never answers
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := ErrUpstreamTimeout
	go func() {
		<-got
		cancel(cause)
	}()
	_, err := newH1Client().do(ctx, postTo(s.addr(), "{}"))
	assert.ErrorIs(t, err, cause)
}

func TestH1ClientCancelDuringBody(t *testing.T) {
	// The response starts, then stalls: cancelling the context ends the
	// body read and the connection is not pooled.
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", false
	})
	cl := newH1Client()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := cl.do(ctx, postTo(s.addr(), "{}"))
	require.NoError(t, err)
	buf := make([]byte, 7)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	cancel()
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err)
	require.NoError(t, resp.Body.Close())
	assertNotPooled(t, cl, s.addr())
}

// assertNotPooled checks that cl holds no idle connection to addr.
func assertNotPooled(t *testing.T, cl *h1Client, addr string) {
	t.Helper()
	h := cl.host(addr)
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Empty(t, h.idle, "no connection to %s is pooled", addr)
}

func TestH1ClientEarlyCloseDropsConnection(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false
	})
	cl := newH1Client()
	for range 2 {
		resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close()) // unread: the connection cannot be reused
	}
	assert.Equal(t, int32(2), s.conns.Load())
}

func TestH1ClientIdlePool(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	cl := newH1Client()
	cl.maxIdle = 2
	ctx := context.Background()
	// Three responses in flight at once need three connections; the pool
	// keeps two of them once they are read.
	var resps []*http.Response
	for range 3 {
		resp, err := cl.do(ctx, postTo(s.addr(), "{}"))
		require.NoError(t, err)
		resps = append(resps, resp)
	}
	for _, r := range resps {
		assert.Equal(t, "ok", readAll(t, r))
	}
	assert.Equal(t, int32(3), s.conns.Load())
	h := cl.host(s.addr())
	h.mu.Lock()
	assert.Len(t, h.idle, 2)
	// Age the bottom connection past the idle timeout: expire closes it
	// and keeps the other.
	h.idle[0].idleSince = time.Now().Add(-2 * cl.idleTimeout)
	h.mu.Unlock()
	cl.expire(h)
	h.mu.Lock()
	assert.Len(t, h.idle, 1)
	// A connection past its idle time is not handed out again.
	h.idle[0].idleSince = time.Now().Add(-2 * cl.idleTimeout)
	h.mu.Unlock()
	resp, err := cl.do(ctx, postTo(s.addr(), "{}"))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, int32(4), s.conns.Load())
}

// TestFieldKey checks fieldKey against net/http: the canonical form of
// every valid name (interned or not, short or past the stack buffer), and
// refusal of what is not a token.
func TestFieldKey(t *testing.T) {
	tests := []struct{ in, want string }{
		{"content-type", "Content-Type"},
		{"Content-Type", "Content-Type"},
		{"CONTENT-LENGTH", "Content-Length"},
		{"x-request-id", "X-Request-Id"},
		{"x-custom_field", "X-Custom_field"},
		{"a", "A"},
		{"X-Custom_Field", "X-Custom_field"},
		{"x--a", "X--A"},
		{strings.Repeat("ab-", 30) + "z", http.CanonicalHeaderKey(strings.Repeat("ab-", 30) + "z")},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := fieldKey(tt.in)
			assert.True(t, ok)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, http.CanonicalHeaderKey(tt.in), got, "same as net/http")
		})
	}
	for _, bad := range []string{"", "X Forwarded", "x-a:b", "x-\x00", "caf\xc3\xa9", "(x)", "a\tb"} {
		got, ok := fieldKey(bad)
		assert.False(t, ok, "%q", bad)
		assert.Equal(t, bad, got, "an invalid name is returned as it is")
	}
}

// FuzzFieldKey checks fieldKey against validFieldName and
// http.CanonicalHeaderKey for any string.
func FuzzFieldKey(f *testing.F) {
	for _, s := range []string{"content-type", "X-Request-Id", "x_y", "", "a b", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		got, ok := fieldKey(k)
		if ok != validFieldName(k) {
			t.Fatalf("fieldKey(%q) valid = %v, validFieldName says %v", k, ok, !ok)
		}
		want := k
		if ok {
			want = http.CanonicalHeaderKey(k)
		}
		if got != want {
			t.Fatalf("fieldKey(%q) = %q, want %q", k, got, want)
		}
	})
}

func TestMediaType(t *testing.T) {
	tests := []struct{ in, want string }{
		{"application/json", "application/json"},
		{"application/json; charset=utf-8", "application/json"},
		{" Text/Event-Stream ;charset=utf-8", "text/event-stream"},
		{"", ""},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, mediaType(tt.in), tt.in)
	}
}

func TestParseLength(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"350", 350, true},
		{"0350", 350, true},
		{"999999999999999999", 999999999999999999, true},
		{"", 0, false},
		{"+350", 0, false},
		{"-1", 0, false},
		{"3 5", 0, false},
		{"0x10", 0, false},
		{"1000000000000000000", 0, false}, // 19 digits: refused rather than risk overflow
	} {
		n, ok := parseLength(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, n, "%q", tc.in)
	}
	assert.True(t, isLength([]string{"350"}, 350))
	assert.False(t, isLength([]string{"350"}, 351))
	assert.False(t, isLength([]string{"350", "350"}, 350))
	assert.False(t, isLength(nil, 0))
}

// watchCountingCtx counts the context.AfterFunc registrations on it:
// context.AfterFunc defers to a context's own AfterFunc method when it
// cannot see a cancelCtx through Value, which this one hides.
type watchCountingCtx struct {
	context.Context
	n atomic.Int32
}

func newWatchCountingCtx(t *testing.T) (*watchCountingCtx, context.CancelFunc) {
	parent, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &watchCountingCtx{Context: parent}, cancel
}

func (c *watchCountingCtx) AfterFunc(f func()) func() bool {
	c.n.Add(1)
	return context.AfterFunc(c.Context, f)
}

func (c *watchCountingCtx) Value(any) any { return nil }

// TestH1ClientWatchesSlowExchangesOnly: an exchange answered within
// watchPeriod never registers with its context; one that takes longer is
// not cut by the period's deadline, goes on watched by an AfterFunc, and
// leaves its connection reusable; watchNow registers at once, and clears a
// deadline left by an earlier exchange.
func TestH1ClientWatchesSlowExchangesOnly(t *testing.T) {
	const answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	s := newRawServer(t, func(n int, _ *http.Request) (string, bool) {
		if n == 2 || n == 4 {
			time.Sleep(3 * watchPeriod)
		}
		return answer, false
	})
	cl := newH1Client()
	ctx, _ := newWatchCountingCtx(t)
	exchange := func(req *h1Request) {
		t.Helper()
		resp, err := cl.do(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, "ok", readAll(t, resp))
	}
	// Dial with another context: net.Dialer registers with the one it has.
	resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, resp))
	time.Sleep(2 * watchPeriod) // idle past the deadline the connection still carries
	exchange(postTo(s.addr(), "{}"))
	assert.Zero(t, ctx.n.Load(), "an exchange answered at once is not registered")
	exchange(postTo(s.addr(), "{}"))
	assert.Equal(t, int32(1), ctx.n.Load(), "an exchange past the watch period is registered")
	time.Sleep(2 * watchPeriod) // idle past a deadline the connection may still carry
	exchange(postTo(s.addr(), "{}"))
	assert.Equal(t, int32(1), ctx.n.Load())
	assert.Equal(t, int32(1), s.conns.Load(), "one connection served all four")
	// The connection still carries the deadline of the exchange before:
	// watched from the start, a slow exchange must not be cut by it.
	req := postTo(s.addr(), "{}")
	req.watchNow = true
	exchange(req)
	assert.Equal(t, int32(2), ctx.n.Load(), "watchNow registers from the start")
	assert.Equal(t, int32(1), s.conns.Load())
}

// TestH1ClientCancelAfterWatchPeriod: once the watch period has passed, a
// stalled body read is cut when the context ends (there is no deadline any
// more: only the AfterFunc can end it), and the connection is not pooled.
func TestH1ClientCancelAfterWatchPeriod(t *testing.T) {
	s := newRawServer(t, func(n int, _ *http.Request) (string, bool) {
		if n == 0 {
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", false
	})
	cl := newH1Client()
	// Dial with another context: net.Dialer registers with the one it has.
	resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, resp))
	ctx, cancel := newWatchCountingCtx(t)
	resp, err = cl.do(ctx, postTo(s.addr(), "{}"))
	require.NoError(t, err)
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		read <- err
	}()
	require.Eventually(t, func() bool { return ctx.n.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the stalled read outlives the watch period and registers")
	select {
	case err := <-read:
		t.Fatalf("the read ended before the context did: %v", err)
	case <-time.After(watchPeriod):
	}
	cancel()
	select {
	case err := <-read:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling the context did not end the read")
	}
	require.NoError(t, resp.Body.Close())
	assertNotPooled(t, cl, s.addr())
}

// TestH1ClientWriteOutlivesWatchPeriod: a request body that the server
// leaves unread past the watch period (more than the socket buffers hold)
// is written to its end, not cut by the period's deadline.
func TestH1ClientWriteOutlivesWatchPeriod(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan int, 2)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := range 2 {
			if i == 1 {
				// Stall once the body starts to arrive, so that the write
				// outlives the period however late the client sends it.
				if _, err := br.Peek(1); err != nil {
					got <- -1
					return
				}
				time.Sleep(3 * watchPeriod)
			}
			r, err := http.ReadRequest(br)
			if err != nil {
				got <- -1
				return
			}
			n, _ := io.Copy(io.Discard, r.Body)
			got <- int(n)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}()
	cl := newH1Client()
	// Dial with another context: net.Dialer registers with the one it has.
	resp, err := cl.do(context.Background(), postTo(ln.Addr().String(), "{}"))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, resp))
	require.Equal(t, 2, <-got)
	body := strings.Repeat("x", 32<<20)
	ctx, _ := newWatchCountingCtx(t)
	resp, err = cl.do(ctx, postTo(ln.Addr().String(), body))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, resp))
	assert.Equal(t, len(body), <-got, "the server read the whole body")
	assert.Equal(t, int32(1), ctx.n.Load(), "the write outlived the watch period")
}
