package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferroute/inferroute/internal/rawio"
)

// Defaults of the built-in upstream client (Config.Transport nil).
const (
	// DefaultMaxIdleConnsPerHost is how many idle keep-alive connections
	// the built-in client keeps per endpoint. It must be at least the
	// number of requests in flight to one endpoint, or connections are
	// closed and opened again under load.
	DefaultMaxIdleConnsPerHost = 1024
	// DefaultIdleConnTimeout closes a keep-alive connection idle this long.
	// It is shorter than uvicorn's default keep-alive timeout of 5 s
	// (uvicorn's settings documentation, --timeout-keep-alive), under which
	// vLLM and SGLang serve, so that the client rarely sends on a connection
	// the server is closing; when it does, the request is sent again once
	// on a new connection.
	DefaultIdleConnTimeout = 4 * time.Second
	// maxResponseHeaderBytes bounds a response's status line and headers.
	maxResponseHeaderBytes = 1 << 20
)

// errStaleConn marks a failure on a reused keep-alive connection before any
// response byte arrived: the server had closed it while idle, so the
// request is sent again on a new connection.
var errStaleConn = errors.New("inferroute router: keep-alive connection closed by the server")

// h1Client is the Proxy's default upstream client: HTTP/1.1 over plain TCP
// with a keep-alive pool per endpoint address. Model servers (vLLM, SGLang,
// TGI, TensorRT-LLM) speak HTTP/1.1 on their OpenAI port, and a proxy that
// already holds the whole request body needs less than net/http.Transport
// does: the request is written by the calling goroutine in one write (or
// one writev for a large body: headers and body, no copy), and the response
// is read by the same goroutine, so a request costs no goroutine hand-offs
// and no per-request context tree. Message framing follows RFC 9112
// (HTTP/1.1) section 6.3 (message body length) and section 7.1 (chunked
// transfer coding, decoded with net/http/httputil.NewChunkedReader).
//
// A cancelled context closes the exchange's connection, so both a blocked
// write and a blocked read return.
//
// On Linux its connections read and write with raw system calls
// (internal/rawio), so that a proxy going from idle to busy does not wake
// the runtime's sysmon into polling; the large body goes out in one raw
// writev.
type h1Client struct {
	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration

	mu    sync.Mutex
	hosts map[string]*h1Host
}

func newH1Client() *h1Client {
	return &h1Client{
		dialer:      net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle:     DefaultMaxIdleConnsPerHost,
		idleTimeout: DefaultIdleConnTimeout,
		hosts:       map[string]*h1Host{},
	}
}

// h1Host is the idle pool of one address: a stack, so that the connections
// in use stay warm and the ones left at the bottom expire. A host whose
// idle connections have all expired with none in use is removed from the
// client's map (see expire), so that the map does not keep every address a
// churning fleet ever had.
type h1Host struct {
	addr  string
	out   atomic.Int32 // connections handed out by get and not yet back
	mu    sync.Mutex
	idle  []*h1Conn
	timer *time.Timer
}

// buffersWriter is a connection that writes net.Buffers with one writev of
// its own (rawio.Conn): net.Buffers.WriteTo uses writev only for net's
// own connection types and writes a buffer at a time to any other.
type buffersWriter interface {
	WriteBuffers(*net.Buffers) (int64, error)
}

// h1Conn is one upstream connection with its buffers.
type h1Conn struct {
	host      *h1Host
	nc        net.Conn
	br        *bufio.Reader
	wbuf      []byte
	iov       [2][]byte
	bufs      net.Buffers
	raw       []byte
	abort     func() // pc.interrupt, for context.AfterFunc
	idleSince time.Time

	// The context of the exchange in flight, the stop of the
	// context.AfterFunc that watches it once registered, and the
	// connection's I/O deadline (see watchPeriod).
	ctx      context.Context
	stop     func() bool
	deadline time.Time
	reused   bool
}

