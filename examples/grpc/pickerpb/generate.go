// Package pickerpb holds the generated Go code of picker.proto, the
// inferroute endpoint-picker gRPC service. Regenerate with go generate
// (needs protoc and the two plugins at the versions noted in
// ../README.md); the build itself needs neither.
package pickerpb

//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative picker.proto
