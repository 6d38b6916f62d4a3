package emulator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Defaults of Options.
const (
	// DefaultProfile is the engine profile of a pod whose Options name none.
	DefaultProfile = "h100-llama3-8b"
	// DefaultModel is the served base model name.
	DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"
	// DefaultMaxTokens is the output length of a request without
	// max_tokens, when the context the prompt leaves is at least that.
	DefaultMaxTokens = 64
	// DefaultMaxRequests bounds the inference requests one pod serves.
	DefaultMaxRequests = 1 << 20
	// DefaultLifetime is how long a pod runs before it stops by itself.
	DefaultLifetime = 15 * time.Minute
	// DefaultMaxModelLen is the context length advertised by /v1/models
	// and enforced on prompt plus max_tokens: Llama 3.1's 131072 would
	// never bind on an emulated pod, so vLLM's --max-model-len 8192, a
	// common serving setting, is used.
	DefaultMaxModelLen = 8192
)

// Faults are failures a pod injects. The zero value injects none.
type Faults struct {
	// FailAfter, when positive, makes every inference request after the
	// first FailAfter ones (counted since the pod was created) answer 500
	// with vLLM's error shape, as an engine that died behind a live HTTP
	// server does.
	FailAfter int
	// Hang makes inference requests hang: the body is read and nothing is
	// answered until the client goes away or the pod stops.
	Hang bool
	// SlowDown multiplies the wall time of every engine step (thermal
	// throttling, a noisy neighbour). Values below 1 mean no slow-down.
	SlowDown float64
	// DieMidStream, when positive, cuts the connection of a streaming
	// response after DieMidStream content chunks, without an SSE error or
	// [DONE], as a pod that crashes mid-stream does.
	DieMidStream int
}

// Options configure one Pod. The zero value of every field means its
// default.
type Options struct {
	// Name identifies the pod in endpoints, logs and responses; "" means
	// the profile name and the port.
	Name string
	// Profile names the engine profile (engine.ProfileByName); "" means
	// DefaultProfile. Ignored when Engine.Profile is set.
	Profile string
	// Engine configures the engine model; a zero Engine.Profile means
	// engine.DefaultConfig of Profile (vLLM's defaults, prefix caching on).
	Engine engine.Config
	// MaxLoRAs is the number of adapter slots per batch when Engine is not
	// given; 0 means vLLM's default of 1.
	MaxLoRAs int
	// Model is the served base model; "" means DefaultModel.
	Model string
	// Adapters are the LoRA adapters loaded on the pod; a request may name
	// one of them or the base model.
	Adapters []string
	// Speed is the virtual seconds of engine time per wall-clock second:
	// 2 runs the engine twice as fast as the modelled GPU. 0 means 1.
	Speed float64
	// Addr is the listen address; "" means 127.0.0.1 on a free port. Only
	// loopback addresses are accepted.
	Addr string
	// MaxModelLen bounds prompt plus max_tokens; 0 means DefaultMaxModelLen.
	MaxModelLen int
	// DefaultMaxTokens is the output length of a request without
	// max_tokens (finish reason "stop"); 0 means DefaultMaxTokens. When the
	// prompt leaves less of MaxModelLen, the answer takes what is left
	// (finish reason "length"), as vLLM's default max_tokens does.
	DefaultMaxTokens int
	// MaxRequests bounds the inference requests the pod serves; later ones
	// get 503. 0 means DefaultMaxRequests.
	MaxRequests int
	// Lifetime is how long the pod runs before it closes by itself; 0
	// means DefaultLifetime.
	Lifetime time.Duration
	// Faults are the failures injected from the start.
	Faults Faults
	// Logger receives the pod's lifecycle messages; nil means discard.
	Logger *slog.Logger
}

// Pod is one emulated vLLM server. Its methods are safe for concurrent use.
// A Pod must be created with Start.
type Pod struct {
	opts   Options
	name   string
	addr   string
	model  string
	speed  float64
	log    *slog.Logger
	hasher *prefix.Hasher
	start  time.Time

	faults   atomic.Pointer[Faults]
	received atomic.Int64 // inference requests received, for FailAfter and MaxRequests
	nextID   atomic.Uint64

	mu     sync.Mutex // guards everything below
	eng    *engine.Engine
	jobs   map[*engine.Request]*job
	vt     time.Duration // virtual time at the end of the engine's last step
	srv    *http.Server
	up     bool
	closed bool
	ttft   histogram
	// ok counts vllm:request_success_total since the last restart, by
	// finish reason: ok[0] "length", ok[1] "stop" (finishReasons).
	ok    [2]uint64
	kills int

	wake    chan struct{}
	stop    chan struct{} // closed by Close
	stopped chan struct{} // closed when the engine loop has returned
	serving sync.WaitGroup
}

