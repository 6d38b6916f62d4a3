package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals/scrape"
)

// Config is the gateway's YAML configuration. Durations are Go duration
// strings ("30s"). Zero fields take the defaults named on them.
type Config struct {
	// Listen is the address to serve on; default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// ReadHeaderTimeout bounds how long a client may take to send its
	// request headers (slow-loris protection); default 10s.
	ReadHeaderTimeout picker.Duration `yaml:"readHeaderTimeout"`
	// IdleTimeout closes keep-alive connections idle this long; default 120s.
	IdleTimeout picker.Duration `yaml:"idleTimeout"`
	// DrainTimeout bounds the graceful shutdown: streams in flight get this
	// long to finish; default 60s.
	DrainTimeout picker.Duration `yaml:"drainTimeout"`
	// ShutdownDelay is how long the gateway goes on serving after SIGTERM
	// or SIGINT, with /healthz and /readyz answering 503 and keep-alive
	// off, before it stops accepting connections and drains: the time a
	// load balancer or Kubernetes takes to stop sending it new ones
	// (a few seconds), which would otherwise be refused. Default 0.
	ShutdownDelay picker.Duration `yaml:"shutdownDelay"`
	// LogLevel is debug, info, warn or error; default info.
	LogLevel string `yaml:"logLevel"`
	// AccessLog writes one JSON line per request to standard output when
	// it has been answered (router.Config.AccessLog): status, model, pool,
	// endpoint, attempts, TTFT, duration, tokens, and with Auth the name
	// of the API key presented (api_key). Independent of LogLevel;
	// a reload turns it on or off. Default off.
	AccessLog bool `yaml:"accessLog"`
	// TLS, when set, serves the gateway over HTTPS (HTTP/2 and HTTP/1.1)
	// instead of plain HTTP.
	TLS *TLSConfig `yaml:"tls"`
	// Auth, when set, requires an API key of every request the proxy
	// serves (AuthConfig). Default off: anyone who reaches the gateway
	// may use it, and the client's Authorization goes to the model
	// servers unless a pool has an upstreamKeyFile.
	Auth *AuthConfig `yaml:"auth"`

	// Router tunes the proxy.
	Router RouterConfig `yaml:"router"`
	// Scrape tunes the metrics scraper of the static endpoints.
	Scrape ScrapeConfig `yaml:"scrape"`

	// DefaultPool names the default pool; "" means the first.
	DefaultPool string `yaml:"defaultPool"`
	// FallbackPool names the pool of requests without a model; "" means
	// the default pool.
	FallbackPool string `yaml:"fallbackPool"`
	// Pools are the model pools; at least one.
	Pools []PoolConfig `yaml:"pools"`
}

// RouterConfig mirrors the fields of router.Config that make sense in a
// file.
type RouterConfig struct {
	// MaxBodyBytes is the request body limit; default 4 MiB.
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
	// MaxRetries bounds retries on fallback endpoints; 0 means 2, negative
	// none.
	MaxRetries int `yaml:"maxRetries"`
	// UpstreamTimeout bounds the wait for response headers; 0 means none.
	UpstreamTimeout picker.Duration `yaml:"upstreamTimeout"`
	// StreamIdleTimeout cuts an SSE stream that sends nothing for this
	// long (router.Config.StreamIdleTimeout); 0 means no limit.
	StreamIdleTimeout picker.Duration `yaml:"streamIdleTimeout"`
	// StripHeaders are extra client headers removed before routing.
	StripHeaders []string `yaml:"stripHeaders"`
	// EndpointHeader, if set, names the chosen endpoint on the upstream
	// request.
	EndpointHeader string `yaml:"endpointHeader"`
	// RequestIDs gives each request that came without an x-request-id
	// one (router.Config.RequestID with router.NewRequestID), sent to
	// the model server, returned in X-Request-Id and in the access log.
	// Default off.
	RequestIDs bool `yaml:"requestIds"`
	// UpstreamScheme is http (default) or https: how the gateway reaches
	// its endpoints, for requests and for the default metrics URL
	// (scheme://address/metrics) alike.
	UpstreamScheme string `yaml:"upstreamScheme"`
	// UpstreamCAFile is a PEM file of the certificate authorities that
	// sign the endpoints' certificates, with upstreamScheme https; ""
	// means the system's roots.
	UpstreamCAFile string `yaml:"upstreamCAFile"`
}

// TLSConfig is the certificate the gateway serves HTTPS with. A reload
// reads both files again, so that a renewed certificate is served without
// a restart.
type TLSConfig struct {
	// CertFile is the PEM certificate chain, leaf first. Required.
	CertFile string `yaml:"certFile"`
	// KeyFile is the PEM private key of the leaf. Required.
	KeyFile string `yaml:"keyFile"`
}

// ScrapeConfig tunes the scraper.
type ScrapeConfig struct {
	// Disabled turns scraping off: the picker then scores on its own
	// in-flight accounting only.
	Disabled bool `yaml:"disabled"`
	// Interval between scrapes of an endpoint; default 50ms.
	Interval picker.Duration `yaml:"interval"`
	// Timeout of one scrape; default 1s.
	Timeout picker.Duration `yaml:"timeout"`
	// FailureThreshold is the consecutive failures after which an endpoint
	// is marked down; default 3.
	FailureThreshold int `yaml:"failureThreshold"`
}

