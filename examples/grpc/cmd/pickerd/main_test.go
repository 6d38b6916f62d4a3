package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
)

// TestServerReflection checks what grpcurl needs to call the services
// without .proto files, as the README does: the reflection service lists
// them and resolves a method's symbol to its file descriptor.
func TestServerReflection(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	gs := newGRPCServer(pickerpb.UnimplementedPickerServer{}, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang
	defer cancel()

	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := st.Recv()
	require.NoError(t, err, "the reflection service is registered")
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	assert.Contains(t, services, pickerpb.Picker_ServiceDesc.ServiceName)
	assert.Contains(t, services, healthpb.Health_ServiceDesc.ServiceName)

	for _, symbol := range []string{"grpc.health.v1.Health.Check", "inferroute.picker.v1.Picker.Pick"} {
		require.NoError(t, st.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}))
		resp, err := st.Recv()
		require.NoError(t, err)
		require.Nil(t, resp.GetErrorResponse(), symbol)
		files := resp.GetFileDescriptorResponse().GetFileDescriptorProto()
		require.NotEmpty(t, files, symbol)
		var fd descriptorpb.FileDescriptorProto
		require.NoError(t, proto.Unmarshal(files[0], &fd), symbol)
		assert.Contains(t, symbol, fd.GetPackage()+".", "the first file declares %s", symbol)
	}
	require.NoError(t, st.CloseSend())

	// The health check of the README's grpcurl command.
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.GetStatus())
	hc, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: pickerpb.Picker_ServiceDesc.ServiceName})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.GetStatus())
}
