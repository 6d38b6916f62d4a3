package extproc_test

import (
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// BenchmarkStream plays one whole ext_proc stream per iteration over
// bufconn, as Envoy would for one chat completion: request headers and
// body (parse, route, hash, pick), response headers, one response chunk,
// the end of the response (Done).
func BenchmarkStream(b *testing.B) {
	modes := []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
	}{
		{"buffered", filterv3.ProcessingMode_BUFFERED},
		{"full-duplex", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			h := newHarness(b, setup{})
			pc := protocol(m.mode, filterv3.ProcessingMode_STREAMED)
			full := m.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			b.ReportAllocs()
			for b.Loop() {
				st, err := h.client.Process(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				send := func(r *extprocv3.ProcessingRequest) {
					if err := st.Send(r); err != nil {
						b.Fatal(err)
					}
				}
				recv := func() {
					if _, err := st.Recv(); err != nil {
						b.Fatal(err)
					}
				}
				send(requestHeaders(pc, false))
				if !full {
					recv()
				}
				send(requestBody(chatBody, true))
				recv() // the decision
				if full {
					recv() // the body streamed back
				}
				send(responseHeaders("200", false, ""))
				recv()
				send(responseBody("data: {}\n\n", false))
				recv()
				send(responseBody("data: [DONE]\n\n", true))
				recv()
				if err := st.CloseSend(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
