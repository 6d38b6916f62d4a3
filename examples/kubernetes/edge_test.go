package kubediscovery_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubediscovery "github.com/inferroute/inferroute/examples/kubernetes"
	"github.com/inferroute/inferroute/signals"
)

// seqSink records the sizes of the published sets in publication order
// (sinks are called under Discovery's sync lock).
type seqSink struct {
	mu       sync.Mutex
	sizes    []int
	byName   map[string]*signals.Endpoint
	replaced map[string]bool // pods whose endpoint object changed
}

func (s *seqSink) SetEndpoints(eps []*signals.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizes = append(s.sizes, len(eps))
	if s.byName == nil {
		s.byName, s.replaced = map[string]*signals.Endpoint{}, map[string]bool{}
	}
	for _, e := range eps {
		if prev, ok := s.byName[e.Name]; ok && prev != e {
			s.replaced[e.Name] = true
		}
		s.byName[e.Name] = e
	}
}

// TestConcurrentSyncsPublishInOrder: Sync is exported for callers that
// drive it themselves and documented "Syncs are serialised, so sinks see
// the sets in order": concurrent Syncs never publish a set listed from an
// older cache after one listed from a newer cache. Here a slice only
// grows, one pod per update, while Run and other goroutines call Sync: the
// published sets never shrink, and no pod's *signals.Endpoint is replaced,
// since none changed address or spec.
func TestConcurrentSyncsPublishInOrder(t *testing.T) {
	sink := &seqSink{}
	client, d := start(t, kubediscovery.Config{Namespace: ns}, []kubediscovery.Sink{sink}, slice("s", "vllm", nil))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				assert.NoError(t, d.Sync())
			}
		}()
	}
	var eps []ep
	const pods = 300
	for i := range pods {
		eps = append(eps, ep{pod: fmt.Sprintf("p%d", i), ips: []string{fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)}})
		update(t, client, slice("s", "vllm", nil, eps...))
	}
	deadline := time.Now().Add(30 * time.Second) // a guard against a hang
	for len(d.Endpoints()) != pods && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()

	sink.mu.Lock()
	defer sink.mu.Unlock()
	var regressions []string
	for i := 1; i < len(sink.sizes); i++ {
		if sink.sizes[i] < sink.sizes[i-1] {
			regressions = append(regressions, fmt.Sprintf("#%d: %d after %d", i, sink.sizes[i], sink.sizes[i-1]))
		}
	}
	if len(regressions) > 5 {
		regressions = append(regressions[:5], fmt.Sprintf("... %d in all", len(regressions)))
	}
	assert.Empty(t, regressions, "stale sets published after newer ones (%d publications)", len(sink.sizes))
	// A stale Sync would also forget the pods missing from its old list,
	// so that the next Sync gave them new *signals.Endpoint objects and
	// lost their in-flight counters.
	assert.Zero(t, len(sink.replaced), "pods (of %d) whose endpoint object was replaced without any change", pods)
}

// --- Slice shapes and endpoint conditions.

func withConditions(s *discoveryv1.EndpointSlice, i int, c discoveryv1.EndpointConditions) *discoveryv1.EndpointSlice {
	s.Endpoints[i].Conditions = c
	return s
}

// TestTerminatingAndServing: a terminating pod (ready false, still
// serving) leaves the set; one that only lacks readiness too.
func TestTerminatingAndServing(t *testing.T) {
	s := slice("s", "vllm", nil,
		ep{pod: "p1", ips: []string{"10.0.0.1"}},
		ep{pod: "p2", ips: []string{"10.0.0.2"}},
		ep{pod: "p3", ips: []string{"10.0.0.3"}},
	)
	withConditions(s, 1, discoveryv1.EndpointConditions{Ready: boolp(false), Serving: boolp(true), Terminating: boolp(true)})
	withConditions(s, 2, discoveryv1.EndpointConditions{Ready: boolp(false), Serving: boolp(false), Terminating: boolp(false)})
	rec := newRecorder()
	start(t, kubediscovery.Config{Namespace: ns}, []kubediscovery.Sink{rec}, s)
	rec.waitFor(t, "p1")
}

