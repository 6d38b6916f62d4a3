package picker

import (
	"fmt"
	"math"
	"strings"

	"github.com/inferroute/inferroute/signals"
)

// Breakdown explains one pick: every candidate that survived the filters,
// and what each scorer gave it. It reads the picker's scratch space without
// copying, so it is valid only until the Result's Done is called; after
// that it reads as empty: Len is 0, Scorers nil, Chosen -1, and the
// per-candidate and per-scorer accessors return their out-of-range values.
// Accessors given a candidate index i outside [0, Len()) or a scorer index
// s outside [0, len(Scorers())) do not panic either: Endpoint returns nil,
// Raw NaN, and Weight, Score, Contribution and Total 0. Its methods are not
// safe to call concurrently with Done.
type Breakdown struct {
	rec *record
	gen uint64
}

func (b Breakdown) live() bool { return b.rec != nil && b.rec.gen.Load() == b.gen }

// candidate reports whether i is a valid candidate index of a live
// breakdown.
func (b Breakdown) candidate(i int) bool { return b.live() && i >= 0 && i < b.rec.n }

// scorer reports whether s is a valid scorer index of a live breakdown.
func (b Breakdown) scorer(s int) bool {
	return b.live() && s >= 0 && s < len(b.rec.cfg.scorers)
}

// Len returns the number of candidates scored, 0 after Done.
func (b Breakdown) Len() int {
	if !b.live() {
		return 0
	}
	return b.rec.n
}

// Endpoint returns candidate i, or nil if i is out of range or the
// breakdown is no longer valid.
func (b Breakdown) Endpoint(i int) *signals.Endpoint {
	if !b.candidate(i) {
		return nil
	}
	return b.rec.eps[i]
}

// Scorers returns the scorer names, in configuration order, or nil if the
// breakdown is no longer valid. The slice must not be modified.
func (b Breakdown) Scorers() []string {
	if !b.live() {
		return nil
	}
	return b.rec.cfg.names
}

// Weight returns scorer s's weight, or 0 if s is out of range or the
// breakdown is no longer valid.
func (b Breakdown) Weight(s int) float64 {
	if !b.scorer(s) {
		return 0
	}
	return b.rec.cfg.scorers[s].Weight
}

// Score returns scorer s's normalised score in [0, 1] for candidate i, or
// 0 if s or i is out of range or the breakdown is no longer valid.
func (b Breakdown) Score(s, i int) float64 {
	if !b.scorer(s) || !b.candidate(i) {
		return 0
	}
	return b.rec.scores[s*b.rec.n+i]
}

// Raw returns the raw value behind scorer s's score for candidate i (a
// queue depth, a predicted TTFT in seconds, …), or NaN if the scorer did
// not report one, s or i is out of range, or the breakdown is no longer
// valid.
func (b Breakdown) Raw(s, i int) float64 {
	if !b.scorer(s) || !b.candidate(i) {
		return math.NaN()
	}
	return b.rec.raw[s*b.rec.n+i]
}

// Contribution returns Weight(s) × Score(s, i): what scorer s added to
// candidate i's total (0 if s or i is out of range or the breakdown is no
// longer valid).
func (b Breakdown) Contribution(s, i int) float64 { return b.Weight(s) * b.Score(s, i) }

// Total returns candidate i's weighted total, or 0 if i is out of range or
// the breakdown is no longer valid.
func (b Breakdown) Total(i int) float64 {
	if !b.candidate(i) {
		return 0
	}
	return b.rec.total[i]
}

// Chosen returns the index of the chosen candidate, or -1 if the breakdown
// is no longer valid.
func (b Breakdown) Chosen() int {
	if !b.live() {
		return -1
	}
	for i, ep := range b.rec.eps[:b.rec.n] {
		if ep == b.rec.ep {
			return i
		}
	}
	return -1
}

// String renders the breakdown as a table, one row per candidate, the
// chosen one marked with '*': each scorer's weighted contribution, with the
// raw value in parentheses when the scorer reported one.
func (b Breakdown) String() string {
	n := b.Len()
	if n == 0 {
		return "(no breakdown)"
	}
	var sb strings.Builder
	chosen := b.Chosen()
	names := b.Scorers()
	fmt.Fprintf(&sb, "  %-16s %7s", "endpoint", "total")
	for _, name := range names {
		fmt.Fprintf(&sb, " %18s", name)
	}
	sb.WriteByte('\n')
	for i := 0; i < n; i++ {
		mark := ' '
		if i == chosen {
			mark = '*'
		}
		fmt.Fprintf(&sb, "%c %-16s %7.3f", mark, b.Endpoint(i).Name, b.Total(i))
		for s := range names {
			cell := fmt.Sprintf("%.3f", b.Contribution(s, i))
			if r := b.Raw(s, i); !math.IsNaN(r) {
				cell += fmt.Sprintf(" (%.3g)", r)
			}
			fmt.Fprintf(&sb, " %18s", cell)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
