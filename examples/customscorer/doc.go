// Package customscorer shows how to write an inferroute scorer of your own,
// register it in a scorer.Registry, and use it from the picker's YAML
// configuration with a weight, next to the built-ins.
//
// ZoneScorer prefers endpoints in the client's zone (then its region), read
// from a request header and the endpoints' topology labels, to keep traffic
// off cross-zone links; CostScorer prefers endpoints with a lower price per
// token, read from a label. Register adds both to a Registry under
// ZoneScorerName and CostScorerName; Demo runs one pick and prints its
// breakdown, with each scorer's weighted contribution per endpoint.
//
// A scorer is a type with one method, Score, that writes a score in [0, 1]
// per candidate into a slice the picker owns. It runs on the pick path, so
// it must not block or allocate; both scorers here prepare what they can
// (canonical header names) when the factory builds them.
package customscorer
