// Command httputilproxy is the overhead benchmark's Go baseline: the
// standard library's reverse proxy (net/http/httputil.ReverseProxy) sending
// requests round-robin to the backends over a keep-alive pool, with no body
// reading, no routing and no scoring. It is what a Go gateway costs before
// it does anything, so run.sh can show how much of the gap between the
// inferroute gateway and nginx is the work of routing and how much is Go's
// HTTP stack on this machine.
//
// Usage:
//
//	httputilproxy -listen 127.0.0.1:18170 -upstreams 127.0.0.1:18101,127.0.0.1:18102
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// newProxy returns a reverse proxy that sends the n-th request to
// upstreams[n % len(upstreams)]. Its transport keeps every connection it
// opens idle for reuse (the default transport keeps at most 100 in all,
// which would make it dial anew under 150 concurrent clients), the way
// nginx's "keepalive 256" does in run.sh.
func newProxy(upstreams []string) (*httputil.ReverseProxy, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("no upstreams")
	}
	targets := make([]*url.URL, len(upstreams))
	for i, u := range upstreams {
		if u == "" || strings.Contains(u, "/") {
			return nil, fmt.Errorf("upstream %q: want host:port", u)
		}
		targets[i] = &url.URL{Scheme: "http", Host: u}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0 // no limit
	tr.MaxIdleConnsPerHost = 1024
	var next atomic.Uint64
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
		},
		Transport:    tr,
		ErrorHandler: answerError,
	}, nil
}

// answerError answers 502 to a request the upstream failed, and logs the
// failure unless the client went away first (wrk closes its connections
// with requests in flight at the end of every run; those are not errors).
func answerError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() == nil {
		log.Printf("proxy error: %v", err)
	}
	w.WriteHeader(http.StatusBadGateway)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18170", "address to serve on")
	upstreams := flag.String("upstreams", "127.0.0.1:18101,127.0.0.1:18102", "comma-separated host:port list of backends")
	flag.Parse()
	rp, err := newProxy(strings.Split(*upstreams, ","))
	if err != nil {
		log.Fatal(err)
	}
	// The same server timeouts as examples/gateway's defaults.
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
