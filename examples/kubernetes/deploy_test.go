package kubediscovery_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// manifest decodes every object of deploy.yaml strictly (unknown fields
// are errors) into its Kubernetes type, in file order.
func manifest(t *testing.T) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile("deploy.yaml")
	require.NoError(t, err)
	dec := k8sjson.NewSerializerWithOptions(k8sjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		k8sjson.SerializerOptions{Yaml: true, Strict: true})
	var objs []runtime.Object
	docs := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		require.NoError(t, err, "%s", doc)
		objs = append(objs, obj)
	}
	require.NotEmpty(t, objs)
	return objs
}

// TestDeployManifest decodes every object of deploy.yaml strictly into its
// Kubernetes type and checks that the file applies to a fresh cluster with
// one kubectl apply: the namespace its objects live in is created first.
func TestDeployManifest(t *testing.T) {
	objs := manifest(t)

	first, ok := objs[0].(*corev1.Namespace)
	require.True(t, ok, "the first object is a Namespace, not %T", objs[0])
	assert.Equal(t, ns, first.Name)

	declared := map[string]bool{}
	for _, obj := range objs {
		m, err := meta.Accessor(obj)
		require.NoError(t, err)
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if n, ok := obj.(*corev1.Namespace); ok {
			declared[n.Name] = true
			continue
		}
		if _, ok := obj.(*rbacv1.ClusterRole); ok {
			continue // cluster-scoped
		}
		if _, ok := obj.(*rbacv1.ClusterRoleBinding); ok {
			continue // cluster-scoped
		}
		assert.True(t, declared[m.GetNamespace()], "%s %s: namespace %q is not created before it", kind, m.GetName(), m.GetNamespace())
	}
}

// TestDeployGrantsWhatItReads: the ServiceAccount kubepickerd runs as may
// list and watch what it reads: EndpointSlices in its namespace and, as
// its default -gpu-node-labels reads them, Nodes.
func TestDeployGrantsWhatItReads(t *testing.T) {
	roles := map[string][]rbacv1.PolicyRule{} // by kind/name
	var bindings []struct{ role, sa string }
	var sa string
	for _, obj := range manifest(t) {
		switch o := obj.(type) {
		case *rbacv1.Role:
			roles["Role/"+o.Name] = o.Rules
		case *rbacv1.ClusterRole:
			roles["ClusterRole/"+o.Name] = o.Rules
		case *rbacv1.RoleBinding:
			for _, s := range o.Subjects {
				bindings = append(bindings, struct{ role, sa string }{o.RoleRef.Kind + "/" + o.RoleRef.Name, s.Namespace + "/" + s.Name})
			}
		case *rbacv1.ClusterRoleBinding:
			for _, s := range o.Subjects {
				bindings = append(bindings, struct{ role, sa string }{o.RoleRef.Kind + "/" + o.RoleRef.Name, s.Namespace + "/" + s.Name})
			}
		case *appsv1.Deployment:
			sa = o.Namespace + "/" + o.Spec.Template.Spec.ServiceAccountName
			for _, a := range o.Spec.Template.Spec.Containers[0].Args {
				assert.NotContains(t, a, "-gpu-node-labels", "the manifest grants nodes for the default labels")
			}
		}
	}
	require.NotEmpty(t, sa)
	granted := func(group, resource string, verb string) bool {
		for _, b := range bindings {
			if b.sa != sa {
				continue
			}
			for _, r := range roles[b.role] {
				if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
					return true
				}
			}
		}
		return false
	}
	for _, verb := range []string{"get", "list", "watch"} {
		assert.True(t, granted("discovery.k8s.io", "endpointslices", verb), "endpointslices %s", verb)
		assert.True(t, granted("", "nodes", verb), "nodes %s", verb)
	}
}