// PoolConfig is one pool: the model names it serves, its endpoints and its
// picker configuration.
type PoolConfig struct {
	// Name is the pool's unique name.
	Name string `yaml:"name"`
	// Models are served model names routed to this pool unchanged.
	Models []string `yaml:"models"`
	// Adapters maps LoRA adapter names to their base model.
	Adapters map[string]string `yaml:"adapters"`
	// Aliases maps client-facing names to a model or adapter of the pool;
	// the body is rewritten on the way up and the response back.
	Aliases map[string]string `yaml:"aliases"`
	// Picker is the pool's picker configuration (filters, scorer weights,
	// strategy); omitted means picker.DefaultConfig().
	Picker *picker.Config `yaml:"picker"`
	// Admission, when set, turns on admission control for the pool;
	// omitted means every request is admitted (the gateway never answers
	// 429).
	Admission *AdmissionConfig `yaml:"admission"`
	// Endpoints are the pool's static endpoints.
	Endpoints []EndpointConfig `yaml:"endpoints"`
	// UpstreamKeyFile is a file holding the key of the pool's model
	// servers (vLLM's --api-key, SGLang's --api-key), sent to them as
	// "Authorization: Bearer <key>" in place of the client's; a reload
	// reads it again. "" forwards the client's Authorization, or none
	// with auth on.
	UpstreamKeyFile string `yaml:"upstreamKeyFile"`
}

// AdmissionConfig configures a pool's scorer.SLOAdmitter: a sheddable
// request (header x-inferroute-priority below 0) that no endpoint is
// predicted to serve within its objectives (x-slo-ttft-ms, x-slo-tpot-ms,
// times Slack) or, without objectives, within ShedTTFTMs, is answered 429
// with Retry-After instead of being sent. Requests of priority 0 or more
// are always admitted. Unset fields take scorer.DefaultSLOParams' values.
type AdmissionConfig struct {
	// Slack multiplies the objectives; default 1.
	Slack float64 `yaml:"slack"`
	// MinConfidence is the prediction confidence below which an endpoint
	// is not judged (admission never sheds on a guess); default 0.25.
	MinConfidence *float64 `yaml:"minConfidence"`
	// ShedTTFTMs sheds sheddable requests without objectives when every
	// endpoint's predicted TTFT exceeds it, in milliseconds; default 0,
	// never.
	ShedTTFTMs float64 `yaml:"shedTTFTMs"`
}

// params returns the admitter's parameters: the defaults with a's fields
// over them.
func (a *AdmissionConfig) params() scorer.SLOParams {
	p := scorer.DefaultSLOParams()
	if a.Slack != 0 {
		p.Slack = a.Slack
	}
	if a.MinConfidence != nil {
		p.MinConfidence = *a.MinConfidence
	}
	p.ShedTTFTMs = a.ShedTTFTMs
	return p
}

// EndpointConfig is one static model-server replica.
type EndpointConfig struct {
	// Name identifies the endpoint; default its address.
	Name string `yaml:"name"`
	// Address is host:port. Required.
	Address string `yaml:"address"`
	// Engine is vllm (default), sglang, tgi, triton-tensorrt-llm or
	// trtllm-serve: it selects the metric names scraped.
	Engine string `yaml:"engine"`
	// Model is the base model the endpoint serves; "" serves any model of
	// the pool.
	Model string `yaml:"model"`
	// Adapters the endpoint can load; omitted means unknown (any).
	Adapters []string `yaml:"adapters"`
	// MetricsURL overrides scheme://Address/metrics, where scheme is
	// router.upstreamScheme.
	MetricsURL string `yaml:"metricsURL"`
	// Labels are free-form labels (zone, gpu, …) for filters and scorers.
	Labels map[string]string `yaml:"labels"`
}