func (t *h1Client) host(addr string) *h1Host {
	t.mu.Lock()
	h := t.hosts[addr]
	if h == nil {
		h = &h1Host{addr: addr}
		t.hosts[addr] = h
	}
	t.mu.Unlock()
	return h
}

// get returns an idle connection to addr, or dials one.
func (t *h1Client) get(ctx context.Context, h *h1Host, addr string, fresh bool) (*h1Conn, error) {
	if !fresh {
		now := time.Now()
		h.mu.Lock()
		for n := len(h.idle); n > 0; n = len(h.idle) {
			pc := h.idle[n-1]
			h.idle[n-1] = nil
			h.idle = h.idle[:n-1]
			if now.Sub(pc.idleSince) < t.idleTimeout {
				h.mu.Unlock()
				pc.reused = true
				h.out.Add(1)
				return pc, nil
			}
			_ = pc.nc.Close()
		}
		h.mu.Unlock()
	}
	nc, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	nc = rawio.Wrap(nc)
	pc := &h1Conn{host: h, nc: nc}
	pc.br = bufio.NewReaderSize(pc, 32<<10) // through pc.Read, which watches the context
	pc.abort = pc.interrupt                 // bound once, not per exchange
	h.out.Add(1)
	return pc, nil
}

// discard closes a connection that get handed out, for good.
func (pc *h1Conn) discard() {
	_ = pc.nc.Close()
	pc.host.out.Add(-1)
}

// interrupt makes the connection's blocked and future I/O fail at once: the
// request's context was cancelled (the client went away).
func (pc *h1Conn) interrupt() { _ = pc.nc.SetDeadline(aLongTimeAgo) }

// watchPeriod is how long an exchange runs before its context is watched.
//
// A client that goes away must cancel its upstream request. The idiomatic
// way, context.AfterFunc on the request's context, costs every request a
// registration with the context (net/http's request context then allocates
// its done channel and its children map) and its removal: together about
// 3.5% of the gateway's CPU at saturation. Most requests of a busy gateway
// are answered in a fraction of a second (embeddings, short and cached
// completions), so an exchange starts with a plain I/O deadline instead,
// between watchPeriod/2 and watchPeriod ahead: the connection's deadline is
// moved only when less than half the period is left, which spares most
// exchanges of a busy connection even that timer update. If the deadline
// passes with the exchange still going, the context is checked: ended, the
// exchange fails with it; live, the deadline is cleared and the AfterFunc
// is registered for the rest of the exchange, so a long request (a
// streaming or a long completion) is cancelled at once when its client
// leaves. A client that leaves earlier is noticed when the deadline passes.
const watchPeriod = 100 * time.Millisecond

// watch starts watching ctx for the exchange about to run: at once when now
// is set, when the connection's deadline passes otherwise.
func (pc *h1Conn) watch(ctx context.Context, now bool) {
	pc.ctx = ctx
	if now {
		if !pc.deadline.IsZero() {
			// Left by an earlier exchange: it would cut this one.
			_ = pc.nc.SetDeadline(time.Time{})
			pc.deadline = time.Time{}
		}
		pc.stop = context.AfterFunc(ctx, pc.abort)
		return
	}
	if t := time.Now(); pc.deadline.Sub(t) < watchPeriod/2 {
		pc.deadline = t.Add(watchPeriod)
		_ = pc.nc.SetDeadline(pc.deadline)
	}
}

// escalate is called with the error of an I/O call of the exchange. It
// reports whether the call should go on: the error was the end of the
// watch period and the context is live, which is watched from now on.
func (pc *h1Conn) escalate(err error) bool {
	if pc.ctx == nil || pc.stop != nil || !errors.Is(err, os.ErrDeadlineExceeded) || pc.ctx.Err() != nil {
		return false
	}
	// Clear the deadline before registering: a context that ends in
	// between then interrupts the connection after the clearing.
	_ = pc.nc.SetDeadline(time.Time{})
	pc.deadline = time.Time{}
	pc.stop = context.AfterFunc(pc.ctx, pc.abort)
	return true
}

