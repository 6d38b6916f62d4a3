package extproc_test

import (
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// TestFullDuplexTrailersWithoutRequestHeadersAreRefused: a request whose
// headers Envoy skipped (request_header_mode SKIP) and that has no body
// chunk, only trailers, is refused in FULL_DUPLEX_STREAMED mode like a
// body without headers: the destination could only go in a headers
// response, which Envoy did not ask for (it waits for a trailers response),
// so nothing is picked and nothing but the refusal is sent.
func TestFullDuplexTrailersWithoutRequestHeadersAreRefused(t *testing.T) {
	srv, eps, _ := directServer(t, extproc.Options{}, "10.0.0.1:8000")
	trailers := &extprocv3.ProcessingRequest{
		ProtocolConfig: protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED),
		Request:        &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}},
	}
	out, panicked, err := runProcess(t, srv, trailers)
	require.Nil(t, panicked)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Empty(t, out, "no unsolicited headers response")
	_, dispatched, _ := sumInFlight(eps)
	assert.Zero(t, dispatched, "nothing picked")
}
