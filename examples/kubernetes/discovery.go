package kubediscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	listersv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/inferroute/inferroute/signals"
)

// Labels read from an EndpointSlice. The EndpointSlice controller copies a
// Service's labels onto its slices, so setting them on the Service is
// enough.
const (
	// LabelModel names the base model the endpoints serve.
	LabelModel = "inferroute.io/model"
	// LabelEngine names the model server ("vllm", "sglang", …), which
	// selects the metric names the scraper reads.
	LabelEngine = "inferroute.io/engine"
	// LabelServiceName is set on every slice by Kubernetes: the Service it
	// belongs to (https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/).
	LabelServiceName = discoveryv1.LabelServiceName
	// LabelGPU on a slice is copied onto each of its endpoints: it names
	// the pods' GPU, which gives the picker their speed (see
	// signals.Endpoint.RelativeSpeed). Set it on a Service whose pods all
	// run on one GPU type; it takes precedence over Config.GPUNodeLabels.
	LabelGPU = signals.LabelGPU
	// LabelRelativeSpeed on a slice is copied onto each of its endpoints,
	// as LabelGPU is: the pods' prefill speed relative to an A100.
	LabelRelativeSpeed = signals.LabelRelativeSpeed
)

// Node labels that name a node's GPU, for Config.GPUNodeLabels.
const (
	// NodeLabelGPUProduct is set by NVIDIA GPU Feature Discovery (part of
	// the GPU Operator), e.g. "NVIDIA-H100-80GB-HBM3"
	// (https://github.com/NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery).
	NodeLabelGPUProduct = "nvidia.com/gpu.product"
	// NodeLabelGKEAccelerator is set by GKE on GPU nodes, e.g. "nvidia-l4"
	// (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus).
	NodeLabelGKEAccelerator = "cloud.google.com/gke-accelerator"
)

// DefaultGPUNodeLabels returns the node labels kubepickerd reads a pod's
// GPU from by default: NodeLabelGPUProduct, then NodeLabelGKEAccelerator.
func DefaultGPUNodeLabels() []string {
	return []string{NodeLabelGPUProduct, NodeLabelGKEAccelerator}
}

// Labels Discovery sets on each signals.Endpoint, for filters and scorers.
// It also sets signals.LabelGPU and signals.LabelRelativeSpeed from the
// slice's LabelGPU and LabelRelativeSpeed, or else signals.LabelGPU from
// the node (Config.GPUNodeLabels).
const (
	// EndpointLabelZone is the endpoint's zone, from the slice's zone field.
	EndpointLabelZone = "topology.kubernetes.io/zone"
	// EndpointLabelNode is the node the pod runs on.
	EndpointLabelNode = "kubernetes.io/hostname"
	// EndpointLabelService is the Service the endpoint belongs to.
	EndpointLabelService = LabelServiceName
)