// unwatch ends the watch of the exchange's context. It reports false when
// the context ended and interrupted the connection, whose deadline is then
// in the past: it must not be reused.
func (pc *h1Conn) unwatch() bool {
	ok := true
	if pc.stop != nil {
		ok = pc.stop()
	}
	pc.ctx, pc.stop = nil, nil
	return ok
}

// Read implements io.Reader for the connection's bufio.Reader: it reads
// from the network, going on past the end of the watch period.
func (pc *h1Conn) Read(p []byte) (int, error) {
	for {
		n, err := pc.nc.Read(p)
		if n > 0 || err == nil || !pc.escalate(err) {
			return n, err
		}
	}
}

// put returns a connection whose response was read to its end to the idle
// pool, and arms the pool's expiry timer.
func (t *h1Client) put(pc *h1Conn) {
	h := pc.host
	pc.idleSince = time.Now()
	pc.reused = false
	h.mu.Lock()
	h.out.Add(-1)
	if len(h.idle) >= t.maxIdle {
		h.mu.Unlock()
		_ = pc.nc.Close()
		return
	}
	h.idle = append(h.idle, pc)
	if h.timer == nil {
		h.timer = time.AfterFunc(t.idleTimeout, func() { t.expire(h) })
	}
	h.mu.Unlock()
}

// expire closes the idle connections of h that timed out (they are at the
// bottom of the stack) and re-arms the timer while any remain. When none
// remains and none is in use, h leaves the client's map; a request that
// took h from the map just before goes on with it, and its connection,
// put back in h, is closed by h's timer in turn.
func (t *h1Client) expire(h *h1Host) {
	now := time.Now()
	h.mu.Lock()
	n := 0
	for n < len(h.idle) && now.Sub(h.idle[n].idleSince) >= t.idleTimeout {
		_ = h.idle[n].nc.Close()
		n++
	}
	h.idle = append(h.idle[:0], h.idle[n:]...)
	clear(h.idle[len(h.idle) : len(h.idle)+n])
	if len(h.idle) > 0 {
		h.timer.Reset(t.idleTimeout - now.Sub(h.idle[0].idleSince))
	} else {
		h.timer = nil
		t.removeIfUnusedLocked(h)
	}
	h.mu.Unlock()
}

// removeIfUnusedLocked removes h from the client's map when it has no
// idle connection and none in use. h.mu must be held; t.mu is taken inside
// it, which is safe because no path takes h.mu while holding t.mu.
func (t *h1Client) removeIfUnusedLocked(h *h1Host) {
	if len(h.idle) > 0 || h.out.Load() != 0 {
		return
	}
	t.mu.Lock()
	if t.hosts[h.addr] == h {
		delete(t.hosts, h.addr)
	}
	t.mu.Unlock()
}

// drop closes every idle connection of h: a server that closed one idle
// connection (a restart, its keep-alive timeout) has usually closed them all.
func (t *h1Client) drop(h *h1Host) {
	h.mu.Lock()
	for i, pc := range h.idle {
		_ = pc.nc.Close()
		h.idle[i] = nil
	}
	h.idle = h.idle[:0]
	h.mu.Unlock()
}

// h1Request is what the Proxy sends upstream.
type h1Request struct {
	method string
	addr   string // host:port, also the Host header
	path   string // escaped path
	query  string // raw query, without "?"
	header http.Header
	// extraKey and extraValue, when extraKey is not "", are one more
	// header field (canonical key), replacing any of header's.
	extraKey, extraValue string
	body                 []byte
	// sendLength writes Content-Length even for an empty body (every
	// method but GET and HEAD).
	sendLength bool
	// watchNow watches the context from the start of the exchange rather
	// than after watchPeriod: for a context that a timer ends
	// (Config.UpstreamTimeout), whose expiry must cut the exchange at once.
	watchNow bool
}

