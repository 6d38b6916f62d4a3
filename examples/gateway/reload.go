package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
)

// Reload applies cfg, a parsed configuration, to the running gateway:
// pools added, removed or changed (models, adapters, aliases, the picker's
// configuration, admission control, endpoints), the log level, the access
// log on or off, the API keys and the pools' upstream keys, read again
// from their files, and the TLS certificate, read again from its files.
// Every part is built and checked before any is applied, so a
// configuration that fails (an unknown scorer, a model served by two
// pools, a bad admission parameter, a keys file that cannot be read, a
// private key that does not match its certificate) leaves the gateway as it
// was, and the error says why. Then the parts are swapped in together.
//
// An endpoint whose name and settings are unchanged keeps its live state:
// its scraped metrics, requests in flight, health, and what the pool's
// prefix index and latency predictor learnt of it. One whose address,
// engine, model, adapters, labels or metrics URL changed starts afresh, as
// a new pod would. A pool that stays keeps its index and predictor (the
// predictor takes the picker's new staleness half-life); a removed
// pool's requests in flight finish where they were sent, and its series
// of picks, completions and prefix-index gauges leave /metrics.
//
// The settings the server, proxy and scraper were built with (listen,
// readHeaderTimeout, idleTimeout, drainTimeout, shutdownDelay, router, scrape, and
// turning tls on or off) take effect at the next start: Reload applies
// the rest, logs a warning naming each of them, and keeps their running
// values as the configuration in force. Reloads are serialised; requests
// are served throughout.
func (g *Gateway) Reload(cfg Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.reload(cfg)
	g.recordReload(err)
	return err
}

// staged is one pool of a reload, built and checked but not yet applied.
type staged struct {
	p     *pool
	fresh bool // a pool the reload adds
	pc    PoolConfig
	pcfg  picker.Config
	adm   *scorer.SLOAdmitter
	eps   []*signals.Endpoint
	added int // endpoints new to the pool
}

func (g *Gateway) reload(cfg Config) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("logLevel: %w", err)
	}
	var restart []string
	for _, s := range restartSettings {
		if !s.same(&g.cfg, &cfg) {
			restart = append(restart, s.name)
			s.keep(&cfg, &g.cfg)
		}
	}

	// Build and check everything first.
	var cert *tls.Certificate
	if cfg.TLS != nil {
		var err error
		if cert, err = loadCert(cfg.TLS); err != nil {
			return err
		}
	}
	keys, err := loadKeys(cfg.Auth, g.keys.Load())
	if err != nil {
		return err
	}
	var stages []staged
	var fresh []*pool
	fail := func(err error) error {
		for _, p := range fresh {
			p.close()
		}
		return err
	}
	pools := make(map[string]*pool, len(cfg.Pools))
	for _, pc := range cfg.Pools {
		old := g.pools[pc.Name]
		if old == nil {
			p, err := g.newPool(pc)
			if err != nil {
				return fail(fmt.Errorf("pool %q: %w", pc.Name, err))
			}
			fresh = append(fresh, p)
			pools[pc.Name] = p
			stages = append(stages, staged{p: p, fresh: true, pc: pc, eps: p.eps, added: len(p.eps)})
			continue
		}
		pcfg := pickerConfig(pc)
		if err := old.pk.Check(pcfg); err != nil {
			return fail(fmt.Errorf("pool %q: %w", pc.Name, err))
		}
		adm, err := old.admitter(pc.Admission, pcfg)
		if err != nil {
			return fail(fmt.Errorf("pool %q: %w", pc.Name, err))
		}
		eps := g.endpoints(pc, old.eps)
		added := 0
		for _, ep := range eps {
			if !slices.Contains(old.eps, ep) {
				added++
			}
		}
		pools[pc.Name] = old
		stages = append(stages, staged{p: old, pc: pc, pcfg: pcfg, adm: adm, eps: eps, added: added})
	}
	table, err := g.table(cfg, pools)
	if err != nil {
		return fail(err)
	}

	// Apply. Nothing below fails.
	var all []*signals.Endpoint
	var added, changed []string
	newEps := 0
	for _, s := range stages {
		all = append(all, s.eps...)
		newEps += s.added
		if s.fresh {
			added = append(added, s.pc.Name)
			continue
		}
		if !reflect.DeepEqual(s.p.cfg, s.pc) {
			changed = append(changed, s.pc.Name)
		}
		if err := s.p.pk.Reconfigure(s.pcfg); err != nil {
			// Check accepted this configuration a moment ago, under the lock.
			g.log.Error("config reload: pool's picker configuration refused after its check", "pool", s.pc.Name, "error", err)
		}
		s.p.pred.SetHalfLife(halfLife(s.pcfg))
		s.p.adm.a.Store(s.adm)
		s.p.pk.SetEndpoints(s.eps)
		s.p.eps, s.p.cfg = s.eps, s.pc
	}
	if g.scraper != nil {
		g.scraper.SetEndpoints(all)
	}
	g.eps.Store(&all)
	// The table, which strips the clients' Authorization when keys are
	// on, before the keys that make it a secret.
	g.proxy.SetTable(table)
	g.keys.Store(keys)
	var removed []string
	for name, p := range g.pools {
		if pools[name] == nil {
			removed = append(removed, name)
			// Its endpoints' state goes with it; requests in flight
			// still report to the picker and index they were picked by.
			p.pk.SetEndpoints(nil)
			p.close()
		}
	}
	slices.Sort(removed)
	g.pools = pools
	if cert != nil {
		g.cert.Store(cert)
	}
	if g.level != nil {
		g.level.Set(level)
	}
	g.accessOn.Store(cfg.AccessLog)
	g.cfg = cfg
	for _, name := range restart {
		g.log.Warn("config reload: setting takes effect at restart; the running value stays", "setting", name)
	}
	apiKeys, granted := 0, 0
	if keys != nil {
		apiKeys, granted = len(keys.keys), keys.granted()
	}
	g.log.Info("config reloaded", "pools", len(cfg.Pools), "added", added, "removed", removed,
		"changed", changed, "endpoints", len(all), "new endpoints", newEps, "api keys", apiKeys, "with grants", granted)
	logStray(g.log, keys)
	return nil
}

