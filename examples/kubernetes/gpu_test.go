package kubediscovery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	kubediscovery "github.com/inferroute/inferroute/examples/kubernetes"
	"github.com/inferroute/inferroute/signals"
)

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func updateNode(t *testing.T, c *fake.Clientset, n *corev1.Node) {
	t.Helper()
	_, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// speedOf is an endpoint's GPU label and the speed the picker reads.
type speedOf struct {
	gpu      string
	speed    float64
	labelled bool
}

func speeds(got map[string]*signals.Endpoint) map[string]speedOf {
	out := map[string]speedOf{}
	for name, e := range got {
		s, ok := e.RelativeSpeed()
		out[name] = speedOf{e.Labels[signals.LabelGPU], s, ok}
	}
	return out
}

// TestGPUFromNodes: with GPUNodeLabels, each pod's endpoint carries the GPU
// its node's labels name (NVIDIA GPU Feature Discovery's before GKE's, as
// DefaultGPUNodeLabels orders them), and so the speed the picker's
// predictor, saturation filter and scorers read. Pods on nodes without
// such a label, on nodes not (yet) known, or with a GPU the speed table
// does not know count as unlabelled.
func TestGPUFromNodes(t *testing.T) {
	objs := []runtime.Object{
		node("gfd-h100", map[string]string{
			kubediscovery.NodeLabelGPUProduct:     "NVIDIA-H100-80GB-HBM3",
			kubediscovery.NodeLabelGKEAccelerator: "nvidia-l4", // the first label wins
		}),
		node("gke-l4", map[string]string{kubediscovery.NodeLabelGKEAccelerator: "nvidia-l4"}),
		node("mig", map[string]string{kubediscovery.NodeLabelGPUProduct: "A100-SXM4-40GB-MIG-3g.20gb"}),
		node("cpu", map[string]string{"kubernetes.io/arch": "amd64"}),
		node("new-gpu", map[string]string{kubediscovery.NodeLabelGPUProduct: "NVIDIA-B200"}),
		slice("s", "vllm", nil,
			ep{pod: "h", ips: []string{"10.0.0.1"}, node: "gfd-h100"},
			ep{pod: "l", ips: []string{"10.0.0.2"}, node: "gke-l4"},
			ep{pod: "m", ips: []string{"10.0.0.3"}, node: "mig"},
			ep{pod: "c", ips: []string{"10.0.0.4"}, node: "cpu"},
			ep{pod: "x", ips: []string{"10.0.0.5"}, node: "not-listed"},
			ep{pod: "n", ips: []string{"10.0.0.6"}, node: "new-gpu"},
			ep{pod: "z", ips: []string{"10.0.0.7"}}),
	}
	rec := newRecorder()
	start(t, kubediscovery.Config{Namespace: ns, GPUNodeLabels: kubediscovery.DefaultGPUNodeLabels()}, []kubediscovery.Sink{rec}, objs...)
	got := speeds(rec.waitFor(t, "h", "l", "m", "c", "x", "n", "z"))
	assert.Equal(t, speedOf{"NVIDIA-H100-80GB-HBM3", 2.2, true}, got["h"])
	assert.Equal(t, speedOf{"nvidia-l4", 0.39, true}, got["l"])
	assert.Equal(t, "A100-SXM4-40GB-MIG-3g.20gb", got["m"].gpu)
	assert.InDelta(t, 3.0/7, got["m"].speed, 1e-12)
	assert.True(t, got["m"].labelled)
	assert.Equal(t, speedOf{"", 1, false}, got["c"])
	assert.Equal(t, speedOf{"", 1, false}, got["x"])
	assert.Equal(t, speedOf{"NVIDIA-B200", 1, false}, got["n"], "an unknown GPU keeps its name but gives no speed")
	assert.Equal(t, speedOf{"", 1, false}, got["z"], "no node name")
}

// TestGPUNodeChanges: a node update that changes no GPU label (status,
// other labels) keeps its pods' endpoint objects, and with them their
// counters; a node relabelled with another GPU gives its pods new
// endpoints with the new speed (an endpoint's labels are fixed); a node
// that first appears after its pod gives the pod its GPU then.
func TestGPUNodeChanges(t *testing.T) {
	a100 := node("n1", map[string]string{kubediscovery.NodeLabelGPUProduct: "NVIDIA-A100-SXM4-80GB"})
	rec := newRecorder()
	client, _ := start(t, kubediscovery.Config{Namespace: ns, GPUNodeLabels: kubediscovery.DefaultGPUNodeLabels()},
		[]kubediscovery.Sink{rec}, a100,
		slice("s", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}, node: "n1"}, ep{pod: "p2", ips: []string{"10.0.0.2"}, node: "n2"}))
	first := rec.waitFor(t, "p1", "p2")
	require.Equal(t, speedOf{"NVIDIA-A100-SXM4-80GB", 1, true}, speeds(first)["p1"])
	require.Equal(t, speedOf{"", 1, false}, speeds(first)["p2"], "n2 is not known yet")
	first["p1"].Dispatch(100)

	// Status and an unrelated label: the endpoint object stays, as a
	// slice update afterwards shows.
	busy := a100.DeepCopy()
	busy.Labels["team"] = "search"
	busy.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	updateNode(t, client, busy)
	update(t, client, slice("s", "vllm", nil, ep{pod: "p1", ips: []string{"10.0.0.1"}, node: "n1"},
		ep{pod: "p2", ips: []string{"10.0.0.2"}, node: "n2"}, ep{pod: "p3", ips: []string{"10.0.0.3"}}))
	got := rec.waitFor(t, "p1", "p2", "p3")
	assert.Same(t, first["p1"], got["p1"])
	assert.Equal(t, int64(1), got["p1"].InFlight())

	// The node comes back with another GPU: p1 is replaced.
	h100 := busy.DeepCopy()
	h100.Labels[kubediscovery.NodeLabelGPUProduct] = "NVIDIA-H100-80GB-HBM3"
	updateNode(t, client, h100)
	got = rec.waitUntil(t, "p1 on an H100", func(m map[string]*signals.Endpoint) bool {
		return m["p1"] != nil && m["p1"].Labels[signals.LabelGPU] == "NVIDIA-H100-80GB-HBM3"
	})
	assert.NotSame(t, first["p1"], got["p1"])
	assert.Equal(t, speedOf{"NVIDIA-H100-80GB-HBM3", 2.2, true}, speeds(got)["p1"])

	// n2 appears: p2 gets its GPU.
	_, err := client.CoreV1().Nodes().Create(context.Background(),
		node("n2", map[string]string{kubediscovery.NodeLabelGKEAccelerator: "nvidia-tesla-a100"}), metav1.CreateOptions{})
	require.NoError(t, err)
	got = rec.waitUntil(t, "p2 on an A100", func(m map[string]*signals.Endpoint) bool {
		return m["p2"] != nil && m["p2"].Labels[signals.LabelGPU] == "nvidia-tesla-a100"
	})
	assert.Equal(t, speedOf{"nvidia-tesla-a100", 1, true}, speeds(got)["p2"])
}

