package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// The built binary with its defaults (sluice's own gRPC server), on the
// embedded store and on one Redis (where concurrent decisions go in
// batches): while one connection floods calls it resets at once, another
// sends malformed calls, a third makes 20,000 calls and never grants send
// window, and a fourth floods PINGs, 64 grpc-go callers make 320 calls on a
// descriptor allowed 100 a year. Exactly 100 are OK, every call gets an
// answer, the malformed ones the status grpc-go would give, the slow reader
// is refused what the server cannot hold (with no goroutine per call and
// less than 64 MiB more heap in use), the PING flood is ended, and its
// health check answers SERVING.
func TestEnvoyServiceUnderAttackEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	t.Run("memory", func(t *testing.T) { envoyUnderAttack(t) })
	t.Run("redis", func(t *testing.T) { envoyUnderAttack(t, "--store", redistest.Start(t).URL()) })
}

// startEnvoyService starts the built binary's `serve` with one Envoy-format
// rule for the descriptor user of domain load (limit, such as "{unit: year,
// requests_per_unit: 100}") and returns the gRPC address and a client, once
// a call (for the user "warm") has been answered: the banner names only the
// HTTP listener.
func startEnvoyService(t *testing.T, limit string, extra ...string) (string, rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	rulesPath := filepath.Join(t.TempDir(), "load.yaml")
	rules := "domain: load\ndescriptors:\n  - key: user\n    rate_limit: " + limit + "\n"
	if err := os.WriteFile(rulesPath, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	base, _ := start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", addr, "--config", rulesPath}, extra...)...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rls.ShouldRateLimit(ctx, loadReq("warm"), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the gRPC service never answered: %v", err)
	}
	return addr, rls, base
}

// loadReq asks for the descriptor user=user of domain load.
func loadReq(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "load", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
	}}}
}

func envoyUnderAttack(t *testing.T, extra ...string) {
	addr, rls, base := startEnvoyService(t, "{unit: year, requests_per_unit: 100}", extra...)
	// The process's own gauges (/metrics): its goroutines and its heap.
	gauge := func(name string) float64 {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				return f
			}
		}
		t.Fatalf("no %s in /metrics", name)
		return 0
	}
	goroutines, heap := gauge("go_goroutines"), gauge("go_memstats_heap_inuse_bytes")

	var wg sync.WaitGroup
	wg.Go(func() { resetFlood(t, addr, 3000) })
	wg.Go(func() { malformedCalls(t, addr) })
	wg.Go(func() {
		slowReader(t, addr, 20000, func() {
			// While the reader still holds its connection and the answers
			// it never read: the calls hold no goroutine, and the heap (with
			// the garbage of every attack so far) stays small. What the
			// floods started is bounded: the call workers (at most 256) and
			// the workers of their store calls (one per call in flight, at
			// most 256 on any store; idle ones end after 2 s).
			if g, h := gauge("go_goroutines")-goroutines, gauge("go_memstats_heap_inuse_bytes")-heap; g > 600 || h > 64<<20 {
				t.Errorf("with a reader that grants no window holding 20,000 calls: goroutines +%.0f (the call workers are at most 256, their store calls' as many), heap in use +%.0f MiB; store call workers %v busy, %v idle", g, h/(1<<20),
					proctest.Metric(t, base, `sluice_store_call_workers{state="busy"}`), proctest.Metric(t, base, `sluice_store_call_workers{state="idle"}`))
			}
		})
	})
	wg.Go(func() { pingFlood(t, addr) })
	var ok, over atomic.Int64
	for range 64 {
		wg.Go(func() {
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				resp, err := rls.ShouldRateLimit(ctx, loadReq("victim"))
				cancel()
				switch {
				case err != nil:
					t.Errorf("a call under attack: %v", err)
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				default:
					over.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// Exact: 100 OK. On a machine whose cores the attacks and busy loops
	// take, Redis may starve and a store call miss its deadline: its call
	// is answered within the gateway's share, degraded. That can leave the
	// victim under (the call was applied late), or over while other calls
	// still reach the store (the bound's partial-outage term, docs/redis.md):
	// each unit off exact is a failed store call the metrics count (a
	// loaded run: 106 with 76 failed calls; another: 64 with failed calls).
	failed, err := proctest.ReadMetric(base, "sluice_store_errors_total")
	if err != nil {
		t.Fatal(err)
	}
	if off := max(ok.Load()-100, 100-ok.Load()); ok.Load()+over.Load() != 320 || float64(off) > failed {
		t.Fatalf("%d OK and %d over of 320 calls with %v failed store calls, want exactly 100 and 220, or off by at most the failed calls", ok.Load(), over.Load(), failed)
	}
	resp, err := rls.ShouldRateLimit(context.Background(), loadReq("after"))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a new user after the attack: %v %v", resp, err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after the attack: %v %v", h, err)
	}
}

// slowReader makes n calls on one connection that reads every frame and
// never grants send window: the server must refuse what it cannot answer
// rather than hold it.
func slowReader(t *testing.T, addr string, n int, whileOpen func()) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer nc.Close()
	c := &h2conn{nc: nc, fr: http2.NewFramer(nc, nc)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	var refused atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			if r, ok := f.(*http2.RSTStreamFrame); ok && r.ErrCode == http2.ErrCodeRefusedStream {
				refused.Add(1)
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				return
			}
		}
	}()
	msg, _ := proto.Marshal(loadReq("slow-reader"))
	for i := range n {
		c.call(uint32(2*i+1), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", msg, 0)
	}
	c.fr.WritePing(false, [8]byte{'s', 'l', 'o', 'w'})
	<-done
	whileOpen()
	if refused.Load() < int64(n-1024) {
		t.Errorf("a reader that grants no window: %d of %d calls refused, want all but the 1,024 the server holds", refused.Load(), n)
	}
}

