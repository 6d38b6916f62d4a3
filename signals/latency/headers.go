package latency

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/inferroute/inferroute/internal/canon"
	"github.com/inferroute/inferroute/signals"
)

// SLO request headers, in milliseconds.
const (
	// HeaderSLOTTFT carries the time-to-first-token objective in
	// milliseconds ("250", "1500.5").
	HeaderSLOTTFT = "x-slo-ttft-ms"
	// HeaderSLOTPOT carries the time-per-output-token objective in
	// milliseconds.
	HeaderSLOTPOT = "x-slo-tpot-ms"
)

// ErrBadSLOHeader is wrapped by ParseSLOHeaders' errors, so a router can
// answer 400.
var ErrBadSLOHeader = errors.New("bad SLO header")

// maxSLO bounds an objective: a day is longer than any sensible one and
// keeps the conversion to time.Duration far from overflow.
const maxSLO = 24 * time.Hour

// ParseSLOHeaders reads HeaderSLOTTFT and HeaderSLOTPOT from h. A missing or
// empty header leaves its objective zero (none); a nil h has none. A value
// that is not a positive, finite number of milliseconds, or exceeds a day,
// is an error wrapping ErrBadSLOHeader, and the returned SLO then holds
// only the objectives parsed before it. It does not retain h.
func ParseSLOHeaders(h http.Header) (signals.SLO, error) {
	var slo signals.SLO
	var err error
	if slo.TTFT, err = parseMillis(h, canonicalTTFT, HeaderSLOTTFT); err != nil {
		return slo, err
	}
	if slo.TPOT, err = parseMillis(h, canonicalTPOT, HeaderSLOTPOT); err != nil {
		return slo, err
	}
	return slo, nil
}

// The SLO header names in canonical form, read with canon.Get:
// http.Header.Get allocates the canonical copy of a lowercase key on every
// call, and scans even a canonical one.
var (
	canonicalTTFT = http.CanonicalHeaderKey(HeaderSLOTTFT)
	canonicalTPOT = http.CanonicalHeaderKey(HeaderSLOTPOT)
)

// parseMillis reads the header key (canonical) and names it name in errors.
func parseMillis(h http.Header, key, name string) (time.Duration, error) {
	s := strings.TrimSpace(canon.Get(h, key))
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("%w: %s: %q is not a positive number of milliseconds", ErrBadSLOHeader, name, s)
	}
	d := time.Duration(v * float64(time.Millisecond))
	if d > maxSLO || v > float64(maxSLO/time.Millisecond) {
		return 0, fmt.Errorf("%w: %s: %q exceeds %v", ErrBadSLOHeader, name, s, maxSLO)
	}
	if d <= 0 { // below a nanosecond
		d = 1
	}
	return d, nil
}
