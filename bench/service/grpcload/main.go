// Command grpcload drives Envoy's rate limit service (sluice serve
// --grpc-listen, or envoyproxy/ratelimit) with concurrent ShouldRateLimit
// calls for a bounded time and prints decisions per second and latency
// percentiles, one line, for bench/service/run.sh. Every answer is checked:
// a transport error or a non-OK gRPC status counts as an error.
//
//	grpcload -addr 127.0.0.1:8081 -c 64 -d 5s -domain bench -keys 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the service's gRPC address (loopback only)")
	conc := flag.Int("c", 64, "concurrent callers")
	dur := flag.Duration("d", 5*time.Second, "how long to run (at most 60s)")
	domain := flag.String("domain", "bench", "the domain")
	keys := flag.Int("keys", 1000, "distinct descriptor values, spread over the calls")
	clientKind := flag.String("client", "h2", "h2: a lean HTTP/2 client, one connection (as Envoy's C++ client); grpc-go: grpc-go's client, one connection")
	flag.Parse()
	*dur = min(*dur, time.Minute)
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	// Wait for the service.
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.ShouldRateLimit(ctx, req(*domain, "warm"), grpc.WaitForReady(true))
		cancel()
		if err == nil {
			break
		}
		if i > 30 {
			fmt.Fprintln(os.Stderr, "service not answering:", err)
			os.Exit(1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The requests are built once, as a load generator's should be: the
	// time goes to the calls.
	reqs := make([]*rlsv3.RateLimitRequest, max(*keys, 1))
	for i := range reqs {
		reqs[i] = req(*domain, fmt.Sprint("k", i))
	}
	call := grpcGoCaller(client, reqs)
	if *clientKind == "h2" {
		if call, err = h2Caller(*addr, reqs); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	errs, over := 0, 0
	deadline := time.Now().Add(*dur)
	var wg sync.WaitGroup
	for g := range *conc {
		wg.Go(func() {
			var mine []time.Duration
			e, o := 0, 0
			for i := 0; time.Now().Before(deadline); i++ {
				start := time.Now()
				resp, err := call((g*7919 + i) % len(reqs))
				mine = append(mine, time.Since(start))
				switch {
				case err != nil:
					e++
				case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
					o++
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += e
			over += o
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("decisions/s %.0f p50_ms %.3f p99_ms %.3f errors %d over %d\n",
		float64(len(lat))/dur.Seconds(), pct(0.50).Seconds()*1000, pct(0.99).Seconds()*1000, errs, over)
}

// A caller makes one ShouldRateLimit call, of the i-th request.
type caller func(i int) (*rlsv3.RateLimitResponse, error)

func grpcGoCaller(client rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest) caller {
	return func(i int) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return client.ShouldRateLimit(ctx, reqs[i])
	}
}

func h2Caller(addr string, reqs []*rlsv3.RateLimitRequest) (caller, error) {
	c, err := dialH2(addr)
	if err != nil {
		return nil, err
	}
	frames := make([][]byte, len(reqs))
	for i, r := range reqs {
		msg, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		frames[i] = frame(msg)
	}
	return func(i int) (*rlsv3.RateLimitResponse, error) {
		b, err := c.do("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", frames[i])
		if err != nil {
			return nil, err
		}
		resp := new(rlsv3.RateLimitResponse)
		return resp, proto.Unmarshal(b, resp)
	}, nil
}

func req(domain, v string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: v}},
	}}}
}