// pingFlood sends PINGs as fast as it can: the server must end the
// connection.
func pingFlood(t *testing.T, addr string) {
	c := dialH2(t, addr)
	defer c.nc.Close()
	for i := range 1000 {
		if c.fr.WritePing(false, [8]byte{byte(i)}) != nil {
			break
		}
	}
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Errorf("a PING flood: the connection ended without GOAWAY (%v)", err)
			return
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("a PING flood: GOAWAY %v, want ENHANCE_YOUR_CALM", g.ErrCode)
			}
			return
		}
	}
}

// h2conn is a bare HTTP/2 client connection for writing what an attacker
// would.
type h2conn struct {
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

func dialH2(t *testing.T, addr string) *h2conn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &h2conn{nc: nc, fr: http2.NewFramer(nc, nc)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings()
	return c
}

func (c *h2conn) call(id uint32, path string, msg []byte, flags byte) {
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	c.fr.WriteData(id, true, append(binary.BigEndian.AppendUint32([]byte{flags}, uint32(len(msg))), msg...))
}

// resetFlood opens n calls on one connection and resets each at once, then
// checks with a PING that the server is still reading.
func resetFlood(t *testing.T, addr string, n int) {
	c := dialH2(t, addr)
	defer c.nc.Close()
	pong := make(chan error, 1)
	go func() { // read everything, so the server is never blocked on us
		c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				pong <- err
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				pong <- nil
				return
			}
		}
	}()
	msg := []byte("\x0a\x04load\x12\x0a\x0a\x08\x0a\x04user\x12\x00") // domain "load", one empty descriptor value
	for i := range n {
		id := uint32(2*i + 1)
		c.call(id, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", msg, 0)
		c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	c.fr.WritePing(false, [8]byte{'f', 'l', 'o', 'o', 'd'})
	if err := <-pong; err != nil {
		t.Errorf("after a flood of %d reset calls the connection ended: %v", n, err)
	}
}

// malformedCalls sends calls grpc-go would refuse and checks each status.
func malformedCalls(t *testing.T, addr string) {
	c := dialH2(t, addr)
	defer c.nc.Close()
	want := map[uint32]string{1: "13", 3: "12", 5: "12"}
	c.call(1, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", []byte{0xff, 0xff, 0xff}, 0) // not protobuf
	c.call(3, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", []byte{1, 2, 3}, 1)          // compressed
	c.call(5, "/envoy.service.ratelimit.v3.RateLimitService/Nope", nil, 0)                                 // unknown method
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for len(want) > 0 {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Errorf("malformed calls: %v before every answer (%v left)", err, want)
			return
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			c.fr.WriteSettingsAck()
		}
		h, ok := f.(*http2.MetaHeadersFrame)
		if !ok || !h.StreamEnded() {
			continue
		}
		got := ""
		for _, hf := range h.RegularFields() {
			if hf.Name == "grpc-status" {
				got = hf.Value
			}
		}
		if got != want[h.StreamID] {
			t.Errorf("malformed call on stream %d: grpc-status %q, want %q", h.StreamID, got, want[h.StreamID])
		}
		delete(want, h.StreamID)
	}
}

// The built binary's gRPC service answers an HTTP/2 client that is not Go's:
// curl, on nghttp2 (the HTTP/2 library Envoy long used), with prior
// knowledge, as Envoy's gRPC clusters connect. A call gets :status 200, a
// length-prefixed RateLimitResponse and grpc-status 0 in the trailers; an
// unknown method gets grpc-status 12.
func TestEnvoyServiceAnswersCurlOverHTTP2EndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	curl := needTool(t, "curl", "curl")
	if v, err := exec.Command(curl, "--version").Output(); err != nil || !bytes.Contains(v, []byte("HTTP2")) {
		t.Skipf("SKIPPED LOUDLY: this curl has no HTTP/2 (%s)", v)
	}
	addr, _, _ := startEnvoyService(t, "{unit: minute, requests_per_unit: 10}")
	msg, err := proto.Marshal(loadReq("curl"))
	if err != nil {
		t.Fatal(err)
	}
	body := filepath.Join(t.TempDir(), "req.bin")
	os.WriteFile(body, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...), 0o600)
	call := func(method string) (headers string, answer []byte) {
		t.Helper()
		// Once, in CI, curl reported "Stream error in the HTTP/2 framing
		// layer" on the first call, and never again in hundreds of runs
		// since: a failed attempt is logged with curl's trace of the
		// frames (-v) and tried again; a second failure fails the test.
		for attempt := 1; ; attempt++ {
			dir := t.TempDir()
			out, err := exec.Command(curl, "-sS", "-v", "--http2-prior-knowledge", "--max-time", "10",
				"-H", "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "@"+body,
				"-D", filepath.Join(dir, "headers"), "-o", filepath.Join(dir, "body"),
				"http://"+addr+"/envoy.service.ratelimit.v3.RateLimitService/"+method).CombinedOutput()
			if err != nil && attempt == 1 {
				t.Logf("curl, attempt 1 (tried again): %v:\n%s", err, out)
				continue
			}
			if err != nil {
				t.Fatalf("curl: %v:\n%s", err, out)
			}
			h, _ := os.ReadFile(filepath.Join(dir, "headers"))
			b, _ := os.ReadFile(filepath.Join(dir, "body"))
			return string(h), b
		}
	}
	h, b := call("ShouldRateLimit")
	if !strings.HasPrefix(h, "HTTP/2 200") || !strings.Contains(h, "grpc-status: 0") {
		t.Fatalf("headers and trailers:\n%s", h)
	}
	if len(b) < 5 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		t.Fatalf("the answer is not one length-prefixed message: % x", b)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(b[5:], &resp); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK ||
		len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("answer %v (%v), want OK with 9 remaining", &resp, err)
	}
	if h, _ := call("Nope"); !strings.Contains(h, "grpc-status: 12") {
		t.Fatalf("an unknown method answered:\n%s", h)
	}
}
