package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func hostPort(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

func post(t *testing.T, url, body string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions?x=1", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// TestRoundRobin checks that the floor forwards method, path, query, body
// and content type, answers with the backend's status, type and body, and
// alternates between its upstreams over reused connections, as nginx's
// round-robin upstream with keepalive does in run.sh.
func TestRoundRobin(t *testing.T) {
	var hits [2]atomic.Int32
	var conns atomic.Int32
	backend := func(i int) *httptest.Server {
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			hits[i].Add(1)
			assert.Equal(t, http.MethodPost, r.Method)
			assert.Equal(t, "/v1/chat/completions?x=1", r.RequestURI)
			assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
			assert.Equal(t, int64(len(b)), r.ContentLength)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"echo":`+string(b)+`}`)
		}))
		s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
		s.Start()
		return s
	}
	b0, b1 := backend(0), backend(1)
	defer b0.Close()
	defer b1.Close()
	p, err := newProxy([]string{hostPort(b0), hostPort(b1)})
	require.NoError(t, err)
	front := httptest.NewServer(p)
	defer front.Close()

	for i := range 6 {
		body := `{"n":` + strings.Repeat("7", i+1) + `}`
		code, got, h := post(t, front.URL, body)
		assert.Equal(t, http.StatusCreated, code)
		assert.Equal(t, `{"echo":`+body+`}`, got)
		assert.Equal(t, "application/json", h.Get("Content-Type"))
	}
	assert.Equal(t, int32(3), hits[0].Load())
	assert.Equal(t, int32(3), hits[1].Load())
	assert.Equal(t, int32(2), conns.Load(), "one keep-alive connection per backend")
}

// TestRetriesStaleConnection checks that a pooled connection the backend
// closed while it was idle costs one retry on a new connection, not an
// error.
func TestRetriesStaleConnection(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer be.Close()
	p, err := newProxy([]string{hostPort(be)})
	require.NoError(t, err)
	front := httptest.NewServer(p)
	defer front.Close()

	code, body, _ := post(t, front.URL, "{}")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body)
	be.CloseClientConnections() // the pooled connection dies while idle
	code, body, _ = post(t, front.URL, "{}")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok", body)
}

// rawBackend answers every request on every connection with answer.
func rawBackend(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.WriteString(c, answer)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestRefusesWhatItCannotFrame checks the 502s and the 413: the floor
// forwards only Content-Length answers and bodies up to 8 MiB, and says so
// instead of passing on a wrong answer.
func TestRefusesWhatItCannotFrame(t *testing.T) {
	cases := []struct {
		name, answer, want string
	}{
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "transfer-encoding"},
		{"unframed", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nok", "without Content-Length"},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "bad Content-Length"},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "bad Content-Length"},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", "malformed status line"},
		{"cut head", "HTTP/1.1 200 OK\r\nContent-Len", "reading the answer's head"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newProxy([]string{rawBackend(t, tc.answer)})
			require.NoError(t, err)
			front := httptest.NewServer(p)
			defer front.Close()
			code, body, _ := post(t, front.URL, "{}")
			assert.Equal(t, http.StatusBadGateway, code)
			assert.Contains(t, body, tc.want)
		})
	}

	t.Run("down", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		p, err := newProxy([]string{addr})
		require.NoError(t, err)
		front := httptest.NewServer(p)
		defer front.Close()
		code, body, _ := post(t, front.URL, "{}")
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Contains(t, body, "refused")
	})

	t.Run("too large", func(t *testing.T) {
		p, err := newProxy([]string{rawBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")})
		require.NoError(t, err)
		front := httptest.NewServer(p)
		defer front.Close()
		code, _, _ := post(t, front.URL, strings.Repeat("x", maxBody+1))
		assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	})
}

func TestPostOnly(t *testing.T) {
	p, err := newProxy([]string{rawBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")})
	require.NoError(t, err)
	front := httptest.NewServer(p)
	defer front.Close()
	resp, err := http.Head(front.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodPost, resp.Header.Get("Allow"))
}

func TestNewProxyRejectsBadUpstreams(t *testing.T) {
	_, err := newProxy(nil)
	assert.Error(t, err)
	_, err = newProxy([]string{"http://127.0.0.1:1/"})
	assert.Error(t, err)
}

func TestPutDigits(t *testing.T) {
	b := make([]byte, 10)
	putDigits(b, 1024)
	assert.Equal(t, "0000001024", string(b))
}
