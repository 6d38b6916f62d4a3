package kubediscovery_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestDeployManifest decodes every object of deploy.yaml strictly into its
// Kubernetes type and checks that the file applies to a fresh cluster with
// one kubectl apply: the namespace its objects live in is created first.
func TestDeployManifest(t *testing.T) {
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
		assert.True(t, declared[m.GetNamespace()], "%s %s: namespace %q is not created before it", kind, m.GetName(), m.GetNamespace())
	}
}