// do sends req and returns the response with its headers read. The body
// must be read to its end or closed; at its end the connection returns to
// the pool. A failure on a reused connection before any response byte is
// retried once on a new connection. When ctx ends during the exchange, the
// error is context.Cause(ctx).
func (t *h1Client) do(ctx context.Context, req *h1Request) (*http.Response, error) {
	h := t.host(req.addr)
	fresh := false
	for {
		pc, err := t.get(ctx, h, req.addr, fresh)
		if err != nil {
			// An address that cannot be reached (a pod gone for good)
			// does not keep its host in the map.
			h.mu.Lock()
			t.removeIfUnusedLocked(h)
			h.mu.Unlock()
			return nil, err
		}
		resp, err := pc.exchange(t, ctx, req)
		if err == nil {
			return resp, nil
		}
		pc.discard()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if errors.Is(err, errStaleConn) && !fresh {
			t.drop(h)
			fresh = true
			continue
		}
		return nil, err
	}
}

// aLongTimeAgo is a deadline in the past, which makes blocked I/O return.
var aLongTimeAgo = time.Unix(1, 0)

// exchange writes req on pc and reads the response's headers.
func (pc *h1Conn) exchange(t *h1Client, ctx context.Context, req *h1Request) (*http.Response, error) {
	pc.watch(ctx, req.watchNow)
	b, err := appendRequestHead(pc.wbuf[:0], req)
	if err != nil {
		pc.unwatch()
		return nil, err
	}
	if len(b)+len(req.body) <= 32<<10 {
		b = append(b, req.body...)
		for w := b; ; {
			var n int
			n, err = pc.nc.Write(w)
			if err == nil || !pc.escalate(err) {
				break
			}
			w = w[n:]
		}
	} else {
		// One writev of the head and the body, which stays where it is.
		// WriteTo consumes what it wrote, so a write cut by the end of the
		// watch period goes on where it stopped.
		pc.iov = [2][]byte{b, req.body}
		pc.bufs = pc.iov[:]
		for {
			if bw, ok := pc.nc.(buffersWriter); ok {
				_, err = bw.WriteBuffers(&pc.bufs)
			} else {
				_, err = pc.bufs.WriteTo(pc.nc)
			}
			if err == nil || !pc.escalate(err) {
				break
			}
		}
		pc.iov = [2][]byte{}
	}
	if cap(b) <= 64<<10 {
		pc.wbuf = b[:0]
	}
	if err != nil {
		// A server may answer before it has read the whole request (a 413
		// for a body over its limit) and close the connection, which cuts
		// the write: its answer, already in the receive buffer, is what the
		// client must get, not a connect error. Otherwise the read fails at
		// once too, the connection being closed or its deadline past.
		// Not on a reused connection, where what is read may be what a
		// server sends before it closes an idle one (a 408): there the
		// write error is a stale connection, and the request is tried on
		// a new one, where an early answer is taken.
		if pc.reused {
			pc.unwatch()
			return nil, fmt.Errorf("%w: %w", errStaleConn, err)
		}
		r, rerr := pc.readResponse(req)
		if rerr != nil {
			pc.unwatch()
			return nil, err
		}
		r.body.keep = false // the request was not sent whole
		return pc.started(t, r), nil
	}
	r, err := pc.readResponse(req)
	if err != nil {
		pc.unwatch()
		if pc.reused && isStaleRead(err) {
			return nil, fmt.Errorf("%w: %w", errStaleConn, err)
		}
		return nil, err
	}
	return pc.started(t, r), nil
}

// started hands out a response whose head was read: one without a body is
// finished at once (its connection back in the pool if it may be reused).
func (pc *h1Conn) started(t *h1Client, r *h1Response) *http.Response {
	r.body.t = t
	if r.body.mode == bodyNone {
		r.body.finish(nil)
		r.Body = http.NoBody
	}
	return &r.Response
}