// TestMultipleSlicesAndPortRename walks two slices of one service
// through a port rename, a move of a pod between slices, and the deletion
// of one slice.
func TestMultipleSlicesAndPortRename(t *testing.T) {
	rec := newRecorder()
	p1 := ep{pod: "p1", ips: []string{"10.0.0.1"}}
	p2 := ep{pod: "p2", ips: []string{"10.0.0.2"}}
	p3 := ep{pod: "p3", ips: []string{"10.0.0.3"}}
	client, _ := start(t, kubediscovery.Config{Namespace: ns, PortName: "http"}, []kubediscovery.Sink{rec},
		slice("s-a", "vllm", nil, p1, p2), slice("s-b", "vllm", nil, p3))
	got := rec.waitFor(t, "p1", "p2", "p3")
	e1, e2, e3 := got["p1"], got["p2"], got["p3"]

	// The port of s-b is renamed: its pods are no longer reachable on "http".
	update(t, client, slice("s-b", "vllm", []port{{"web", 8000}}, p3))
	rec.waitFor(t, "p1", "p2")
	// Renamed back with another number: a new address, a new endpoint.
	update(t, client, slice("s-b", "vllm", []port{{"http", 8001}}, p3))
	got = rec.waitFor(t, "p1", "p2", "p3")
	assert.Equal(t, "10.0.0.3:8001", got["p3"].Address)
	assert.NotSame(t, e3, got["p3"])

	// p2 moves from s-a to s-b (both listing it for a while): same object.
	update(t, client, slice("s-b", "vllm", []port{{"http", 8000}}, p3, p2))
	got = rec.waitFor(t, "p1", "p2", "p3")
	assert.Same(t, e2, got["p2"])
	update(t, client, slice("s-a", "vllm", nil, p1))
	got = rec.waitFor(t, "p1", "p2", "p3")
	assert.Same(t, e1, got["p1"])
	assert.Same(t, e2, got["p2"])

	// s-a is deleted.
	require.NoError(t, client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "s-a", metav1.DeleteOptions{}))
	got = rec.waitFor(t, "p2", "p3")
	assert.Same(t, e2, got["p2"])
}

// TestIPv6Slice: an IPv6 slice with a separate metrics port gives
// bracketed host:port addresses and metrics URLs.
func TestIPv6Slice(t *testing.T) {
	s := slice("s6", "vllm", []port{{"http", 8000}, {"metrics", 9090}},
		ep{pod: "p1", ips: []string{"fd00::1"}},
		ep{ips: []string{"fd00::2"}})
	s.AddressType = discoveryv1.AddressTypeIPv6
	rec := newRecorder()
	start(t, kubediscovery.Config{Namespace: ns, PortName: "http", MetricsPortName: "metrics"}, []kubediscovery.Sink{rec}, s)
	got := rec.waitFor(t, "p1", "[fd00::2]:8000")
	assert.Equal(t, "[fd00::1]:8000", got["p1"].Address)
	assert.Equal(t, "http://[fd00::1]:9090/metrics", got["p1"].MetricsURL)
	assert.Equal(t, "http://[fd00::2]:9090/metrics", got["[fd00::2]:8000"].MetricsURL)
}

// TestDualStackPodCountsOnce: a dual-stack Service has one slice per
// address family listing the same pod: it is one server.
func TestDualStackPodCountsOnce(t *testing.T) {
	v4 := slice("vllm-v4", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}})
	v6 := slice("vllm-v6", "vllm", nil, ep{pod: "p1", ips: []string{"fd00::1"}})
	v6.AddressType = discoveryv1.AddressTypeIPv6
	v6.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "p1"}
	rec := newRecorder()
	_, d := start(t, kubediscovery.Config{Namespace: ns}, []kubediscovery.Sink{rec}, v4, v6)
	rec.waitFor(t, "p1")
	assert.Len(t, d.Endpoints(), 1)
}