// Sink receives the ready endpoints after every change. picker.Picker,
// scrape.Scraper and prefix.Index (through SinkFunc(index.Retain)) are
// sinks. SetEndpoints must not retain or modify the slice it is given
// beyond the call (the picker and scraper copy it) and must not block.
type Sink interface {
	SetEndpoints(eps []*signals.Endpoint)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(eps []*signals.Endpoint)

// SetEndpoints calls f(eps).
func (f SinkFunc) SetEndpoints(eps []*signals.Endpoint) { f(eps) }

// Config selects the EndpointSlices to watch and how to read them. The
// zero value of each field means its default.
type Config struct {
	// Namespace to watch; "" means every namespace.
	Namespace string
	// Selector is a label selector on EndpointSlices, such as
	// "kubernetes.io/service-name=vllm-llama" or "app=vllm"; "" selects
	// every slice in the namespace.
	Selector string
	// PortName is the name of the slice port requests go to; "" means the
	// first port with a number.
	PortName string
	// MetricsPortName is the name of the port serving /metrics; "" means
	// the request port (vLLM and SGLang serve both on one port).
	MetricsPortName string
	// MetricsPath is the metrics page path; "" means /metrics.
	MetricsPath string
	// Engine is the model server kind of slices without LabelEngine; ""
	// means vLLM.
	Engine string
	// GPUNodeLabels are node labels that name a GPU (such as
	// DefaultGPUNodeLabels), tried in order: the value of the first one an
	// endpoint's node carries becomes the endpoint's signals.LabelGPU,
	// which gives the picker the pod's speed class. Without it every pod
	// counts as equally fast until the latency predictor has learned
	// otherwise, and a mixed fleet is routed as if it were uniform at
	// first. signals.GPURelativeSpeed reads both default labels' values;
	// a value it does not know leaves the speed unlabelled. A slice's
	// own LabelGPU or LabelRelativeSpeed takes precedence. Empty means
	// nodes are not read. Reading them watches Nodes, which needs get,
	// list and watch on nodes, cluster-wide; the cache keeps only each
	// node's name and these labels.
	GPUNodeLabels []string
	// Resync is the informers' resync period; 0 means none.
	Resync time.Duration
	// Logger logs changes of the endpoint set. Default: discard.
	Logger *slog.Logger
}

// Discovery watches EndpointSlices selected by labels with a client-go
// informer and feeds the ready endpoints to its sinks.
//
// The *signals.Endpoint of a pod is kept across updates, as long as the pod
// keeps its address, port and spec (model, engine, zone, node): its live
// counters (in-flight requests, dispatched and completed totals) and its
// scraped metrics survive slice updates, readiness flaps and resyncs. An
// endpoint that turns not ready leaves the sinks' set but is remembered, so
// it comes back as the same object; one that leaves every slice is
// forgotten. A pod whose address changes (recreated under the same name)
// is a new server process with empty caches, so it gets a new
// *signals.Endpoint and the old one is dropped. Requests still in flight to
// a dropped endpoint finish normally: their Done holds the old object.
//
// Discovery is safe for concurrent use. Run drives it; Endpoints reads the
// current set.
type Discovery struct {
	cfg      Config
	selector labels.Selector
	sinks    []Sink
	log      *slog.Logger

	factory informers.SharedInformerFactory
	lister  listersv1.EndpointSliceLister
	synced  []cache.InformerSynced // the slices' and, with GPUNodeLabels, the nodes'

	nodeFactory informers.SharedInformerFactory // nil without GPUNodeLabels
	nodes       corelisters.NodeLister

	dirty chan struct{}
	first chan struct{} // closed once the first set is published
	once  sync.Once

	syncMu  sync.Mutex        // serialises Sync, so sets are published in order
	known   map[string]*entry // by identity (pod or address); guarded by syncMu
	version uint64            // guarded by syncMu

	mu      sync.Mutex
	current []*signals.Endpoint // guarded by mu
}

// entry is one remembered endpoint.
type entry struct {
	ep          *signals.Endpoint
	fingerprint string
}

// New returns a Discovery of the slices cfg selects, through client,
// feeding sinks. It starts nothing: call Run.
func New(client kubernetes.Interface, cfg Config, sinks ...Sink) (*Discovery, error) {
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubediscovery: selector %q: %w", cfg.Selector, err)
	}
	if cfg.MetricsPath == "" {
		cfg.MetricsPath = "/metrics"
	}
	if !strings.HasPrefix(cfg.MetricsPath, "/") {
		return nil, fmt.Errorf("kubediscovery: metrics path %q must start with /", cfg.MetricsPath)
	}
	d := &Discovery{
		cfg:      cfg,
		selector: sel,
		sinks:    sinks,
		log:      cfg.Logger,
		dirty:    make(chan struct{}, 1),
		first:    make(chan struct{}),
		known:    make(map[string]*entry),
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	opts := []informers.SharedInformerOption{
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = cfg.Selector }),
	}
	if cfg.Namespace != "" {
		opts = append(opts, informers.WithNamespace(cfg.Namespace))
	}
	d.factory = informers.NewSharedInformerFactoryWithOptions(client, cfg.Resync, opts...)
	inf := d.factory.Discovery().V1().EndpointSlices()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.markDirty() },
		UpdateFunc: func(any, any) { d.markDirty() },
		DeleteFunc: func(any) { d.markDirty() },
	}); err != nil {
		return nil, fmt.Errorf("kubediscovery: %w", err)
	}
	d.lister = inf.Lister()
	d.synced = append(d.synced, inf.Informer().HasSynced)
	if len(cfg.GPUNodeLabels) > 0 {
		if err := d.watchNodes(client); err != nil {
			return nil, fmt.Errorf("kubediscovery: %w", err)
		}
	}
	return d, nil
}