// h1Response is a response with its body, allocated together.
type h1Response struct {
	http.Response
	body h1Body
	// framing records which of the fields that frame the body the head
	// has (fieldConnection, …), noted by parseHead as it reads each name,
	// so that frame looks up only those present: most responses have
	// one of the three.
	framing uint8
}

// Bits of h1Response.framing.
const (
	fieldConnection = 1 << iota
	fieldContentLength
	fieldTransferEncoding
)

// isStaleRead reports whether err is what reading the response from a
// connection the server had closed returns: end of stream or a reset
// before any byte, not a timeout.
func isStaleRead(err error) bool {
	var ne net.Error
	return errors.Is(err, errNoResponse) && !(errors.As(err, &ne) && ne.Timeout())
}

// appendRequestHead appends the request line and header section of req.
func appendRequestHead(b []byte, req *h1Request) ([]byte, error) {
	b = append(b, req.method...)
	b = append(b, ' ')
	if req.path == "" {
		b = append(b, '/')
	} else {
		b = append(b, req.path...)
	}
	if req.query != "" {
		b = append(b, '?')
		b = append(b, req.query...)
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, req.addr...)
	b = append(b, "\r\n"...)
	// The Proxy's cleanHeader checked every field of req.header; the extra
	// field comes from elsewhere (an endpoint's address) and is checked here.
	for k, vs := range req.header {
		if k == "Host" || k == "Content-Length" || (req.extraKey != "" && k == req.extraKey) {
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if req.extraKey != "" {
		if !validFieldName(req.extraKey) || !validFieldValue(req.extraValue) {
			return b, fmt.Errorf("inferroute router: invalid header field %q", req.extraKey)
		}
		b = append(b, req.extraKey...)
		b = append(b, ": "...)
		b = append(b, req.extraValue...)
		b = append(b, "\r\n"...)
	}
	if len(req.body) > 0 || req.sendLength {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(req.body)), 10)
		b = append(b, "\r\n"...)
	}
	return append(b, "\r\n"...), nil
}

// validFieldName reports whether k is an RFC 9110 token (section 5.1).
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isTokenChar(k[i]) {
			return false
		}
	}
	return true
}

// validFieldValue reports whether v has no control characters but HTAB
// (RFC 9110 section 5.5), so it cannot split the message.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// errNoResponse is the error of a connection that closed before a status
// line arrived.
var errNoResponse = errors.New("inferroute router: connection closed before the response")

// Body framing of a response (RFC 9112 section 6.3).
const (
	bodyNone    = iota // HEAD, 1xx, 204, 304
	bodyLength         // Content-Length bytes
	bodyChunked        // chunked transfer coding
	bodyClose          // until the server closes the connection
)

// readResponse reads the status line and headers of the final response,
// skipping interim 1xx responses.
func (pc *h1Conn) readResponse(req *h1Request) (*h1Response, error) {
	for interim := false; ; interim = true {
		resp, err := pc.readHead(interim)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, pc.frame(resp, req)
		}
	}
}

