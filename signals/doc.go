// Package signals is inferroute's data model: the endpoints a request can be
// routed to, the request itself, and the six live signals read from them.
//
// An Endpoint carries three kinds of state, each with its own owner:
//
//   - identity (EndpointSpec), set once by discovery or configuration;
//   - the latest scraped Metrics, an immutable snapshot published atomically
//     by a scraper;
//   - live load counters kept by this process: what the picker dispatched
//     and what Done reported complete.
//
// Scraped values lag by up to one scrape interval. Under a burst every
// request that arrives within that lag would otherwise see the same
// "emptiest" endpoint. The signals therefore always combine the last scrape
// with the local accounting of what was dispatched and completed since it
// (Metrics.Baseline), and treat a scrape's age as a confidence that halves
// every Staleness.HalfLife, so a scrape fades into local knowledge rather than
// falling off a cliff.
//
// The six signals are KVCacheUtilization, QueueDepth, RunningRequests,
// LoRAAffinity, PrefixCacheHit and PredictedLatency. The last two read two
// small interfaces, PrefixMatcher and LatencyEstimator, whose full
// implementations live in sub-packages; NoPrefixMatcher and
// NoLatencyEstimator are the defaults.
//
// Time is read only through a Clock so that the simulator can drive the
// library in virtual time.
package signals
