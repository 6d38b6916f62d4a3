// Package examples holds runnable programs that wire inferroute into real
// gateways. It is its own Go module so that heavy integration dependencies
// (gRPC, Envoy's protos, the Kubernetes client, the OpenTelemetry SDK) never
// reach a program that only imports the library.
package examples
