package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"

	"github.com/sluice-rl/sluice/concurrency"

	"github.com/sluice-rl/sluice/gateway"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/internal/patient"
	"github.com/sluice-rl/sluice/server"
)

// runGateway is `sluice gateway`: its flags, their checks, the chosen data
// plane in front of the upstream, then serving until ctx ends; one linear
// sequence, read whole.
func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := commonFlags(fs, "127.0.0.1:8000") // not serve's 8080: both can run side by side
	upstream := fs.String("upstream", "", "the service to protect, such as http://127.0.0.1:9000 (required)")
	adminListen := fs.String("admin-listen", "127.0.0.1:9091", "listener for /metrics, /healthz, /readyz and the admin endpoints (empty: none)")
	legacy := fs.Bool("legacy-headers", false, "also send X-RateLimit-Limit, -Remaining and -Reset")
	adaptive := fs.Bool("adaptive", false, "follow the upstream's health: bound the requests in flight to it by a limit that follows its latency (MinRTT: within 10% of its least latency, 4 to --adaptive-max; beyond it, 503 at once), and shrink the rate of rules marked adaptive when its answers fail or slow down")
	adaptiveMax := fs.Int("adaptive-max", 1000, "the adaptive concurrency limit's largest value")
	adaptiveLatency := fs.Duration("adaptive-latency", 0, "with --adaptive, the upstream latency above which adaptive rules shrink their rate (target / latency); 0: only failures count (over 5% of answers failing, shed or 5xx)")
	adaptiveFloor := fs.Float64("adaptive-floor", 0.1, "with --adaptive, the smallest share of their rate adaptive rules keep under pressure")
	noUpgrades := fs.Bool("no-upgrades", false, "refuse protocol upgrades (WebSocket) with 501 instead of passing them to the upstream")
	tunnelIdle := fs.Duration("tunnel-idle-timeout", gateway.DefaultTunnelIdle, "end an upgraded connection (WebSocket) no byte has crossed for this long")
	tunnelMax := fs.Duration("tunnel-max-duration", gateway.DefaultTunnelMax, "end an upgraded connection this long after it opened")
	maxTunnels := fs.Int("max-tunnels", 0, "the most upgraded connections open at once, beyond which 503 (0: a quarter of the open-file limit, at most 10000)")
	upstreamIdle := fs.Duration("upstream-idle-timeout", gateway.DefaultUpstreamIdle, "close a connection to the upstream idle this long (sooner if the upstream announces a shorter Keep-Alive timeout); keep it under the upstream's own keep-alive timeout")
	upstreamCA := fs.String("upstream-ca", "", "PEM file of the certificate authorities an https upstream is checked against (default: the system's)")
	plane := fs.String("data-plane", envDefault("SLUICE_DATA_PLANE", "fasthttp"), "the proxy's HTTP stack: fasthttp (faster, HTTP/1.x to clients) or net/http (HTTP/2 to clients too)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice gateway --config FILE --upstream URL [--listen 127.0.0.1:8000] [--admin-listen 127.0.0.1:9091]")
		fmt.Fprintln(stderr, "\nA reverse proxy in front of --upstream that applies the rules itself:")
		fmt.Fprintln(stderr, "over a limit, clients get 429 by the book and the upstream never sees them.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice gateway --config examples/shop.yaml --upstream http://127.0.0.1:9000")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	u, err := url.Parse(*upstream)
	if *upstream == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(positional) > 0 {
		return errUsage{errors.New("want --upstream http://HOST:PORT")}
	}
	if *adaptiveFloor <= 0 || *adaptiveFloor > 1 {
		return errUsage{fmt.Errorf("--adaptive-floor %v: want a share in (0, 1]", *adaptiveFloor)}
	}
	if *adaptive {
		c.pressure = concurrency.NewPressure(concurrency.PressureOptions{Target: *adaptiveLatency, Floor: *adaptiveFloor})
	}
	s, err := c.build(stderr)
	if err != nil {
		return err
	}
	defer s.close()
	var conc *concurrency.Limiter
	if *adaptive {
		// With a priority section, each level keeps a tenth of the limit
		// from the levels below: the lowest is shed first.
		var tiers []float64
		if p := s.eng.Config().Priority; p != nil {
			for range len(p.Levels) - 1 {
				tiers = append(tiers, 0.1)
			}
		}
		conc = concurrency.New(concurrency.NewMinRTT(concurrency.MinRTT{}), concurrency.Options{Min: 4, Max: *adaptiveMax, Tiers: tiers})
		s.metrics.WatchConcurrency(conc)
	}
	if *tunnelIdle <= 0 || *tunnelMax <= 0 || *maxTunnels < 0 {
		return errUsage{errors.New("--tunnel-idle-timeout and --tunnel-max-duration must be > 0, --max-tunnels >= 0")}
	}
	if *upstreamIdle <= 0 {
		return errUsage{errors.New("--upstream-idle-timeout must be > 0")}
	}
	var upstreamTLS *tls.Config
	if *upstreamCA != "" {
		pem, err := os.ReadFile(*upstreamCA)
		if err != nil {
			return errUsage{fmt.Errorf("--upstream-ca: %w", err)}
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return errUsage{fmt.Errorf("--upstream-ca %s: no PEM certificate in it", *upstreamCA)}
		}
		upstreamTLS = &tls.Config{RootCAs: roots}
	}
	gwo := gateway.Options{
		UpstreamTLS: upstreamTLS, UpstreamIdle: *upstreamIdle,
		HTTP:   httplimit.Options{LegacyHeaders: *legacy, Concurrency: conc, Pressure: c.pressure, Tracer: s.tracer.Pipeline()},
		Logger: s.log, Metrics: s.metrics,
		Upgrades: gateway.Upgrades{Refuse: *noUpgrades, IdleTimeout: *tunnelIdle, MaxDuration: *tunnelMax, MaxTunnels: *maxTunnels},
	}
	p, err := gateway.New(*plane, u, s.eng, gwo)
	if err != nil {
		return errUsage{fmt.Errorf("--data-plane: %w", err)}
	}
	ln, err := net.Listen("tcp", *c.listen)
	if err != nil {
		return err
	}
	front := &listening{ln: s.tls.wrap(patient.Listener(ln, s.log), p.Protocols()...), srv: p}
	servers := []*listening{front}
	if *adminListen != "" {
		adm, err := server.New(server.Options{
			Engine: s.eng, Region: *c.region, Memory: s.mem, Metrics: s.metrics, Logger: s.log, Share: s.share,
			AdminToken: *c.adminToken, Loopback: server.IsLoopback(*adminListen), AdminHosts: c.allowedHosts(),
			Upstream: gateway.UpstreamCheck(u), Live: s.live, Pressure: c.pressure, Overrides: s.overrides,
		})
		if err != nil {
			return err
		}
		al, err := listen(*adminListen, adm, s.tls)
		if err != nil {
			front.ln.Close()
			return err
		}
		servers = append(servers, al)
	}
	s.log.Info("sluice: gateway", "listen", front.ln.Addr().String(), "upstream", u.String(), "rules", s.rules)
	s.say(stdout, "sluice gateway on %s://%s -> %s (%s)", s.scheme("http"), front.ln.Addr(), u, plural(s.rules, "rule"))
	if len(servers) > 1 {
		admin := s.scheme("http") + "://" + servers[1].ln.Addr().String()
		s.log.Info("sluice: admin listener", "listen", servers[1].ln.Addr().String())
		s.say(stdout, "sluice admin on %s: live page %s/ui, metrics %s/metrics, readiness %s/readyz", admin, admin, admin, admin)
	} else {
		s.say(stdout, "sluice admin: none (--admin-listen ADDR serves the live page, metrics and readiness)")
	}
	return c.serveUntilDone(ctx, s, servers...)
}