// readHead reads one status line and header section. An error before its
// first byte wraps errNoResponse, unless an interim response came before
// it: then the server has the request, which must not be sent again.
func (pc *h1Conn) readHead(interim bool) (*h1Response, error) {
	raw := pc.raw[:0]
	lines := 0
	lineStart := 0 // offset in raw of the line being read
	for {
		line, err := pc.br.ReadSlice('\n')
		if err != nil && err != bufio.ErrBufferFull {
			if !interim && len(raw) == 0 && len(line) == 0 {
				return nil, fmt.Errorf("%w: %w", errNoResponse, err)
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("reading the response headers: %w", err)
		}
		raw = append(raw, line...)
		if len(raw) > maxResponseHeaderBytes {
			return nil, protocolErrorf("response headers too long")
		}
		if err == bufio.ErrBufferFull {
			// A line longer than the read buffer: kept and read on. Only
			// the head as a whole is limited.
			continue
		}
		lines++
		if isBlankLine(raw[lineStart:]) {
			break
		}
		lineStart = len(raw)
	}
	if cap(raw) <= 64<<10 {
		pc.raw = raw
	}
	// One string for the whole head: keys and values are substrings of it.
	return parseHead(string(raw), lines)
}

// protocolErrorf returns an error wrapping ErrUpstreamProtocol: the
// response head at hand is not HTTP/1.1 the client can read.
func protocolErrorf(format string, a ...any) error {
	return fmt.Errorf("inferroute router: %w: "+format, append([]any{ErrUpstreamProtocol}, a...)...)
}

// isBlankLine reports whether line, ending in LF, is the empty line that
// ends a header or trailer section: LF or CRLF.
func isBlankLine(line []byte) bool {
	return len(line) <= 2 && (line[0] == '\n' || (line[0] == '\r' && len(line) == 2))
}

// parseHead parses a status line and header section (with its ending blank
// line) into a Response without a body.
func parseHead(s string, lines int) (*h1Response, error) {
	eol := indexEOL(s)
	status := s[:eol]
	s = s[eol:]
	r := &h1Response{}
	resp := &r.Response
	proto, rest, ok := cut(status, ' ')
	if !ok {
		return nil, protocolErrorf("malformed status line %q", status)
	}
	switch proto {
	case "HTTP/1.1":
		resp.ProtoMajor, resp.ProtoMinor = 1, 1
	case "HTTP/1.0":
		resp.ProtoMajor, resp.ProtoMinor = 1, 0
	default:
		return nil, protocolErrorf("unsupported protocol %q", proto)
	}
	resp.Proto = proto
	code, _, _ := cut(rest, ' ')
	n, err := strconv.Atoi(code)
	if len(code) != 3 || code[0] < '1' || code[0] > '5' || err != nil {
		return nil, protocolErrorf("malformed status code in %q", status)
	}
	resp.StatusCode = n
	resp.Status = rest
	h := make(http.Header, lines)
	vals := make([]string, lines)
	used := 0
	var last string // key of the previous field, for obsolete line folding
	for {
		s = s[skipEOL(s):]
		eol := indexEOL(s)
		line := s[:eol]
		s = s[eol:]
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			// obs-fold: replaced by a space (RFC 9112 section 5.2).
			if last == "" {
				return nil, protocolErrorf("malformed response header continuation")
			}
			vs := h[last]
			if prev := vs[len(vs)-1]; prev == "" {
				vs[len(vs)-1] = trimOWS(line) // no space before the value, as net/http reads it
			} else {
				vs[len(vs)-1] = prev + " " + trimOWS(line)
			}
			continue
		}
		k, v, ok := cut(line, ':')
		if ok {
			k, ok = fieldKey(k)
		}
		if !ok {
			return nil, protocolErrorf("malformed response header line %q", line)
		}
		switch k {
		case "Connection":
			r.framing |= fieldConnection
		case "Content-Length":
			r.framing |= fieldContentLength
		case "Transfer-Encoding":
			r.framing |= fieldTransferEncoding
		}
		v = trimOWS(v)
		if vs, ok := h[k]; ok {
			h[k] = append(vs, v)
		} else {
			vals[used] = v
			h[k] = vals[used : used+1 : used+1]
			used++
		}
		last = k
	}
	resp.Header = h
	return r, nil
}

// indexEOL returns the index of the line ending at the start of the rest
// of s (the CR of CRLF, or a bare LF), or len(s).
func indexEOL(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if i > 0 && s[i-1] == '\r' {
				return i - 1
			}
			return i
		}
	}
	return len(s)
}

// skipEOL returns the length of the line ending s starts with.
func skipEOL(s string) int {
	switch {
	case len(s) >= 2 && s[0] == '\r' && s[1] == '\n':
		return 2
	case len(s) >= 1 && s[0] == '\n':
		return 1
	}
	return 0
}

