package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkGatewayOverload measures the built `sluice gateway`, with and
// without --adaptive, in front of an upstream of 8 workers that each take
// 20 ms per request (a capacity of 400 a second; requests beyond the
// workers wait in the upstream's queue): Poisson load at 0.5x, 1x, 2x and
// 3x the capacity, 4 s per level, on loopback. Goodput is the answers of
// 200 within 1 s of the request; p99 is over those answers. Run it alone:
//
//	go test ./cmd/sluice -run '^$' -bench GatewayOverload -benchtime 1x
func BenchmarkGatewayOverload(b *testing.B) {
	const workers, work, capacity = 8, 20 * time.Millisecond, 400.0
	slots := make(chan struct{}, workers)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		time.Sleep(work)
		<-slots
		w.Write([]byte("ok"))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go up.Serve(ln)
	defer up.Close()
	rulesPath := filepath.Join(b.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: loose, key: [ip], rate: 1000000, per: 1s}\n"), 0o600)
	for range b.N {
		for _, adaptive := range []bool{false, true} {
			args := []string{"gateway", "--config", rulesPath, "--upstream", "http://" + ln.Addr().String(),
				"--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0", "--decision-log", "off"}
			name := "gateway"
			if adaptive {
				args, name = append(args, "--adaptive"), "gateway --adaptive"
			}
			base, cmd := start(b, args...)
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2048, MaxConnsPerHost: 0}}
			for _, load := range []float64{0.5, 1, 2, 3} {
				good, sent, shed, p99 := offer(client, base, load*capacity, 4*time.Second)
				b.Logf("%-20s load %.1fx: offered %4.0f/s, goodput %4.0f/s (%3.0f%% of capacity), shed %4.0f/s, p99 %v",
					name, load, float64(sent)/4, float64(good)/4, 100*float64(good)/4/capacity, float64(shed)/4, p99.Round(time.Millisecond))
				b.ReportMetric(float64(good)/4, fmt.Sprintf("goodput/s@%.1fx-%s", load, map[bool]string{true: "adaptive", false: "plain"}[adaptive]))
				for len(slots) > 0 { // let the upstream's queue drain before the next level
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(time.Second)
			}
			cmd.Process.Kill()
			cmd.Wait()
		}
	}
}

// offer sends Poisson arrivals at rate for d, each request on its own
// goroutine, and counts the answers of 200 within 1 s, all requests, those
// answered 503, and the p99 latency of the 200s.
func offer(client *http.Client, base string, rate float64, d time.Duration) (good, sent, shed int, p99 time.Duration) {
	rng := rand.New(rand.NewPCG(7, uint64(rate)))
	var mu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	var goodN, shedN atomic.Int64
	start := time.Now()
	next := start
	for next.Sub(start) < d {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		time.Sleep(time.Until(next))
		sent++
		wg.Go(func() {
			t0 := time.Now()
			resp, err := client.Get(base + "/work")
			if err != nil {
				return
			}
			resp.Body.Close()
			lat := time.Since(t0)
			switch {
			case resp.StatusCode == 200 && lat <= time.Second:
				goodN.Add(1)
				mu.Lock()
				lats = append(lats, lat)
				mu.Unlock()
			case resp.StatusCode == 503:
				shedN.Add(1)
			}
		})
	}
	wg.Wait()
	slices.Sort(lats)
	if len(lats) > 0 {
		p99 = lats[len(lats)*99/100]
	}
	return int(goodN.Load()), sent, int(shedN.Load()), p99
}