// ErrNotLoopback is returned by Start for an Options.Addr that is not a
// loopback address.
var ErrNotLoopback = errors.New("emulator: listen address must be on 127.0.0.1")

// Start creates a pod, binds its listener and starts serving. The pod
// stops when ctx is done, when Close is called, or after Options.Lifetime.
// It fails for an unknown profile, an invalid engine configuration, a
// non-loopback address, or a listener that cannot be bound.
func Start(ctx context.Context, opts Options) (p *Pod, err error) {
	cfg := opts.Engine
	if cfg.Profile.Name == "" {
		name := opts.Profile
		if name == "" {
			name = DefaultProfile
		}
		prof, ok := engine.ProfileByName(name)
		if !ok {
			return nil, fmt.Errorf("emulator: unknown profile %q", name)
		}
		cfg = engine.DefaultConfig(prof)
		cfg.MaxLoRAs = opts.MaxLoRAs
	}
	opts.Profile = cfg.Profile.Name
	if opts.Speed <= 0 {
		opts.Speed = 1
	}
	if opts.MaxModelLen <= 0 {
		opts.MaxModelLen = DefaultMaxModelLen
	}
	if opts.DefaultMaxTokens <= 0 {
		opts.DefaultMaxTokens = DefaultMaxTokens
	}
	if opts.MaxRequests <= 0 {
		opts.MaxRequests = DefaultMaxRequests
	}
	if opts.Lifetime <= 0 {
		opts.Lifetime = DefaultLifetime
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) {
		return nil, fmt.Errorf("%w: %q", ErrNotLoopback, opts.Addr)
	}
	var eng *engine.Engine
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("emulator: engine config: %v", r)
			}
		}()
		eng = engine.New(cfg)
	}()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	p = &Pod{
		opts:    opts,
		addr:    ln.Addr().String(),
		model:   opts.Model,
		speed:   opts.Speed,
		log:     opts.Logger,
		hasher:  prefix.NewHasher(prefix.HashConfig{}),
		start:   time.Now(),
		eng:     eng,
		jobs:    make(map[*engine.Request]*job),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	if p.model == "" {
		p.model = DefaultModel
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.name = opts.Name
	if p.name == "" {
		p.name = fmt.Sprintf("%s-%d", opts.Profile, ln.Addr().(*net.TCPAddr).Port)
	}
	f := opts.Faults
	p.faults.Store(&f)
	p.ttft.init(ttftBuckets)
	p.mu.Lock()
	p.serveLocked(ln)
	p.mu.Unlock()
	go p.loop()
	go func() {
		t := time.NewTimer(opts.Lifetime)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			p.log.Info("emulated pod reached its lifetime", "pod", p.name)
		case <-p.stop:
			return
		}
		p.Close()
	}()
	return p, nil
}

// serveLocked starts an HTTP server on ln. p.mu must be held.
func (p *Pod) serveLocked(ln net.Listener) {
	srv := &http.Server{
		Handler:           p.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.srv = srv
	p.up = true
	p.serving.Add(1)
	go func() {
		defer p.serving.Done()
		_ = srv.Serve(ln)
	}()
}

// Name returns the pod's name.
func (p *Pod) Name() string { return p.name }

// Addr returns the pod's host:port. It stays the same across Kill and
// Restart.
func (p *Pod) Addr() string { return p.addr }

// URL returns the pod's base URL, http://Addr.
func (p *Pod) URL() string { return "http://" + p.addr }

// Profile returns the name of the pod's engine profile.
func (p *Pod) Profile() string { return p.opts.Profile }

// Model returns the served base model.
func (p *Pod) Model() string { return p.model }

// Spec returns the endpoint description of the pod for the library: its
// name, address, engine "vllm", model, adapters and the latency
// predictor's GPU label (signals.LabelGPU) holding the profile name, as the
// simulator labels its pods. The Adapters slice is fresh.
func (p *Pod) Spec() signals.EndpointSpec {
	return signals.EndpointSpec{
		Name:     p.name,
		Address:  p.addr,
		Engine:   "vllm",
		Model:    p.model,
		Adapters: append([]string(nil), p.opts.Adapters...),
		Labels:   map[string]string{signals.LabelGPU: p.opts.Profile},
	}
}

// Faults returns the failures currently injected.
func (p *Pod) Faults() Faults { return *p.faults.Load() }

// SetFaults replaces the injected failures; requests already past the
// checks keep the faults they saw.
func (p *Pod) SetFaults(f Faults) { p.faults.Store(&f) }

// Up reports whether the pod is listening.
func (p *Pod) Up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

// Received returns the number of inference requests the pod has received
// since it was created (across restarts).
func (p *Pod) Received() int64 { return p.received.Load() }

// Stats returns the engine's current metric values.
func (p *Pod) Stats() engine.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.eng.Stats()
}

// ErrKilled is the error of requests cut by Kill or Close.
var ErrKilled = errors.New("emulator: pod killed")

