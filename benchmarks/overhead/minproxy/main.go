// Command minproxy is the overhead benchmark's floor for a Go proxy: the
// least a proxy served by net/http can do per request. It reads the body,
// writes it round-robin to a backend over a pooled keep-alive HTTP/1.1
// connection with a hand-written client, reads the answer's head and
// copies its body back: no JSON, no routing table, no scoring, no metrics.
//
// The gateway pays what minproxy pays plus the work of routing. Against
// nginx, run.sh's minproxy/nginx ratio is therefore the most any net/http
// gateway can reach on the machine, and the distance from minproxy to the
// gateway is what inferroute's own layers cost in place (parsing, prompt
// hashing, picking, the built-in client's checks, metrics). httputil, the
// other Go baseline, measures the standard library's heavier
// ReverseProxy and Transport instead.
//
// It forwards only what run.sh sends: POST bodies and answers framed by
// Content-Length. Anything else gets an error with the reason, never a
// silently wrong answer: 405 for another method, 413 for a body over
// 8 MiB, 502 for a chunked or unframed answer or a backend that cannot be
// reached.
//
// Usage:
//
//	minproxy -listen 127.0.0.1:18180 -upstreams 127.0.0.1:18101,127.0.0.1:18102
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxBody is the largest request body forwarded, nginx's
// client_max_body_size in run.sh.
const maxBody = 8 << 20

// maxPooled is the largest request buffer kept for reuse, so that one large
// body does not stay pinned in the pool.
const maxPooled = 1 << 20

// conn is one keep-alive connection to a backend.
type conn struct {
	nc net.Conn
	br *bufio.Reader
}

// upstream is one backend with a stack of idle connections: the most
// recently used is reused first, as in the gateway's client.
type upstream struct {
	addr string
	mu   sync.Mutex
	idle []*conn
}

// get returns an idle connection, or dials one when there is none or
// fresh is set; reused reports which.
func (u *upstream) get(fresh bool) (c *conn, reused bool, err error) {
	if !fresh {
		u.mu.Lock()
		if n := len(u.idle); n > 0 {
			c = u.idle[n-1]
			u.idle[n-1] = nil
			u.idle = u.idle[:n-1]
			u.mu.Unlock()
			return c, true, nil
		}
		u.mu.Unlock()
	}
	nc, err := net.DialTimeout("tcp", u.addr, 5*time.Second)
	if err != nil {
		return nil, false, err
	}
	return &conn{nc: nc, br: bufio.NewReaderSize(nc, 32<<10)}, false, nil
}

func (u *upstream) put(c *conn) {
	u.mu.Lock()
	u.idle = append(u.idle, c)
	u.mu.Unlock()
}

// proxy sends the n-th request to upstreams[n % len(upstreams)].
type proxy struct {
	ups  []*upstream
	next atomic.Uint64
	bufs sync.Pool // *bytes.Buffer: the request head and body
}

func newProxy(addrs []string) (*proxy, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no upstreams")
	}
	p := &proxy{bufs: sync.Pool{New: func() any { return new(bytes.Buffer) }}}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("upstream %q: want host:port", a)
		}
		p.ups = append(p.ups, &upstream{addr: a})
	}
	return p, nil
}

// errStale marks a failure on a reused connection before any answer byte:
// the backend closed it while idle, and one retry on a new connection is
// safe.
var errStale = errors.New("reused connection closed")

// head is what minproxy keeps of an answer's head.
type head struct {
	status      int
	length      int64
	contentType string
	close       bool
}