// TestGPUFromSlice: a slice's (its Service's) inferroute.io/gpu and
// inferroute.io/relative-speed labels reach every endpoint and take
// precedence over the node's GPU; they need no node watch, and without
// GPUNodeLabels Discovery never lists nodes (it may lack the permission).
func TestGPUFromSlice(t *testing.T) {
	h100Node := node("n1", map[string]string{kubediscovery.NodeLabelGPUProduct: "NVIDIA-H100-80GB-HBM3"})
	l4 := slice("l4", "vllm-l4", nil, ep{pod: "a", ips: []string{"10.0.0.1"}, node: "n1"})
	l4.Labels[kubediscovery.LabelGPU] = "l4"
	fast := slice("fast", "vllm-fast", nil, ep{pod: "b", ips: []string{"10.0.0.2"}, node: "n1"})
	fast.Labels[kubediscovery.LabelRelativeSpeed] = "1.5"
	plain := slice("plain", "vllm-plain", nil, ep{pod: "c", ips: []string{"10.0.0.3"}, node: "n1"})

	t.Run("with nodes", func(t *testing.T) {
		rec := newRecorder()
		start(t, kubediscovery.Config{Namespace: ns, GPUNodeLabels: kubediscovery.DefaultGPUNodeLabels()},
			[]kubediscovery.Sink{rec}, h100Node, l4, fast, plain)
		got := rec.waitFor(t, "a", "b", "c")
		assert.Equal(t, speedOf{"l4", 0.39, true}, speeds(got)["a"])
		assert.Equal(t, speedOf{"", 1.5, true}, speeds(got)["b"])
		assert.Equal(t, "1.5", got["b"].Labels[signals.LabelRelativeSpeed])
		assert.Equal(t, speedOf{"NVIDIA-H100-80GB-HBM3", 2.2, true}, speeds(got)["c"])
	})
	t.Run("without nodes", func(t *testing.T) {
		rec := newRecorder()
		client, _ := start(t, kubediscovery.Config{Namespace: ns}, []kubediscovery.Sink{rec}, h100Node, l4, fast, plain)
		got := rec.waitFor(t, "a", "b", "c")
		assert.Equal(t, speedOf{"l4", 0.39, true}, speeds(got)["a"])
		assert.Equal(t, speedOf{"", 1.5, true}, speeds(got)["b"])
		assert.Equal(t, speedOf{"", 1, false}, speeds(got)["c"])
		for _, a := range client.Actions() {
			assert.NotEqual(t, "nodes", a.GetResource().Resource, "%s %s", a.GetVerb(), a.GetResource())
		}
	})
}
