package grpclimit_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// engineOf is an engine on the rules in src and the embedded store.
func engineOf(t testing.TB, src string) *engine.Engine {
	t.Helper()
	cfg, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// served serves s, with the health service, on a loopback port until the
// test ends, and returns a connection to it dialled with opts.
func served(t testing.TB, s *grpc.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	healthpb.RegisterHealthServer(s, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