// watchNodes sets up the Node informer that GPUNodeLabels needs. Nodes are
// cluster-scoped: their factory has neither the namespace nor the slices'
// selector. The transform keeps each node's name and the GPU labels only,
// so the cache holds those rather than whole Node objects with their
// status; a node's update marks the set dirty only when one of those
// labels changed (node status updates arrive often and change nothing
// here).
func (d *Discovery) watchNodes(client kubernetes.Interface) error {
	keys := d.cfg.GPUNodeLabels
	trim := func(obj any) (any, error) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return obj, nil // not a Node: nothing to trim (tombstones are not passed here)
		}
		var kept map[string]string
		for _, k := range keys {
			if v, ok := n.Labels[k]; ok {
				if kept == nil {
					kept = make(map[string]string, len(keys))
				}
				kept[k] = v
			}
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: kept,
		}}, nil
	}
	d.nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, d.cfg.Resync, informers.WithTransform(trim))
	inf := d.nodeFactory.Core().V1().Nodes()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.markDirty() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || d.nodeGPU(o) != d.nodeGPU(c) {
				d.markDirty()
			}
		},
		DeleteFunc: func(any) { d.markDirty() },
	}); err != nil {
		return err
	}
	d.nodes = inf.Lister()
	d.synced = append(d.synced, inf.Informer().HasSynced)
	return nil
}

// nodeGPU returns the value of the first of GPUNodeLabels that n carries,
// or "".
func (d *Discovery) nodeGPU(n *corev1.Node) string {
	for _, k := range d.cfg.GPUNodeLabels {
		if v := n.Labels[k]; v != "" {
			return v
		}
	}
	return ""
}

// gpuOfNode returns the GPU the node named name carries, or "" when the
// node is unknown, carries none, or nodes are not read.
func (d *Discovery) gpuOfNode(name string) string {
	if d.nodes == nil || name == "" {
		return ""
	}
	n, err := d.nodes.Get(name)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			d.log.Warn("kubediscovery: reading node", "node", name, "err", err)
		}
		return ""
	}
	return d.nodeGPU(n)
}

func (d *Discovery) markDirty() {
	select {
	case d.dirty <- struct{}{}:
	default:
	}
}

// Synced returns a channel closed once Run has published its first
// endpoint set from a synced cache: until then the sinks know no
// endpoint, and a server built on them should not report itself ready.
func (d *Discovery) Synced() <-chan struct{} { return d.first }

// Run starts the informer, waits for its cache to fill, publishes the
// first endpoint set, and then republishes after every change until ctx is
// done. It blocks: run it in its own goroutine. It returns an error if the
// cache never synced, else nil when ctx ends.
func (d *Discovery) Run(ctx context.Context) error {
	d.factory.Start(ctx.Done())
	defer d.factory.Shutdown()
	if d.nodeFactory != nil {
		d.nodeFactory.Start(ctx.Done())
		defer d.nodeFactory.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), d.synced...) {
		return errors.New("kubediscovery: EndpointSlice or Node cache did not sync")
	}
	for {
		if err := d.Sync(); err != nil {
			d.log.Warn("kubediscovery: listing slices", "err", err)
		} else {
			d.once.Do(func() { close(d.first) })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-d.dirty:
		}
	}
}

// Sync rebuilds the endpoint set from the informer's cache now and
// publishes it to the sinks if it changed. Run calls it after every event;
// it is exported for callers that drive the informer themselves. Syncs are
// serialised, the cache listing included, so concurrent Syncs publish the
// sets in the order of the cache they read and sinks see them in order; a
// sink may call Endpoints.
func (d *Discovery) Sync() error {
	// List under the lock: a Sync that listed an older cache must not
	// publish (and forget pods) after one that listed a newer cache.
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	var slicesList []*discoveryv1.EndpointSlice
	var err error
	if d.cfg.Namespace != "" {
		slicesList, err = d.lister.EndpointSlices(d.cfg.Namespace).List(d.selector)
	} else {
		slicesList, err = d.lister.List(d.selector)
	}
	if err != nil {
		return err
	}
	// Slices come from a map: sort for a stable endpoint order.
	slices.SortFunc(slicesList, func(a, b *discoveryv1.EndpointSlice) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})

	seen := make(map[string]bool, len(d.known))
	var ready []*signals.Endpoint
	for _, s := range slicesList {
		for _, c := range d.candidates(s) {
			if seen[c.id] {
				continue // the same pod listed in two slices during a rebalance
			}
			seen[c.id] = true
			e, ok := d.known[c.id]
			if !ok || e.fingerprint != c.fingerprint {
				if ok {
					d.log.Info("kubediscovery: endpoint replaced", "id", c.id, "old", e.ep.Address, "new", c.spec.Address)
				}
				e = &entry{ep: signals.NewEndpoint(c.spec), fingerprint: c.fingerprint}
				d.known[c.id] = e
			}
			if c.ready {
				ready = append(ready, e.ep)
			}
		}
	}
	for id := range d.known {
		if !seen[id] {
			delete(d.known, id)
		}
	}
	d.mu.Lock()
	same := slices.Equal(ready, d.current) && d.version > 0
	if !same {
		d.current = ready
	}
	d.mu.Unlock()
	if same {
		return nil
	}
	d.version++
	d.log.Info("kubediscovery: endpoints", "ready", len(ready), "known", len(d.known))
	for _, s := range d.sinks {
		s.SetEndpoints(ready)
	}
	return nil
}