// restartSettings are the settings the server, the proxy and the
// scraper were built with, which only a restart applies: each with how to
// tell that it changed and how to keep its running value.
var restartSettings = []struct {
	name string
	same func(running, next *Config) bool
	keep func(next, running *Config)
}{
	{"listen", func(r, n *Config) bool { return r.Listen == n.Listen }, func(n, r *Config) { n.Listen = r.Listen }},
	{"readHeaderTimeout", func(r, n *Config) bool { return r.ReadHeaderTimeout == n.ReadHeaderTimeout },
		func(n, r *Config) { n.ReadHeaderTimeout = r.ReadHeaderTimeout }},
	{"idleTimeout", func(r, n *Config) bool { return r.IdleTimeout == n.IdleTimeout }, func(n, r *Config) { n.IdleTimeout = r.IdleTimeout }},
	{"drainTimeout", func(r, n *Config) bool { return r.DrainTimeout == n.DrainTimeout }, func(n, r *Config) { n.DrainTimeout = r.DrainTimeout }},
	{"shutdownDelay", func(r, n *Config) bool { return r.ShutdownDelay == n.ShutdownDelay }, func(n, r *Config) { n.ShutdownDelay = r.ShutdownDelay }},
	{"router", func(r, n *Config) bool { return reflect.DeepEqual(r.Router, n.Router) }, func(n, r *Config) { n.Router = r.Router }},
	{"scrape", func(r, n *Config) bool { return r.Scrape == n.Scrape }, func(n, r *Config) { n.Scrape = r.Scrape }},
	// Turning TLS on or off; a certificate is renewed in place.
	{"tls", func(r, n *Config) bool { return (r.TLS == nil) == (n.TLS == nil) }, func(n, r *Config) { n.TLS = r.TLS }},
}

// initReloadMetrics registers the reload instruments:
// inferroute_gateway_config_reloads_total{result="success"|"failure"} and
// inferroute_gateway_config_last_reload_successful (1 or 0; 1 at start),
// the pair Prometheus itself exports for its own reloads, to alert on a
// configuration that was refused.
func (g *Gateway) initReloadMetrics() error {
	var err error
	if g.reloads, err = g.meter.Int64Counter("inferroute.gateway.config.reloads",
		metric.WithDescription("Configuration reloads (SIGHUP or a changed file), by result.")); err != nil {
		return err
	}
	g.reloadOK = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "success")))
	g.reloadFailed = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "failure")))
	g.lastReloadOK.Store(true)
	last, err := g.meter.Int64ObservableGauge("inferroute.gateway.config.last_reload_successful",
		metric.WithDescription("1 when the last configuration reload was applied (or none was tried), 0 when it was refused."))
	if err != nil {
		return err
	}
	_, err = g.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if g.lastReloadOK.Load() {
			v = 1
		}
		o.ObserveInt64(last, v)
		return nil
	}, last)
	return err
}

