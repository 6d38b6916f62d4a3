package extproc_test

import (
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/examples/extproc"
)

// TestBufferedBodyAtTheSizeLimit: in BUFFERED mode Envoy sends the whole
// body in one message. A body of exactly MaxBodyBytes (the default, 4 MiB)
// is routed and one a byte larger is answered 413, as Options.MaxBodyBytes
// says, rather than gRPC refusing the message over its own default 4 MiB
// limit and failing the stream (which Envoy turns into a 500).
func TestBufferedBodyAtTheSizeLimit(t *testing.T) {
	prefix, suffix := `{"model":"llama-3-8b","prompt":"`, `"}`
	for _, tc := range []struct {
		name   string
		size   int
		status int // 0: routed
	}{
		{"at the limit", extproc.DefaultMaxBodyBytes, 0},
		{"a byte over", extproc.DefaultMaxBodyBytes + 1, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			e := h.open(t)
			e.send(requestHeaders(protocol(filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED), false))
			require.NotNil(t, e.recv().GetRequestHeaders())
			body := prefix + strings.Repeat("a", tc.size-len(prefix)-len(suffix)) + suffix
			require.Len(t, body, tc.size)
			e.send(requestBody(body, true))
			r, err := e.stream.Recv()
			require.NoError(t, err, "the stream must not fail")
			if tc.status == 0 {
				br := r.GetRequestBody()
				require.NotNil(t, br, "routed in the body response")
				assert.NotEmpty(t, destination(t, r, br.GetResponse().GetHeaderMutation()))
				return
			}
			require.NotNil(t, r.GetImmediateResponse())
			assert.Equal(t, tc.status, int(r.GetImmediateResponse().GetStatus().GetCode()))
		})
	}
}
