package latency

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

func TestParseSLOHeaders(t *testing.T) {
	tests := []struct {
		name    string
		ttft    string
		tpot    string
		want    signals.SLO
		wantErr bool
	}{
		{name: "none"},
		{name: "ttft only", ttft: "250", want: signals.SLO{TTFT: 250 * time.Millisecond}},
		{name: "both", ttft: " 1500.5 ", tpot: "40", want: signals.SLO{TTFT: 1500500 * time.Microsecond, TPOT: 40 * time.Millisecond}},
		{name: "tpot only", tpot: "0.5", want: signals.SLO{TPOT: 500 * time.Microsecond}},
		{name: "below a nanosecond", ttft: "1e-9", want: signals.SLO{TTFT: 1}},
		{name: "zero", ttft: "0", wantErr: true},
		{name: "negative", ttft: "-5", wantErr: true},
		{name: "NaN", ttft: "NaN", wantErr: true},
		{name: "Inf", tpot: "+Inf", wantErr: true},
		{name: "text", ttft: "fast", wantErr: true},
		{name: "huge", ttft: "1e300", wantErr: true},
		{name: "over a day", tpot: "86400001", wantErr: true},
		{name: "bad tpot keeps ttft", ttft: "100", tpot: "x", want: signals.SLO{TTFT: 100 * time.Millisecond}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.ttft != "" {
				h.Set(HeaderSLOTTFT, tt.ttft)
			}
			if tt.tpot != "" {
				h.Set(HeaderSLOTPOT, tt.tpot)
			}
			got, err := ParseSLOHeaders(h)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrBadSLOHeader)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("nil header", func(t *testing.T) {
		got, err := ParseSLOHeaders(nil)
		require.NoError(t, err)
		assert.Equal(t, signals.SLO{}, got)
	})
}
