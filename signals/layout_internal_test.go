package signals

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// TestHotFieldsAligned checks the memory layout the pick path relies on
// for speed: an Endpoint's read-mostly fields and its counters each start
// a 64-byte cache line and fit in it, and so does a published Metrics'
// summary, for endpoints and snapshots allocated on their own. Adding a
// field to Endpoint, EndpointSpec or Metrics can break it; adjust the
// padding then.
func TestHotFieldsAligned(t *testing.T) {
	var ep Endpoint
	assert.Zero(t, unsafe.Sizeof(ep)%64, "Endpoint size %d", unsafe.Sizeof(ep))
	assert.Zero(t, unsafe.Offsetof(ep.metrics)%64, "read-mostly line")
	assert.Less(t, unsafe.Offsetof(ep.speed)-unsafe.Offsetof(ep.metrics), uintptr(64-8))
	assert.Zero(t, unsafe.Offsetof(ep.inFlight)%64, "counter line")
	assert.Equal(t, unsafe.Offsetof(ep.inFlight)+64, unsafe.Offsetof(ep.dispatchedTokens), "counters the pick reads fill one line")

	var m Metrics
	assert.Zero(t, unsafe.Offsetof(m.hot))
	assert.Equal(t, uintptr(64), unsafe.Sizeof(m.hot))
	assert.Zero(t, unsafe.Sizeof(m)%64, "Metrics size %d", unsafe.Sizeof(m))

	for i := 0; i < 1000; i++ {
		ep := NewEndpoint(EndpointSpec{Name: "a"})
		m := &Metrics{}
		ep.SetMetrics(m)
		if !assert.Zero(t, uintptr(unsafe.Pointer(ep))%64, "endpoint %d at %p", i, ep) ||
			!assert.Zero(t, uintptr(unsafe.Pointer(m))%64, "metrics %d at %p", i, m) {
			return
		}
	}
}
