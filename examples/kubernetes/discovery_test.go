package kubediscovery_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	kubediscovery "github.com/inferroute/inferroute/examples/kubernetes"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/scrape"
)

const ns = "inference"

// ep describes one endpoint of a test slice.
type ep struct {
	pod   string // "" means no targetRef
	ips   []string
	ready *bool
	zone  string
	node  string
}

func boolp(b bool) *bool    { return &b }
func strp(s string) *string { return &s }

type port struct {
	name string
	num  int32
}

// slice builds an EndpointSlice of service svc.
func slice(name, svc string, ports []port, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			kubediscovery.LabelModel:     "llama-3-8b",
			kubediscovery.LabelEngine:    "vllm",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if ports == nil {
		ports = []port{{name: "http", num: 8000}}
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: strp(p.name), Port: &p.num})
	}
	for _, e := range eps {
		out := discoveryv1.Endpoint{Addresses: e.ips, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}}
		if e.pod != "" {
			out.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod}
		}
		if e.zone != "" {
			out.Zone = strp(e.zone)
		}
		if e.node != "" {
			out.NodeName = strp(e.node)
		}
		s.Endpoints = append(s.Endpoints, out)
	}
	return s
}

// recorder is a sink that forwards a copy of every published set.
type recorder struct{ ch chan []*signals.Endpoint }

func newRecorder() *recorder { return &recorder{ch: make(chan []*signals.Endpoint, 64)} }

func (r *recorder) SetEndpoints(eps []*signals.Endpoint) {
	r.ch <- append([]*signals.Endpoint(nil), eps...)
}

// waitFor reads published sets until one has exactly the named endpoints
// (in any order) and returns it by name.
func (r *recorder) waitFor(t *testing.T, names ...string) map[string]*signals.Endpoint {
	t.Helper()
	want := strings.Join(sorted(names), ",")
	return r.waitUntil(t, "["+want+"]", func(got map[string]*signals.Endpoint) bool {
		return joinNames(got) == want
	})
}

// waitUntil reads published sets until ok accepts one, and returns it by
// name.
func (r *recorder) waitUntil(t *testing.T, what string, ok func(map[string]*signals.Endpoint) bool) map[string]*signals.Endpoint {
	t.Helper()
	var last string
	timeout := time.After(30 * time.Second) // a guard against a hang, not a measurement
	for {
		select {
		case eps := <-r.ch:
			got := map[string]*signals.Endpoint{}
			for _, e := range eps {
				got[e.Name] = e
			}
			if ok(got) {
				return got
			}
			last = joinNames(got)
		case <-timeout:
			require.FailNowf(t, "never published", "want %s, last published [%s]", what, last)
		}
	}
}

// joinNames lists a published set's names, sorted and comma-separated.
func joinNames(set map[string]*signals.Endpoint) string {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	return strings.Join(sorted(names), ",")
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// start runs a Discovery over a fake clientset holding objs and returns
// the clientset once the informers' watches are established (the nodes'
// too with GPUNodeLabels), so that later changes are not lost between a
// list and its watch.
func start(t *testing.T, cfg kubediscovery.Config, sinks []kubediscovery.Sink, objs ...runtime.Object) (*fake.Clientset, *kubediscovery.Discovery) {
	t.Helper()
	client := fake.NewClientset(objs...)
	resources := []string{"endpointslices"}
	if len(cfg.GPUNodeLabels) > 0 {
		resources = append(resources, "nodes")
	}
	var watching []chan struct{}
	for _, r := range resources {
		ch := make(chan struct{})
		watching = append(watching, ch)
		var once sync.Once
		client.PrependWatchReactor(r, func(k8stesting.Action) (bool, watch.Interface, error) {
			once.Do(func() { close(ch) })
			return false, nil, nil
		})
	}
	d, err := kubediscovery.New(client, cfg, sinks...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	for i, ch := range watching {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			require.FailNowf(t, "an informer never started watching", "%s", resources[i])
		}
	}
	return client, d
}

func update(t *testing.T, c *fake.Clientset, s *discoveryv1.EndpointSlice) {
	t.Helper()
	_, err := c.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func create(t *testing.T, c *fake.Clientset, s *discoveryv1.EndpointSlice) {
	t.Helper()
	_, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), s, metav1.CreateOptions{})
	require.NoError(t, err)
}

