package extproc_test

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/inferroute/inferroute/examples/extproc"
)

// TestEnvoyBootstrap decodes envoy.yaml into Envoy's v3 Bootstrap proto
// (unknown fields and unregistered typed configs are errors), runs the
// protos' validation rules, and checks the wiring the picker relies on.
func TestEnvoyBootstrap(t *testing.T) {
	raw, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	js, err := json.Marshal(doc)
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &bs))
	require.NoError(t, bs.ValidateAll())

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	ms := clusters["model_servers"]
	require.NotNil(t, ms)
	assert.Equal(t, clusterv3.Cluster_ORIGINAL_DST, ms.GetType())
	assert.True(t, ms.GetOriginalDstLbConfig().GetUseHttpHeader())
	assert.Equal(t, extproc.HeaderDestination, ms.GetOriginalDstLbConfig().GetHttpHeaderName())
	require.NotNil(t, clusters["inferroute_epp"])

	lis := bs.GetStaticResources().GetListeners()
	require.Len(t, lis, 1)
	var hcm hcmv3.HttpConnectionManager
	require.NoError(t, lis[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm))
	filters := hcm.GetHttpFilters()
	require.Len(t, filters, 2)
	assert.Equal(t, "envoy.filters.http.router", filters[1].GetName(), "the router comes last")
	var ep filterv3.ExternalProcessor
	require.NoError(t, filters[0].GetTypedConfig().UnmarshalTo(&ep))
	assert.Equal(t, "inferroute_epp", ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	pm := ep.GetProcessingMode()
	assert.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, pm.GetRequestBodyMode())
	assert.Equal(t, filterv3.ProcessingMode_SEND, pm.GetRequestTrailerMode(), "required by FULL_DUPLEX_STREAMED")
	assert.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, pm.GetResponseBodyMode())
	assert.Equal(t, filterv3.ProcessingMode_SEND, pm.GetResponseTrailerMode())
	assert.Contains(t, ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), extproc.SubsetNamespace)
	assert.Contains(t, ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), extproc.MetadataNamespace)
}