func cut(s string, sep byte) (before, after string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// commonKeys interns the canonical form of frequent response header keys,
// so that a lower-case key (uvicorn, which vLLM and SGLang use, sends
// lower-case names) costs no allocation.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Content-Type", "Content-Length", "Transfer-Encoding", "Connection", "Date", "Server",
		"Keep-Alive", "Cache-Control", "Vary", "Content-Encoding", "X-Request-Id", "X-Accel-Buffering",
		"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Trailer",
	} {
		m[k] = k
	}
	return m
}()

// fieldKey checks a header field name and canonicalizes it in one pass:
// it returns k in the canonical form of textproto.CanonicalMIMEHeaderKey
// and true when k is an RFC 9110 token (validFieldName), and k and false
// otherwise. A canonical k is returned as it is, unallocated; a common key
// in another case is interned, any other a new string. Header names are
// read from every request and response, so the one pass (rather than a
// validity scan and then http.CanonicalHeaderKey's) is worth its code.
func fieldKey(k string) (string, bool) {
	if k == "" {
		return k, false
	}
	upper, canonical := true, true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !isTokenChar(c) {
			return k, false
		}
		if (upper && 'a' <= c && c <= 'z') || (!upper && 'A' <= c && c <= 'Z') {
			canonical = false
		}
		upper = c == '-'
	}
	if canonical {
		return k, true
	}
	return recase(k), true
}

// recase returns the token k, which is not in canonical form, in that
// form: an interned string for common keys, a new string otherwise.
func recase(k string) string {
	var arr [64]byte
	var b []byte
	if len(k) <= len(arr) {
		b = arr[:len(k)]
	} else {
		b = make([]byte, len(k))
	}
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b[i] = c
		upper = c == '-'
	}
	if s, ok := commonKeys[string(b)]; ok {
		return s
	}
	return string(b)
}