// recordReload counts a reload's result; err nil is success.
func (g *Gateway) recordReload(err error) {
	g.lastReloadOK.Store(err == nil)
	if err == nil {
		g.reloads.Add(context.Background(), 1, g.reloadOK)
		return
	}
	g.reloads.Add(context.Background(), 1, g.reloadFailed)
	g.log.Error("config reload refused; the running configuration stays", "error", err)
}

// loadFailed records a reload whose file could not be read or parsed.
func (g *Gateway) loadFailed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recordReload(err)
}

// configLoad is one reading of the configuration file: the configuration
// or why there is none.
type configLoad struct {
	cfg Config
	err error
}

// errEmptyConfig is the error of a reload from an empty file.
var errEmptyConfig = errors.New("configuration file is empty")

// watchConfig reads the configuration file at path and sends it on out
// each time hup delivers (SIGHUP) and, when every is positive, each time
// the file's content, or that of the files it names (watchedFiles: TLS
// certificate and key, API keys, upstream keys), has changed when
// checked, every that often. A file that cannot
// be read or parsed is sent as the error: on a check, once until the
// error or the content changes. On a check an empty file is skipped, as a
// writer that truncates before writing leaves one for a moment (replace
// the file by renaming a complete one into place, as Kubernetes does with
// ConfigMap volumes); on SIGHUP it is an error. fix, when not nil, adjusts
// each parsed configuration as the command line adjusted the first
// (-listen). It returns when ctx is done.
func watchConfig(ctx context.Context, path string, every time.Duration, hup <-chan os.Signal, fix func(*Config), out chan<- configLoad) {
	data, _ := os.ReadFile(path) // the content run started with
	var files []string
	if cfg, err := ParseConfig(data); err == nil {
		files = watchedFiles(cfg)
	}
	last := snapshot(data, files)
	var lastErr string
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-hup:
			forced = true
		case <-tick:
		}
		data, err := os.ReadFile(path)
		if err == nil && len(bytes.TrimSpace(data)) == 0 {
			if !forced {
				continue
			}
			err = errEmptyConfig
		}
		if err != nil {
			if forced || err.Error() != lastErr {
				send(ctx, out, configLoad{err: err})
			}
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		snap := snapshot(data, files)
		if !forced && bytes.Equal(snap, last) {
			continue
		}
		last = snap
		cfg, err := ParseConfig(data)
		if err == nil {
			if fix != nil {
				fix(&cfg)
			}
			if next := watchedFiles(cfg); !slices.Equal(next, files) {
				files, last = next, snapshot(data, next)
			}
		}
		send(ctx, out, configLoad{cfg: cfg, err: err})
	}
}

// watchedFiles are the files c names whose content is configuration: the
// TLS certificate and key, the API keys file and the pools' upstream key
// files.
func watchedFiles(c Config) []string {
	var files []string
	if c.TLS != nil {
		files = append(files, c.TLS.CertFile, c.TLS.KeyFile)
	}
	if c.Auth != nil {
		files = append(files, c.Auth.KeysFile)
	}
	for _, p := range c.Pools {
		if p.UpstreamKeyFile != "" {
			files = append(files, p.UpstreamKeyFile)
		}
	}
	return files
}

// snapshot is what a check compares: data, then the content of each of
// files (nothing for one that cannot be read), so that a renewed
// certificate or a revoked API key is a change of the configuration.
func snapshot(data []byte, files []string) []byte {
	s := bytes.Clone(data)
	for _, f := range files {
		s = append(s, 0)
		if b, err := os.ReadFile(f); err == nil {
			s = append(s, b...)
		}
	}
	return s
}

// send sends l on out unless ctx ends first.
func send(ctx context.Context, out chan<- configLoad, l configLoad) {
	select {
	case out <- l:
	case <-ctx.Done():
	}
}