// TestLifecycle walks one fleet through add, readiness change, a pod that
// changes IP, and delete, with a real picker and scraper as sinks.
func TestLifecycle(t *testing.T) {
	p, err := picker.New(picker.Config{})
	require.NoError(t, err)
	sc, err := scrape.New(scrape.Config{})
	require.NoError(t, err)
	t.Cleanup(sc.Stop)
	rec := newRecorder()
	podA := ep{pod: "vllm-0", ips: []string{"10.0.0.1"}, zone: "us-east1-b", node: "node-1"}
	podB := ep{pod: "vllm-1", ips: []string{"10.0.0.2"}}
	s1 := slice("vllm-abc", "vllm", nil, podA)
	client, d := start(t, kubediscovery.Config{Namespace: ns, Selector: "kubernetes.io/service-name=vllm"},
		[]kubediscovery.Sink{p, sc, rec}, s1)

	// The recorder is the last sink: when it has a set, so have the others.
	set := func() []*signals.Endpoint { return d.Endpoints() }
	checkSinks := func(t *testing.T) {
		assert.ElementsMatch(t, set(), p.Endpoints(), "picker")
		assert.ElementsMatch(t, set(), sc.Endpoints(), "scraper")
	}

	got := rec.waitFor(t, "vllm-0")
	a := got["vllm-0"]
	t.Run("initial", func(t *testing.T) {
		assert.Equal(t, signals.EndpointSpec{
			Name: "vllm-0", Address: "10.0.0.1:8000", Engine: "vllm", Model: "llama-3-8b",
			Labels: map[string]string{
				kubediscovery.EndpointLabelZone:    "us-east1-b",
				kubediscovery.EndpointLabelNode:    "node-1",
				kubediscovery.EndpointLabelService: "vllm",
			},
		}, a.EndpointSpec)
		assert.Equal(t, "http://10.0.0.1:8000/metrics", a.MetricsAddress())
		checkSinks(t)
	})

	// Work in flight on pod a must survive every later update.
	a.Dispatch(100)

	var b *signals.Endpoint
	t.Run("add", func(t *testing.T) {
		create(t, client, slice("vllm-def", "vllm", nil, podB))
		got := rec.waitFor(t, "vllm-0", "vllm-1")
		assert.Same(t, a, got["vllm-0"], "pod a keeps its endpoint")
		b = got["vllm-1"]
		assert.Equal(t, "10.0.0.2:8000", b.Address)
		checkSinks(t)
	})

	t.Run("readiness change", func(t *testing.T) {
		b.Dispatch(10)
		notReady := podB
		notReady.ready = boolp(false)
		update(t, client, slice("vllm-def", "vllm", nil, notReady))
		got := rec.waitFor(t, "vllm-0")
		assert.Same(t, a, got["vllm-0"])
		checkSinks(t)

		ready := podB
		ready.ready = boolp(true)
		update(t, client, slice("vllm-def", "vllm", nil, ready))
		got = rec.waitFor(t, "vllm-0", "vllm-1")
		assert.Same(t, b, got["vllm-1"], "a pod back from not-ready is the same endpoint")
		assert.Equal(t, int64(1), b.InFlight(), "and its counters survived")
		checkSinks(t)
	})

	t.Run("pod changes IP", func(t *testing.T) {
		moved := podA
		moved.ips = []string{"10.0.0.9"}
		update(t, client, slice("vllm-abc", "vllm", nil, moved))
		var got map[string]*signals.Endpoint
		for {
			got = rec.waitFor(t, "vllm-0", "vllm-1")
			if got["vllm-0"].Address == "10.0.0.9:8000" {
				break
			}
		}
		a2 := got["vllm-0"]
		assert.NotSame(t, a, a2, "a new address is a new server: a new endpoint")
		assert.Equal(t, int64(0), a2.InFlight())
		assert.Equal(t, int64(1), a.InFlight(), "the old endpoint keeps its in-flight request until its Done")
		assert.Same(t, b, got["vllm-1"])
		assert.NotContains(t, p.Endpoints(), a)
		assert.NotContains(t, sc.Endpoints(), a)
		checkSinks(t)
		a = a2
	})

	t.Run("delete", func(t *testing.T) {
		require.NoError(t, client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "vllm-def", metav1.DeleteOptions{}))
		got := rec.waitFor(t, "vllm-0")
		assert.Same(t, a, got["vllm-0"])
		checkSinks(t)

		// A deleted endpoint is forgotten: if it comes back it is new.
		create(t, client, slice("vllm-def", "vllm", nil, podB))
		got = rec.waitFor(t, "vllm-0", "vllm-1")
		assert.NotSame(t, b, got["vllm-1"])
		checkSinks(t)
	})
}

