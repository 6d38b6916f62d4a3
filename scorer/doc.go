// Package scorer holds the two halves of a placement decision: filters that
// remove endpoints which cannot serve a request, and scorers that rate the
// rest. They are separate steps, as in the Kubernetes scheduler framework:
// Filter, then Score into a caller-owned slice, then normalise, then weight.
//
// A Scorer writes one score in [0, 1] per candidate into a slice the picker
// owns; 1 is best. Normalisation helpers (MinMax, InverseMinMax, FixedRange)
// are reusable steps a scorer applies to its raw values. Weights apply after
// normalisation, so a scorer's weight says how much it matters regardless of
// its raw units.
//
// Built-in scorers read the six signals of package signals, plus a token
// load scorer, the recent-dispatch (burst) scorer and the prefill-queue
// scorer (least work left over the prompt tokens not yet answered by a
// first byte); built-in filters check the model and adapter, health,
// saturation, a subset hint and a latency objective. A Registry maps names to constructors that
// take YAML or JSON parameters, so configurations name scorers and filters;
// a Registry is a value, never a global.
package scorer