// hasToken reports whether a comma-separated header list has token
// (case-insensitive).
func hasToken(vs []string, token string) bool {
	for _, v := range vs {
		for v != "" {
			var f string
			f, v, _ = cut(v, ',')
			if equalFold(trimOWS(f), token) {
				return true
			}
		}
	}
	return false
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// frame decides the body's length (RFC 9112 section 6.3) and whether the
// connection can be reused, and sets resp.Body and resp.ContentLength.
func (pc *h1Conn) frame(r *h1Response, req *h1Request) error {
	resp, h, body := &r.Response, r.Header, &r.body
	body.pc = pc
	resp.Body = body
	resp.ContentLength = -1
	var conn, te, cl []string
	if r.framing&fieldConnection != 0 {
		conn = h["Connection"]
	}
	if r.framing&fieldTransferEncoding != 0 {
		te = h["Transfer-Encoding"]
	}
	if r.framing&fieldContentLength != 0 {
		cl = h["Content-Length"]
	}
	body.keep = resp.ProtoMinor >= 1 && !hasToken(conn, "close")
	if resp.ProtoMinor == 0 {
		body.keep = hasToken(conn, "keep-alive")
		if te != nil {
			// HTTP/1.0 has no transfer codings: the framing is faulty
			// (RFC 9112 section 6.1). Read the body without it, as
			// net/http does, and close the connection after it.
			delete(h, "Transfer-Encoding")
			te = nil
			body.keep = false
		}
	}
	code := resp.StatusCode
	switch {
	case req.method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified:
		body.mode = bodyNone
		resp.ContentLength = 0
		if code != http.StatusNoContent {
			resp.ContentLength = -1
		}
		return nil
	case code == http.StatusSwitchingProtocols:
		body.mode = bodyNone
		body.keep = false
		return nil
	}
	if len(te) > 0 {
		// Transfer-Encoding overrides Content-Length, and a message with
		// both must not be reused (RFC 9112 section 6.3, item 3).
		if cl != nil {
			delete(h, "Content-Length")
			body.keep = false
		}
		// The Proxy sends no TE field, so a server may apply no transfer
		// coding but chunked (RFC 9112 section 6.1, and 7.4 on TE): a
		// body under any other (gzip, chunked) cannot be relayed, the
		// field that names it being hop-by-hop. Refused, as net/http's
		// client refuses it.
		if len(te) != 1 || !equalFold(trimOWS(te[0]), "chunked") {
			return protocolErrorf("unsupported transfer coding %q", strings.Join(te, ", "))
		}
		resp.TransferEncoding = []string{"chunked"}
		body.mode = bodyChunked
		body.r = httputil.NewChunkedReader(pc.br)
		return nil
	}
	if len(cl) > 0 {
		n, ok := parseLength(cl[0])
		if !ok {
			return protocolErrorf("malformed Content-Length %q", cl[0])
		}
		for _, v := range cl[1:] {
			if v != cl[0] {
				return protocolErrorf("conflicting Content-Length values")
			}
		}
		resp.ContentLength = n
		body.mode, body.remain = bodyLength, n
		if n == 0 {
			body.mode = bodyNone
		}
		return nil
	}
	body.mode = bodyClose
	body.keep = false
	return nil
}

// parseLength parses a Content-Length value: 1*DIGIT (RFC 9110 section
// 8.6), so no sign, which strconv.ParseInt would take and net/http's client
// refuses.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 { // 18 digits cannot overflow an int64
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// h1Body is a response body. At its end the connection goes back to the
// pool (or is closed when it cannot be reused); Close before the end closes
// the connection. It is not safe for concurrent use.
type h1Body struct {
	pc     *h1Conn
	t      *h1Client
	r      io.Reader // chunked decoder
	mode   int
	remain int64
	keep   bool
	done   bool
	err    error
}

// Read implements io.Reader.
func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		if b.err != nil {
			return 0, b.err
		}
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	switch b.mode {
	case bodyLength:
		if int64(len(p)) > b.remain {
			p = p[:b.remain]
		}
		n, err := b.pc.br.Read(p)
		b.remain -= int64(n)
		if b.remain == 0 {
			b.finish(nil)
			return n, io.EOF
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			b.finish(err)
		}
		return n, err
	case bodyChunked:
		n, err := b.r.Read(p)
		if err == io.EOF {
			// The last chunk: read the trailer section to its blank line.
			if terr := b.skipTrailer(); terr != nil {
				b.finish(terr)
				return n, terr
			}
			b.finish(nil)
			return n, io.EOF
		}
		if err != nil {
			b.finish(err)
		}
		return n, err
	case bodyClose:
		n, err := b.pc.br.Read(p)
		if err == io.EOF {
			b.finish(nil)
		} else if err != nil {
			b.finish(err)
		}
		return n, err
	}
	return 0, io.EOF
}

// skipTrailer reads and discards a chunked message's trailer fields.
func (b *h1Body) skipTrailer() error {
	for total, partial := 0, false; ; {
		line, err := b.pc.br.ReadSlice('\n')
		if err != nil && err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		total += len(line)
		if total > maxResponseHeaderBytes {
			return errors.New("inferroute router: response trailer too long")
		}
		if err == bufio.ErrBufferFull { // a line longer than the buffer
			partial = true
			continue
		}
		if !partial && isBlankLine(line) {
			return nil
		}
		partial = false
	}
}

// finish ends the body: err == nil means it was read to its end.
func (b *h1Body) finish(err error) {
	b.done = true
	b.err = err
	reuse := err == nil && b.keep && b.mode != bodyClose
	if !b.pc.unwatch() {
		reuse = false // the context ended: the connection's deadline is set
	}
	if reuse && b.pc.br.Buffered() == 0 {
		b.t.put(b.pc)
	} else {
		b.pc.discard()
	}
	b.pc = nil
}

// Close implements io.Closer: a body not read to its end closes its
// connection.
func (b *h1Body) Close() error {
	if !b.done {
		b.finish(errBodyClosed)
	}
	return nil
}

var errBodyClosed = errors.New("inferroute router: read on a closed response body")
