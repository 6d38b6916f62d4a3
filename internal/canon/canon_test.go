package canon

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestGetMatchesHeaderGet checks Get against http.Header.Get for canonical
// keys: present, absent, present with no values, and several values.
func TestGetMatchesHeaderGet(t *testing.T) {
	h := http.Header{}
	h.Set("x-session-id", "s1")
	h.Add("X-Inferroute-Labels", "a=1")
	h.Add("X-Inferroute-Labels", "b=2")
	h["X-Empty"] = []string{}
	for _, key := range []string{"X-Session-Id", "X-Inferroute-Labels", "X-Empty", "X-Missing", "Content-Type"} {
		assert.Equal(t, http.CanonicalHeaderKey(key), key)
		assert.Equal(t, h.Get(key), Get(h, key), key)
	}
	assert.Equal(t, "s1", Get(h, "X-Session-Id"))
	assert.Equal(t, "a=1", Get(h, "X-Inferroute-Labels"))
	assert.Equal(t, "", Get(nil, "X-Session-Id"))
	// A key not in canonical form is not canonicalized.
	assert.Equal(t, "", Get(h, "x-session-id"))
}

func BenchmarkGet(b *testing.B) {
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {"1024"}, "User-Agent": {"wrk"}}
	const key = "X-Gateway-Destination-Endpoint-Subset"
	b.Run("canon.Get", func(b *testing.B) {
		for b.Loop() {
			_ = Get(h, key)
		}
	})
	b.Run("http.Header.Get", func(b *testing.B) {
		for b.Loop() {
			_ = h.Get(key)
		}
	})
}