// Endpoints returns the ready endpoints last published. The slice must not
// be modified.
func (d *Discovery) Endpoints() []*signals.Endpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.current
}

// candidate is one endpoint read from a slice.
type candidate struct {
	id          string
	fingerprint string
	spec        signals.EndpointSpec
	ready       bool
}

// candidates reads the usable endpoints of a slice: those with an address
// and a port of the configured name.
func (d *Discovery) candidates(s *discoveryv1.EndpointSlice) []candidate {
	port, ok := findPort(s.Ports, d.cfg.PortName)
	if !ok {
		return nil
	}
	metricsPort := port
	if d.cfg.MetricsPortName != "" {
		if metricsPort, ok = findPort(s.Ports, d.cfg.MetricsPortName); !ok {
			return nil
		}
	}
	engine := s.Labels[LabelEngine]
	if engine == "" {
		engine = d.cfg.Engine
	}
	model := s.Labels[LabelModel]
	service := s.Labels[LabelServiceName]
	sliceGPU, sliceSpeed := s.Labels[LabelGPU], s.Labels[LabelRelativeSpeed]
	var out []candidate
	for _, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		// Addresses are fungible and "consumers may choose to only use the
		// first element" (discovery/v1 Endpoint.addresses).
		host := e.Addresses[0]
		addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
		id := "addr/" + addr
		name := addr
		if ref := e.TargetRef; ref != nil && ref.Name != "" {
			id = strings.ToLower(ref.Kind) + "/" + ref.Namespace + "/" + ref.Name
			name = ref.Name
		}
		lbls := map[string]string{}
		if e.Zone != nil && *e.Zone != "" {
			lbls[EndpointLabelZone] = *e.Zone
		}
		if e.NodeName != nil && *e.NodeName != "" {
			lbls[EndpointLabelNode] = *e.NodeName
		}
		if service != "" {
			lbls[EndpointLabelService] = service
		}
		switch {
		case sliceGPU != "" || sliceSpeed != "":
			if sliceGPU != "" {
				lbls[signals.LabelGPU] = sliceGPU
			}
			if sliceSpeed != "" {
				lbls[signals.LabelRelativeSpeed] = sliceSpeed
			}
		case e.NodeName != nil:
			if gpu := d.gpuOfNode(*e.NodeName); gpu != "" {
				lbls[signals.LabelGPU] = gpu
			}
		}
		spec := signals.EndpointSpec{
			Name:    name,
			Address: addr,
			Engine:  engine,
			Model:   model,
			Labels:  lbls,
		}
		if metricsPort != port || d.cfg.MetricsPath != "/metrics" {
			spec.MetricsURL = "http://" + net.JoinHostPort(host, strconv.Itoa(int(metricsPort))) + d.cfg.MetricsPath
		}
		out = append(out, candidate{
			id:          id,
			fingerprint: fingerprint(spec),
			spec:        spec,
			// "A nil value should be interpreted as true" (discovery/v1
			// EndpointConditions.ready).
			ready: e.Conditions.Ready == nil || *e.Conditions.Ready,
		})
	}
	return out
}

// findPort returns the number of the port named name, or of the first
// numbered port when name is "".
func findPort(ports []discoveryv1.EndpointPort, name string) (int32, bool) {
	for _, p := range ports {
		if p.Port == nil {
			continue
		}
		if name == "" || (p.Name != nil && *p.Name == name) {
			return *p.Port, true
		}
	}
	return 0, false
}

// fingerprint renders the parts of a spec that, when changed, call for a
// new Endpoint (its spec is immutable).
func fingerprint(s signals.EndpointSpec) string {
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s|%s", s.Name, s.Address, s.MetricsURL, s.Engine, s.Model)
	for _, k := range keys {
		fmt.Fprintf(&b, "|%s=%s", k, s.Labels[k])
	}
	return b.String()
}
