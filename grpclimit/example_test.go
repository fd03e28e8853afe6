package grpclimit_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/grpclimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// A gRPC service limited per user (the x-user-id metadata) to 2 calls an
// hour on its health service; the third call is refused with the wait.
func Example() {
	cfg, _ := rules.Parse("rules.yaml", []byte(`
rules:
  - {id: per-user, match: {path: "/grpc.health.v1.Health/*"}, key: [user], rate: 2, per: 1h}
`))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New()})
	l := grpclimit.New(e, grpclimit.Options{})
	srv := grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServerInterceptor()), grpc.StreamInterceptor(l.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user-id", "u42")
	for range 3 {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted
}

// A client that waits as the server asks: a call refused for half a second
// is retried once the wait is over, and succeeds.
func ExampleClient() {
	cfg, _ := rules.Parse("rules.yaml", []byte("rules:\n  - {id: per-ip, key: [ip], rate: 2, per: 1s, burst: 1}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New()})
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	c := &grpclimit.Client{}
	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(c.UnaryClientInterceptor()))
	defer conn.Close()
	for range 2 {
		_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err) == codes.OK)
	}
	// Output:
	// true
	// true
}