// Kill stops the pod abruptly, as a crashed process: the listener and all
// connections are closed (new connections are refused, responses in
// flight break off), and the engine loses its queue, caches and counters.
// Killing a pod that is down does nothing. It does not block on requests
// in flight.
func (p *Pod) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *Pod) killLocked() {
	if !p.up {
		return
	}
	p.up = false
	p.kills++
	_ = p.srv.Close()
	for _, j := range p.jobs {
		j.fail(ErrKilled)
	}
	clear(p.jobs)
	p.eng.Reset()
	p.ttft.reset()
	p.ok = [2]uint64{}
	p.log.Info("emulated pod killed", "pod", p.name)
}

// Restart brings a killed pod back on the same address with empty caches
// and counters. Restarting a pod that is up does nothing. It fails when the
// pod is closed or the port cannot be bound again.
func (p *Pod) Restart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("emulator: pod closed")
	}
	if p.up {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("emulator: restart: %w", err)
	}
	p.serveLocked(ln)
	p.log.Info("emulated pod restarted", "pod", p.name)
	return nil
}

// Close stops the pod for good and waits for its goroutines. It is
// idempotent.
func (p *Pod) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.stopped
		return
	}
	p.closed = true
	p.killLocked()
	close(p.stop)
	p.mu.Unlock()
	<-p.stopped
	p.serving.Wait()
}

// Done returns a channel closed when the pod has stopped for good.
func (p *Pod) Done() <-chan struct{} { return p.stopped }

// vnowLocked returns the virtual time of an event now: the wall clock
// since the start times Speed, or the end of the engine's last step when
// that is later (a step stretched by the SlowDown fault). p.mu must be
// held.
func (p *Pod) vnowLocked() time.Duration {
	return max(p.vt, time.Duration(float64(time.Since(p.start))*p.speed))
}

// loop runs the engine: plan a step, wait until its end, apply it, deliver
// its events. Steps follow each other on the pod's own timeline while the
// engine has work, as a GPU runs them back to back: each starts where the
// last ended (p.vt) and ends, on the wall clock, at the pod's start plus
// its virtual end over Speed (a step's duration times the SlowDown fault).
// The loop waits for that deadline rather than sleeping each step's
// duration, so when the process is descheduled for a while (a busy
// machine) the late steps run at once until the pod has caught up: the
// stall delays tokens by as long as it lasted instead of taking that much
// GPU time from the pod for good, and the loop's own overhead is not lost
// at every step either. A step after an idle spell starts at the time of
// the wake-up.
func (p *Pod) loop() {
	defer close(p.stopped)
	var evs []engine.Event
	var timer *time.Timer
	busy := false // the last step ended at p.vt and the engine had work
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		at := p.vt
		if !busy {
			at = p.vnowLocked()
		}
		d, ok := p.eng.StartStep(at)
		kills := p.kills
		p.mu.Unlock()
		if !ok {
			busy = false
			select {
			case <-p.wake:
				continue
			case <-p.stop:
				return
			}
		}
		end := at + d
		if s := p.faults.Load().SlowDown; s > 1 {
			end = at + time.Duration(float64(d)*s)
		}
		if wait := time.Until(p.start.Add(time.Duration(float64(end) / p.speed))); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-p.stop:
				timer.Stop()
				return
			}
		}
		p.mu.Lock()
		if p.kills != kills {
			// Reset dropped the planned step.
			busy = false
			p.mu.Unlock()
			continue
		}
		p.vt = max(p.vt, end)
		evs = p.eng.FinishStep(at+d, evs[:0])
		p.deliverLocked(evs)
		busy = true
		p.mu.Unlock()
		clear(evs)
	}
}

// deliverLocked credits one token to every request in decode, then applies
// the step's events. p.mu must be held.
func (p *Pod) deliverLocked(evs []engine.Event) {
	now := time.Now()
	for _, j := range p.jobs {
		j.decodeStep()
	}
	for i := range evs {
		ev := &evs[i]
		j := p.jobs[ev.Req]
		if j == nil {
			continue
		}
		switch ev.Kind {
		case engine.FirstToken:
			p.ttft.observe(now.Sub(j.arrived).Seconds())
			j.firstToken(ev.CachedTokens)
		case engine.Preempted:
			j.preempted()
		case engine.Finished:
			delete(p.jobs, ev.Req)
			p.ok[j.finishStop()]++
			j.finish(ev.CachedTokens)
		}
	}
}

// submit adds j to the engine. It fails with ErrKilled when the pod is
// down and with the engine's ErrTooLarge or ErrInvalid.
func (p *Pod) submit(j *job) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		return ErrKilled
	}
	if err := p.eng.Add(p.vnowLocked(), &j.req); err != nil {
		return err
	}
	p.jobs[&j.req] = j
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}
