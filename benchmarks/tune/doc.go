// Package tune searches the picker's scorer weights and key thresholds for
// the configuration that routes a set of simulated scenarios best, and
// returns it as a picker.Config (whose Marshal output picker.ParseConfig
// loads) with a before/after comparison.
//
// # Method: budgeted coordinate descent on a grid
//
// Each parameter (the weight of every scorer in the base configuration,
// the prefix scorer's minimum match and anti-hot-spot margins, the
// staleness half-life) has a short grid of candidate values, mostly
// multiplicative steps around the default. The search visits the
// parameters in turn and, for each, evaluates every grid value with the
// others held fixed, keeping the best when it beats the incumbent by more
// than a small margin; sweeps repeat until one changes nothing or the
// budget of evaluations runs out.
//
// Why coordinate descent rather than random or Bayesian search: an
// evaluation is a batch of full fleet simulations (about a second of CPU),
// so the budget is tens of evaluations, not thousands; the weights act
// mostly separately (each scorer pulls toward one signal), which is the
// case coordinate descent handles well; every accepted step changes one
// named parameter, so the trail explains the result; and it is
// deterministic for a seed, so CI can reproduce a tuning. Random search
// (Bergstra and Bengio, "Random Search for Hyper-Parameter Optimization",
// JMLR 2012) wins when few of many parameters matter and budgets are
// larger; a Gaussian-process optimiser would need a dependency and its
// own hyper-parameters for a dozen dimensions on a noisy objective.
//
// # Objective and hold-out
//
// Each scenario's workload is built twice as long as an evaluation needs,
// scaled to each load, and split in time: the first half is the training
// traffic the search scores on, the second half is held out. The score of
// a configuration is the mean over scenarios and loads of
//
//	½·ln(mean TTFT / round-robin's mean TTFT) + ½·ln(p99 TTFT / round-robin's p99 TTFT)
//
// on the same traffic (lower is better; 0 is round-robin, −ln 2 halves
// both), plus 4 times the log-ratio of any mean or p99 worse than
// round-robin's (a regression somewhere is not paid for by a gain
// elsewhere), plus a penalty for failed requests. The logarithm makes a 10%
// gain count the same in every scenario whatever its absolute latency.
// The before/after table is computed on the held-out half only, so a
// configuration that merely memorised the training traffic shows it.
package tune