func TestSliceReading(t *testing.T) {
	tests := []struct {
		name   string
		cfg    kubediscovery.Config
		slices []*discoveryv1.EndpointSlice
		want   map[string]string // endpoint name → address [metrics URL]
	}{
		{
			name: "selector excludes other services",
			cfg:  kubediscovery.Config{Selector: "kubernetes.io/service-name=vllm"},
			slices: []*discoveryv1.EndpointSlice{
				slice("vllm-1", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}}),
				slice("other-1", "other", nil, ep{pod: "p2", ips: []string{"10.0.0.2"}}),
			},
			want: map[string]string{"p1": "10.0.0.1:8000"},
		},
		{
			name: "nil ready is ready, false is not, no address is skipped",
			slices: []*discoveryv1.EndpointSlice{slice("s", "vllm", nil,
				ep{pod: "p1", ips: []string{"10.0.0.1"}},
				ep{pod: "p2", ips: []string{"10.0.0.2"}, ready: boolp(false)},
				ep{pod: "p3"},
				ep{pod: "p4", ips: []string{"10.0.0.4"}, ready: boolp(true)},
			)},
			want: map[string]string{"p1": "10.0.0.1:8000", "p4": "10.0.0.4:8000"},
		},
		{
			name: "named request and metrics ports",
			cfg:  kubediscovery.Config{PortName: "http", MetricsPortName: "metrics"},
			slices: []*discoveryv1.EndpointSlice{slice("s", "vllm", []port{{"metrics", 9090}, {"http", 8080}},
				ep{pod: "p1", ips: []string{"10.0.0.1"}})},
			want: map[string]string{"p1": "10.0.0.1:8080 http://10.0.0.1:9090/metrics"},
		},
		{
			name: "custom metrics path",
			cfg:  kubediscovery.Config{MetricsPath: "/v2/metrics"},
			slices: []*discoveryv1.EndpointSlice{slice("s", "tgi", nil,
				ep{pod: "p1", ips: []string{"10.0.0.1"}})},
			want: map[string]string{"p1": "10.0.0.1:8000 http://10.0.0.1:8000/v2/metrics"},
		},
		{
			name: "a slice without the named port is skipped",
			cfg:  kubediscovery.Config{PortName: "grpc"},
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}}),
				slice("s2", "vllm", []port{{"grpc", 9000}}, ep{pod: "p2", ips: []string{"10.0.0.2"}}),
			},
			want: map[string]string{"p2": "10.0.0.2:9000"},
		},
		{
			name: "IPv6 and no targetRef",
			slices: []*discoveryv1.EndpointSlice{slice("s", "vllm", nil,
				ep{ips: []string{"fd00::1", "fd00::2"}})},
			want: map[string]string{"[fd00::1]:8000": "[fd00::1]:8000"},
		},
		{
			name: "a pod in two slices during a rebalance counts once",
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}}),
				slice("s2", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}}),
			},
			want: map[string]string{"p1": "10.0.0.1:8000"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := make([]runtime.Object, len(tc.slices))
			for i, s := range tc.slices {
				objs[i] = s
			}
			rec := newRecorder()
			tc.cfg.Namespace = ns
			start(t, tc.cfg, []kubediscovery.Sink{rec}, objs...)
			var names []string
			for n := range tc.want {
				names = append(names, n)
			}
			got := rec.waitFor(t, names...)
			for n, want := range tc.want {
				e := got[n]
				desc := e.Address
				if e.MetricsURL != "" {
					desc += " " + e.MetricsURL
				}
				assert.Equal(t, want, desc, n)
			}
		})
	}
}

func TestEngineDefault(t *testing.T) {
	s := slice("s", "sglang", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}})
	delete(s.Labels, kubediscovery.LabelEngine)
	rec := newRecorder()
	start(t, kubediscovery.Config{Namespace: ns, Engine: "sglang"}, []kubediscovery.Sink{rec}, s)
	got := rec.waitFor(t, "p1")
	assert.Equal(t, "sglang", got["p1"].Engine)
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  kubediscovery.Config
		want string
	}{
		{name: "selector", cfg: kubediscovery.Config{Selector: "a in (b"}, want: "selector"},
		{name: "metrics path", cfg: kubediscovery.Config{MetricsPath: "metrics"}, want: "must start with /"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kubediscovery.New(fake.NewClientset(), tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestManyUpdatesKeepEndpoints scales a slice up one pod at a time: every
// pod keeps its endpoint object through all the later updates.
func TestManyUpdatesKeepEndpoints(t *testing.T) {
	rec := newRecorder()
	client, _ := start(t, kubediscovery.Config{Namespace: ns}, []kubediscovery.Sink{rec},
		slice("s", "vllm", nil))
	first := map[string]*signals.Endpoint{}
	var eps []ep
	var names []string
	for i := range 8 {
		name := fmt.Sprintf("p%d", i)
		eps = append(eps, ep{pod: name, ips: []string{fmt.Sprintf("10.0.1.%d", i+1)}})
		names = append(names, name)
		update(t, client, slice("s", "vllm", nil, eps...))
		got := rec.waitFor(t, names...)
		for n, e := range got {
			if prev, ok := first[n]; ok {
				assert.Same(t, prev, e, "%s after %d updates", n, i)
			} else {
				first[n] = e
			}
		}
	}
}

// TestSynced checks the readiness signal kubepickerd's health service
// waits on: open before Run, closed once the first set from the synced
// cache is published, with that set already in the sinks.
func TestSynced(t *testing.T) {
	p, err := picker.New(picker.Config{})
	require.NoError(t, err)
	s1 := slice("vllm-abc", "vllm", nil, ep{pod: "vllm-0", ips: []string{"10.0.0.1"}})
	cfg := kubediscovery.Config{Namespace: ns, Selector: "kubernetes.io/service-name=vllm"}

	idle, err := kubediscovery.New(fake.NewClientset(s1), cfg, p)
	require.NoError(t, err)
	select {
	case <-idle.Synced():
		t.Fatal("Synced closed before Run")
	default:
	}

	_, d := start(t, cfg, []kubediscovery.Sink{p}, s1)
	select {
	case <-d.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("Synced never closed")
	}
	require.Len(t, p.Endpoints(), 1, "the first set reached the sinks before Synced closed")
	assert.Equal(t, "vllm-0", p.Endpoints()[0].Name)
}