// ServeHTTP forwards a POST to the next backend and copies its answer
// back; any other method gets 405, since a HEAD answer's Content-Length
// announces a body that never comes.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "minproxy forwards POST only", http.StatusMethodNotAllowed)
		return
	}
	buf := p.bufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooled {
			p.bufs.Put(buf)
		}
	}()
	buf.Reset()
	// The request head, then the body after it: one write per request.
	buf.WriteString(r.Method)
	buf.WriteByte(' ')
	buf.WriteString(r.URL.RequestURI())
	buf.WriteString(" HTTP/1.1\r\nHost: ")
	u := p.ups[(p.next.Add(1)-1)%uint64(len(p.ups))]
	buf.WriteString(u.addr)
	if ct := r.Header.Get("Content-Type"); ct != "" {
		buf.WriteString("\r\nContent-Type: ")
		buf.WriteString(ct)
	}
	buf.WriteString("\r\nContent-Length: ")
	lenAt := buf.Len()
	buf.WriteString("0000000000\r\n\r\n") // patched below
	bodyAt := buf.Len()
	n, err := buf.ReadFrom(io.LimitReader(r.Body, maxBody+1))
	switch {
	case err != nil:
		http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
		return
	case n > maxBody:
		http.Error(w, "request body over 8 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	// Content-Length as ten digits: leading zeros are valid 1*DIGIT
	// (RFC 9110 §8.6), and the head needs no second copy.
	putDigits(buf.Bytes()[lenAt:bodyAt-4], buf.Len()-bodyAt)

	c, h, err := p.exchange(u, buf.Bytes())
	if err != nil {
		http.Error(w, "upstream "+u.addr+": "+err.Error(), http.StatusBadGateway)
		return
	}
	if h.contentType != "" {
		w.Header()["Content-Type"] = []string{h.contentType}
	}
	w.Header()["Content-Length"] = []string{strconv.FormatInt(h.length, 10)}
	w.WriteHeader(h.status)
	if _, err := io.CopyN(w, c.br, h.length); err != nil {
		// The client or the backend failed mid-body: the answer is cut
		// short against its Content-Length, which the client sees.
		_ = c.nc.Close()
		return
	}
	if h.close {
		_ = c.nc.Close()
		return
	}
	u.put(c)
}

// exchange writes req on a connection to u and reads the answer's head,
// retrying once on a new connection when a reused one turns out closed.
func (p *proxy) exchange(u *upstream, req []byte) (*conn, head, error) {
	fresh := false
	for {
		c, reused, err := u.get(fresh)
		if err != nil {
			return nil, head{}, err
		}
		h, err := roundTrip(c, req, reused)
		if err == nil {
			return c, h, nil
		}
		_ = c.nc.Close()
		if errors.Is(err, errStale) && !fresh {
			fresh = true
			continue
		}
		return nil, head{}, err
	}
}

// roundTrip writes req on c and reads the status line and header fields of
// the answer.
func roundTrip(c *conn, req []byte, reused bool) (head, error) {
	stale := func(err error) error {
		if reused {
			return fmt.Errorf("%w: %w", errStale, err)
		}
		return err
	}
	if _, err := c.nc.Write(req); err != nil {
		return head{}, stale(err)
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)) {
			return head{}, stale(err)
		}
		return head{}, err
	}
	h := head{length: -1}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return head{}, fmt.Errorf("malformed status line %q", line)
	}
	if h.status, err = strconv.Atoi(string(line[9:12])); err != nil || h.status < 100 {
		return head{}, fmt.Errorf("malformed status line %q", line)
	}
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return head{}, fmt.Errorf("reading the answer's head: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return head{}, fmt.Errorf("malformed header field %q", line)
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			n, err := strconv.ParseUint(string(v), 10, 62)
			if err != nil || (h.length >= 0 && int64(n) != h.length) {
				return head{}, fmt.Errorf("bad Content-Length %q", v)
			}
			h.length = int64(n)
		case bytes.EqualFold(k, []byte("Content-Type")):
			h.contentType = string(v)
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			return head{}, fmt.Errorf("transfer-encoding %q is not supported", v)
		case bytes.EqualFold(k, []byte("Connection")):
			h.close = bytes.EqualFold(v, []byte("close"))
		}
	}
	if h.length < 0 {
		return head{}, errors.New("answer without Content-Length is not supported")
	}
	return h, nil
}

// isReset reports whether err is a connection reset by the peer.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// putDigits writes n in decimal into all of dst, padded with leading
// zeros; n must fit.
func putDigits(dst []byte, n int) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte('0' + n%10)
		n /= 10
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18180", "address to serve on")
	upstreams := flag.String("upstreams", "127.0.0.1:18101,127.0.0.1:18102", "comma-separated host:port list of backends")
	flag.Parse()
	p, err := newProxy(strings.Split(*upstreams, ","))
	if err != nil {
		log.Fatal(err)
	}
	// The same server timeouts as examples/gateway's defaults, which cost
	// net/http a deadline update or two per request.
	srv := &http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
