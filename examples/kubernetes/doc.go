// Package kubediscovery finds model-server endpoints in Kubernetes: it
// watches the EndpointSlices selected by a label selector with a client-go
// informer and publishes the ready endpoints to the picker, the metrics
// scraper and the prefix index whenever they change.
//
// Each pod keeps one *signals.Endpoint for as long as its address and
// spec stay the same, so the live counters the picker keeps on it (its
// in-flight requests, what it dispatched and saw complete) and its scraped
// metrics survive every slice update and readiness flap. The model and the
// engine come from the inferroute.io/model and inferroute.io/engine labels,
// which the EndpointSlice controller copies from the Service.
//
// cmd/kubepickerd wires Discovery, a scrape.Scraper, a prefix.Index and a
// picker.Picker behind the gRPC picker service of examples/grpc.
package kubediscovery
