package picker

import (
	"errors"
	"fmt"
)

// Sentinel errors. Pick returns them wrapped in an *Error; test with
// errors.Is.
var (
	// ErrNoEndpoints: the pool is empty, or the filters removed every
	// endpoint and the picker is configured to fail closed.
	ErrNoEndpoints = errors.New("no endpoint available")
	// ErrSaturated: the admission check rejected a sheddable request because
	// no endpoint can serve it within its objective. A router answers 429.
	ErrSaturated = errors.New("saturated")
)

// Error is the typed error Pick returns. Err is one of the sentinel errors;
// Stage and Reason say where and why.
type Error struct {
	// Err is ErrNoEndpoints or ErrSaturated.
	Err error
	// Stage is "pool" (empty pool), "filter" or "admission".
	Stage string
	// Plugin names the filter that emptied the set (Stage "filter"). It is
	// empty at the other stages: the admitter (WithAdmitter) has no name,
	// and its explanation is in Reason.
	Plugin string
	// Reason is a short human-readable detail.
	Reason string
	// Candidates is the number of endpoints before the failing stage.
	Candidates int
}

// Error implements error.
func (e *Error) Error() string {
	msg := fmt.Sprintf("inferroute: %v at %s", e.Err, e.Stage)
	if e.Plugin != "" {
		msg += " " + e.Plugin
	}
	msg += fmt.Sprintf(" (%d candidates)", e.Candidates)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Unwrap returns the sentinel error.
func (e *Error) Unwrap() error { return e.Err }