// ParseConfig parses a YAML (or JSON) configuration strictly: unknown
// fields, a second document and values that would quietly turn a
// protection off or never work are errors naming the field (a negative
// timeout or limit, an endpoint address that is not host:port, an engine
// without a metric map, an endpoint addressed twice in a pool or named
// twice in the gateway). It
// fills the defaults and checks what can be checked without building the
// pickers; the routing table's own checks (models, adapters, aliases, pool
// names) run in NewGateway.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("gateway config: %w", err)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("gateway config: more than one YAML document")
	}
	if err := c.checkLimits(); err != nil {
		return Config{}, fmt.Errorf("gateway config: %w", err)
	}
	if c.LogLevel != "" {
		// Here, not only where the logger is made, so that -check and a
		// reload refuse it as a start does.
		var l slog.Level
		if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
			return Config{}, fmt.Errorf("gateway config: logLevel: %w", err)
		}
	}
	c.defaults()
	if len(c.Pools) == 0 {
		return Config{}, errors.New("gateway config: pools: at least one pool is required")
	}
	switch c.Router.UpstreamScheme {
	case "", "http":
		if c.Router.UpstreamCAFile != "" {
			return Config{}, errors.New("gateway config: router.upstreamCAFile needs router.upstreamScheme https")
		}
	case "https":
	default:
		return Config{}, fmt.Errorf("gateway config: router.upstreamScheme: %q is neither http nor https", c.Router.UpstreamScheme)
	}
	if c.TLS != nil && (c.TLS.CertFile == "" || c.TLS.KeyFile == "") {
		return Config{}, errors.New("gateway config: tls: certFile and keyFile are both required")
	}
	if c.Auth != nil && c.Auth.KeysFile == "" {
		return Config{}, errors.New("gateway config: auth: keysFile is required")
	}
	if err := checkGrants(c.Auth, c.Pools); err != nil {
		return Config{}, fmt.Errorf("gateway config: %w", err)
	}
	if err := checkHostPort(c.Listen); err != nil {
		return Config{}, fmt.Errorf("gateway config: listen: %w", err)
	}
	// Endpoint names are unique across pools too: the scraper's series
	// are labelled by endpoint name alone (the picker's carry the pool
	// as well), so two pods of one name in two pools would report into
	// one series, and a log line's endpoint would not say which.
	type place struct{ pool, ep int }
	names := map[string]place{}
	for i, p := range c.Pools {
		addrs := map[string]int{}
		for j, ep := range p.Endpoints {
			if err := checkEndpoint(ep); err != nil {
				return Config{}, fmt.Errorf("gateway config: pools[%d] (%s).endpoints[%d].%w", i, p.Name, j, err)
			}
			name := cmp.Or(ep.Name, ep.Address)
			if k, dup := names[name]; dup && k.pool == i {
				return Config{}, fmt.Errorf("gateway config: pools[%d] (%s).endpoints[%d]: name %q is also endpoints[%d]'s", i, p.Name, j, name, k.ep)
			} else if dup {
				return Config{}, fmt.Errorf("gateway config: pools[%d] (%s).endpoints[%d]: name %q is also pools[%d] (%s).endpoints[%d]'s; endpoint names label the metrics, so they are unique across pools",
					i, p.Name, j, name, k.pool, c.Pools[k.pool].Name, k.ep)
			}
			if k, dup := addrs[ep.Address]; dup {
				return Config{}, fmt.Errorf("gateway config: pools[%d] (%s).endpoints[%d]: address %s is also endpoints[%d]'s", i, p.Name, j, ep.Address, k)
			}
			names[name], addrs[ep.Address] = place{i, j}, j
		}
	}
	return c, nil
}

// checkLimits refuses negative durations and limits, which net/http and
// the router would take as "none": a negative readHeaderTimeout would turn
// the slow-loris protection off, a negative drainTimeout cut every stream
// at shutdown. Zero means the default.
func (c *Config) checkLimits() error {
	for _, d := range []struct {
		name string
		v    picker.Duration
	}{
		{"readHeaderTimeout", c.ReadHeaderTimeout}, {"idleTimeout", c.IdleTimeout}, {"drainTimeout", c.DrainTimeout},
		{"shutdownDelay", c.ShutdownDelay},
		{"router.upstreamTimeout", c.Router.UpstreamTimeout}, {"router.streamIdleTimeout", c.Router.StreamIdleTimeout},
		{"scrape.interval", c.Scrape.Interval}, {"scrape.timeout", c.Scrape.Timeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s: %s is negative (0 means the default)", d.name, time.Duration(d.v))
		}
	}
	if c.Router.MaxBodyBytes < 0 {
		return fmt.Errorf("router.maxBodyBytes: %d is negative (0 means the default)", c.Router.MaxBodyBytes)
	}
	if c.Scrape.FailureThreshold < 0 {
		return fmt.Errorf("scrape.failureThreshold: %d is negative (0 means the default)", c.Scrape.FailureThreshold)
	}
	return nil
}

// checkEndpoint checks one endpoint's address, engine and metrics URL; its
// error starts with the field's name.
func checkEndpoint(ep EndpointConfig) error {
	if ep.Address == "" {
		return errors.New("address is required (host:port)")
	}
	if err := checkHostPort(ep.Address); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	if ep.Address[0] == ':' {
		return fmt.Errorf("address: %q has no host", ep.Address)
	}
	if ep.Engine != "" {
		if _, ok := scrape.BuiltinMap(strings.ToLower(ep.Engine)); !ok {
			return fmt.Errorf("engine: %q is not one of %s", ep.Engine, strings.Join(scrape.BuiltinEngines(), ", "))
		}
	}
	if ep.MetricsURL != "" {
		u, err := url.Parse(ep.MetricsURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("metricsURL: %q is not an http or https URL", ep.MetricsURL)
		}
	}
	return nil
}

// checkHostPort reports whether addr is host:port with a numeric port, as
// net.Dial and net.Listen take it ("" host: every interface).
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// LoadConfig reads and parses the configuration file at path.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(b)
}

func (c *Config) defaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = picker.Duration(10 * time.Second)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = picker.Duration(120 * time.Second)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = picker.Duration(60 * time.Second)
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
}
