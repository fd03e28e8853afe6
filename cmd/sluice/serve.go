package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/global"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/envoy"
	"github.com/sluice-rl/sluice/envoy/xds"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/internal/patient"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/server"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/storecall"
	"github.com/sluice-rl/sluice/tracing"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// envDefault returns the SLUICE_* environment variable, or def.
func envDefault(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// common holds the flags serve and gateway share.
type common struct {
	configs         stringList
	listen          *string
	store           *string
	prefix          *string
	maxKeys         *int
	coarse          *time.Duration
	adminToken      *string
	adminHosts      *string
	storeTimeout    *time.Duration
	storeTimeoutMax *time.Duration
	gateways        *int
	requireStore    *bool
	region          *string
	globalHome      *string
	watch           *time.Duration
	logFormat       *string
	tlsCert         *string
	tlsKey          *string
	decisionLog     *string
	decisionRate    *int
	decisionSample  *int
	mergeDomains    *bool
	// fromXDS: the rules come from an xDS subscription (serve --xds), not
	// from files.
	fromXDS bool

	// pressure, when set (gateway --adaptive), is the factor adaptive
	// rules follow.
	pressure *concurrency.Pressure
}

func commonFlags(fs *flag.FlagSet, listenDefault string) *common {
	c := &common{}
	fs.Var(&c.configs, "config", "a rule `FILE` (repeatable; their rules apply together)")
	c.listen = fs.String("listen", envDefault("SLUICE_LISTEN", listenDefault), "HTTP listen address")
	c.logFormat = fs.String("log-format", "text", "log lines as text (key=value) or json, one object per line (log/slog)")
	c.decisionLog = fs.String("decision-log", "rejected", "log decisions as lines (rule, key hashed unless the rule shows keys, reason, retry-after): rejected, all, or off")
	c.decisionRate = fs.Int("decision-log-rate", 100, "at most this many decision lines a second; the rest are counted in one line a second")
	c.decisionSample = fs.Int("decision-log-sample", 1, "log one decision in this many")
	c.tlsCert = fs.String("tls-cert", "", "serve TLS on every listener with this certificate `FILE` (PEM, the chain after the leaf), reloaded when it changes; needs --tls-key")
	c.tlsKey = fs.String("tls-key", "", "the private key `FILE` (PEM) of --tls-cert")
	c.store = fs.String("store", envDefault("SLUICE_STORE", "memory"), "where counts live: memory (the embedded store), or a Redis URL: redis://host:port/db, rediss://..., redis-cluster://h1:p1,h2:p2, redis-sentinel://master@h1:p1")
	c.prefix = fs.String("redis-prefix", envDefault("SLUICE_REDIS_PREFIX", ""), "Redis: a prefix for every key (default none: keys start with their hash tag, \"{\")")
	c.maxKeys = fs.Int("max-keys", memory.DefaultMaxKeys, "embedded store: most keys per rule")
	c.coarse = fs.Duration("coarse-clock", 0, "embedded store: read time from a clock ticking this often (such as 1ms) instead of the exact clock: faster, up to one tick less precise")
	c.adminToken = fs.String("admin-token", "", "bearer token for the admin endpoints")
	c.adminHosts = fs.String("admin-allowed-hosts", "", "comma-separated host names, besides loopback addresses and localhost, that admin requests without a token may be addressed to (their Host)")
	c.storeTimeout = fs.Duration("store-timeout", 0, "a fixed deadline for each store call (default: adaptive, 4x the store's recent peak latency within 50ms and --store-timeout-max)")
	c.storeTimeoutMax = fs.Duration("store-timeout-max", storecall.MaxTimeout, "the cap of the adaptive store deadline: the longest a request waits for a store that does not answer")
	c.region = fs.String("region", envDefault("SLUICE_REGION", ""), "this gateway's region: rules with regions enforce that region's share of their limit")
	c.globalHome = fs.String("global-home", envDefault("SLUICE_GLOBAL_HOME", ""), "rules with global: the Redis URL every region reaches, where the regions move shares of their limits (with --region)")
	c.requireStore = fs.Bool("require-store", false, "exit with status 1 if the store does not answer within 10s of start (default: warn, serve degraded, and report not ready until it answers)")
	c.gateways = fs.Int("gateways", 0, "how many gateways share the store, for the share of a limit each counts while the store fails (default: the live count, from heartbeats in the store)")
	c.watch = fs.Duration("watch", 2*time.Second, "how often to check the rule files for changes (0: only on SIGHUP)")
	c.mergeDomains = fs.Bool("merge-domains", os.Getenv("MERGE_DOMAIN_CONFIG") == "true" || os.Getenv("SLUICE_MERGE_DOMAINS") == "true", "let several envoyproxy/ratelimit files declare one domain, their descriptors merged (the reference's MERGE_DOMAIN_CONFIG=true); otherwise a second file for a domain is refused")
	return c
}

// setup is what serve and gateway build from the common flags.
type setup struct {
	log     *slog.Logger
	live    *server.Live   // the live page's state
	tls     *certFiles     // nil: plain TCP
	mem     *memory.Store  // nil when counts live in Redis
	share   *share.Store   // the sync modes around the store
	global  *global.Runner // nil: no --global-home
	fleet   rlqs.Fleet     // the store the processes share (Redis); nil for the embedded one
	closers []func()
	eng     *engine.Engine
	engine  atomic.Pointer[engine.Engine] // eng, for goroutines started before it
	metrics *metrics.Metrics
	tracer  *tracing.Tracer // nil: tracing off
	rules   int
	// overrides are the operators' overrides this process follows, in
	// the store: the process's own for the embedded one.
	overrides *overrides.Follower
	json      bool // --log-format json: the start-up lines on stdout are JSON too
}

// say writes a start-up line to stdout: plain text, or with --log-format
// json one JSON object ({"banner": ...}), so that a log shipper reading
// stdout reads JSON only.
func (s *setup) say(stdout io.Writer, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if s.json {
		b, _ := json.Marshal(map[string]string{"banner": line})
		line = string(b)
	}
	fmt.Fprintln(stdout, line)
}

// build makes what serve and gateway share from the common flags, in the
// order each part needs the one before: flags and logger, rule files, store
// (and its fallback), the share layer, metrics, tracing, the operators'
// overrides, the engine, the membership heartbeat. Each step fails with
// the flag at fault.
func (c *common) build(stderr io.Writer) (*setup, error) {
	s, err := c.start(stderr)
	if err != nil {
		return nil, err
	}
	cfg, err := c.loadRules(s, stderr)
	if err != nil {
		return nil, err
	}
	store, overridesStore, gateways, err := c.openStore(s)
	if err != nil {
		return nil, err
	}
	if err := checkRegion(cfg, *c.region, *c.globalHome); err != nil {
		return nil, err
	}
	// Every rule's sync mode is decided by the share layer around the store.
	table := &sharingTable{region: *c.region}
	demand := global.NewDemand(0)
	wrapped, sh := share.Wrap(store, table.follow(share.Options{
		Local: memory.New(), Gateways: gateways, Demand: demand,
		// The deny cache spares a shared store the calls of refused keys;
		// the embedded store answers them as fast as the cache would.
		NoDenyCache: s.mem != nil,
	}, func() *rules.Config { return s.eng.Config() }))
	s.share = sh
	s.closers = append([]func(){sh.Close}, s.closers...) // leases go back before the store closes
	s.metrics = metrics.New(buildVersion())
	tracer, flush, err := tracingFromEnv(s.log)
	if err != nil {
		return nil, errUsage{err}
	}
	s.tracer = tracer
	s.closers = append(s.closers, flush)
	var dl *engine.DecisionLog
	if *c.decisionLog != "off" {
		dl = &engine.DecisionLog{Logger: s.log, All: *c.decisionLog == "all", PerSecond: *c.decisionRate, Sample: *c.decisionSample}
	}
	s.live = server.NewLive()
	s.followOverrides(overridesStore)
	s.eng, err = engine.New(cfg, engine.Options{
		Overrides: s.overrides.Current,
		Load:      rules.LoadOptions{MergeDomains: *c.mergeDomains},
		Store:     wrapped, Fallback: memory.New(), Gateways: gateways,
		Calls: storecall.Options{
			Timeout: *c.storeTimeout, TimeoutMax: *c.storeTimeoutMax, Name: redactedURL(*c.store),
			OnCall: func(d time.Duration, err error) { s.metrics.ObserveStoreCall(d, err); s.live.StoreCall(d, err) },
		},
		Logger: s.log, DecisionLog: dl,
		OnReject: s.live.Rejected, OnLock: s.live.Locked,
		Pressure: c.pressureFactor(),
	})
	if err != nil {
		return nil, err
	}
	s.engine.Store(s.eng)
	if *c.store != "memory" {
		s.closers = append([]func(){s.writeBack}, s.closers...)
	}
	if h, ok := store.(interface{ LimitHistory() *redis.LimitHistory }); ok {
		// The limits each rule is counted under, shared with the other
		// processes on the store: a key keeps its usage across a change
		// this process did not see (engine/carry.go).
		ctx, cancel := context.WithCancel(context.Background())
		s.eng.FollowLimits(ctx, h.LimitHistory(), 2*time.Second)
		s.closers = append([]func(){cancel}, s.closers...)
	}
	if err := c.runGlobal(s, store, demand); err != nil {
		return nil, err
	}
	s.live.Attach(s.eng)
	s.metrics.WatchPressure(c.pressure)
	if *c.store != "memory" {
		if err := s.reachStore(*c.store, *c.requireStore); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// start reads the flags the environment gives defaults for, checks those
// that must agree with each other, and makes the logger and the TLS
// certificates.
func (c *common) start(stderr io.Writer) (*setup, error) {
	if len(c.configs) == 0 {
		if v := os.Getenv("SLUICE_CONFIG"); v != "" {
			c.configs = strings.Split(v, ",")
		}
	}
	if *c.adminToken == "" {
		*c.adminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
	}
	switch {
	case c.fromXDS && len(c.configs) > 0:
		return nil, errUsage{errors.New("--xds and --config: the rules come from the xDS server or from files, not both")}
	case len(c.configs) == 0 && !c.fromXDS:
		return nil, errUsage{errors.New("want at least one --config")}
	}
	s := &setup{json: *c.logFormat == "json"}
	switch *c.logFormat {
	case "text":
		s.log = slog.New(slog.NewTextHandler(stderr, nil))
	case "json":
		s.log = slog.New(slog.NewJSONHandler(stderr, nil))
	default:
		return nil, errUsage{fmt.Errorf("--log-format %q: want text or json", *c.logFormat)}
	}
	switch {
	case *c.decisionLog != "rejected" && *c.decisionLog != "all" && *c.decisionLog != "off":
		return nil, errUsage{fmt.Errorf("--decision-log %q: want rejected, all or off", *c.decisionLog)}
	case *c.decisionRate < 1 || *c.decisionSample < 1:
		return nil, errUsage{errors.New("--decision-log-rate and --decision-log-sample must be at least 1")}
	}
	if (*c.tlsCert == "") != (*c.tlsKey == "") {
		return nil, errUsage{errors.New("give both --tls-cert and --tls-key, or neither")}
	}
	if *c.tlsCert != "" {
		var err error
		if s.tls, err = loadCertFiles(*c.tlsCert, *c.tlsKey, s.log); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// loadRules loads the rule files (none with --xds: the rules come later),
// each fault written to stderr, file:line:column first.
func (c *common) loadRules(s *setup, stderr io.Writer) (*rules.Config, error) {
	cfg, err := rules.LoadOptions{MergeDomains: *c.mergeDomains}.LoadAll(c.configs...)
	if c.fromXDS && err == nil {
		cfg.Version = "" // no rules (no files) until the first configuration
	}
	if err != nil {
		if *c.logFormat == "json" {
			s.log.Error("sluice: rule files refused", "files", []string(c.configs), "faults", faults(err))
		} else if es := (rules.Errors)(nil); errors.As(err, &es) {
			fmt.Fprintln(stderr, err) // one fault per line, file:line:column first
		} else {
			fmt.Fprintf(stderr, "sluice: %s\n", strings.TrimPrefix(err.Error(), "rules: ")) // a file that cannot be read
		}
		return nil, errExit{1}
	}
	s.rules = len(cfg.Rules)
	return cfg, nil
}

// openStore opens the store --store names, the operators' overrides' store
// beside it, and how many gateways share it: the embedded store, or Redis
// with the membership heartbeat that counts the gateways.
func (c *common) openStore(s *setup) (sluice.Store, overrides.Store, func() int, error) {
	opts := []memory.Option{memory.WithMaxKeys(*c.maxKeys), memory.WithSweepEvery(time.Minute)}
	if *c.coarse > 0 {
		clock := sluice.NewCoarseClock(*c.coarse)
		s.closers = append(s.closers, clock.Stop)
		opts = append(opts, memory.WithClock(clock))
	}
	s.mem = memory.New(opts...)
	gateways := func() int { return max(*c.gateways, 1) }
	if *c.store == "memory" {
		return s.mem, &overrides.Memory{}, gateways, nil
	}
	// Lazy: a gateway starts, and serves degraded, while Redis is down.
	rs, err := redis.New(redis.Options{URL: *c.store, Prefix: *c.prefix, Lazy: true})
	if err != nil {
		return nil, nil, nil, err
	}
	m := share.NewMembership(rs, gatewayID(), time.Second, *c.gateways, s.log)
	m.OnAnswer = func() { // the store answers: write back what is owed
		if e := s.engine.Load(); e != nil {
			e.Store().Answered()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	s.closers = append(s.closers, func() { cancel(); <-done }, rs.Close) // leave the set, then close
	s.mem = nil                                                          // the embedded store is then only the fail-open fallback
	s.fleet = rs
	return rs, rs.Overrides(), m.Gateways, nil
}

// followOverrides reads the operators' overrides in force before the first
// request, and follows their store from then on; a store that does not
// answer yet is followed until it does.
func (s *setup) followOverrides(store overrides.Store) {
	s.overrides = &overrides.Follower{Store: store, Logger: s.log, OnChange: func(*overrides.Set) {
		if e := s.engine.Load(); e != nil {
			e.LimitsChanged() // the limits in use, noted for the other processes at once
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	if err := s.overrides.Refresh(rctx); err != nil {
		s.log.Warn("sluice: the operators' overrides could not be read at start; following the store until they can", "error", err)
	}
	rcancel()
	done := make(chan struct{})
	go func() { s.overrides.Run(ctx); close(done) }()
	s.closers = append([]func(){func() { cancel(); <-done }}, s.closers...)
}

// writeBack, on shutdown, writes back to the store what was admitted while
// it did not answer, before the store's client closes.
func (s *setup) writeBack() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if written, dropped := s.eng.Store().WriteBack(ctx); dropped > 0 {
		s.log.Warn("sluice: stopping with units admitted while the store did not answer, not written back to it", "written", written, "dropped", dropped)
	} else if written > 0 {
		s.log.Info("sluice: wrote back to the store what was admitted while it did not answer", "units", written)
	}
}

// pingWithin pings the store and waits at most d for its answer. A store
// that accepts connections but never answers (hung) can hold a client's
// connection set-up longer than its context says; start-up must not wait
// for it.
func (s *setup) pingWithin(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	done := make(chan error, 1)
	go func() { done <- s.eng.Store().Ping(ctx) }()
	defer cancel()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %v", d)
	}
}

// reachStore tries the store once at start. A store that does not answer
// is said at once, with its URL and the error: a typo in --store would
// otherwise turn a shared limit into each gateway's share without a word.
// With require, it is retried for 10 s and then fatal.
func (s *setup) reachStore(url string, require bool) error {
	bound := 2 * time.Second
	if require {
		bound = 10 * time.Second
	}
	deadline := time.Now().Add(bound)
	for {
		err := s.pingWithin(min(time.Second, max(time.Until(deadline), 10*time.Millisecond)))
		switch {
		case err == nil:
			return nil
		case time.Now().Before(deadline) && require:
			time.Sleep(200 * time.Millisecond)
			continue
		case require:
			return fmt.Errorf("the store %s does not answer (--require-store): %v", redactedURL(url), err)
		}
		s.log.Warn("sluice: the store does not answer; serving degraded (each rule fails open within its share, or closed) and not ready until it does",
			"store", redactedURL(url), "err", err)
		return nil
	}
}

// redactedURL is a store URL without its password, for logs.
func redactedURL(s string) string { return redis.Redact(s) }

// checkRegion refuses a --region that a rule with regions or global gives
// no share, and a global rule without --global-home.
func checkRegion(cfg *rules.Config, region, home string) error {
	for _, r := range cfg.Rules {
		shares := r.Regions
		if g := r.Global; g != nil {
			if home == "" {
				return fmt.Errorf("rule %s is global (%s:%d): start the gateway with --global-home REDIS-URL, the store every region reaches", r.ID, cfg.File, r.Line)
			}
			shares = map[string]float64{}
			for name := range g.Own {
				shares[name] = 1
			}
		}
		if len(shares) == 0 {
			continue
		}
		if region == "" {
			return fmt.Errorf("rule %s gives regions a share (%s:%d): start the gateway with --region NAME", r.ID, cfg.File, r.Line)
		}
		if _, ok := shares[region]; !ok {
			return fmt.Errorf("rule %s (%s:%d) gives region %q no share", r.ID, cfg.File, r.Line, region)
		}
	}
	return nil
}

// sharingTable is the rule set's sync settings and regional shares by rule
// id, rebuilt when the rule set is reloaded.
type sharingTable struct {
	region string
	cur    atomic.Pointer[sharingEntry]
}

type sharingEntry struct {
	cfg      *rules.Config
	sync     map[string]sluice.Sharing
	regions  map[string]float64
	portions map[string]int64 // global rules: the region's own share
	allExact bool             // every rule exact, unsharded and whole here
}

func (t *sharingTable) get(cfg *rules.Config) *sharingEntry {
	if e := t.cur.Load(); e != nil && e.cfg == cfg {
		return e
	}
	e := &sharingEntry{cfg: cfg, sync: map[string]sluice.Sharing{}, regions: map[string]float64{}, portions: map[string]int64{}, allExact: true}
	for _, r := range cfg.Rules {
		e.sync[r.ID] = r.Sync
		if f, ok := r.Regions[t.region]; ok {
			e.regions[r.ID] = f
		}
		if g := r.Global; g != nil {
			e.portions[r.ID] = g.Own[t.region]
		}
		if r.Sync.Mode != sluice.SyncExact || r.Sync.Shards > 1 || len(e.regions) > 0 || len(e.portions) > 0 {
			e.allExact = false
		}
	}
	t.cur.Store(e)
	return e
}

// follow points opts' questions about rules (Sharing, Scale, AllExact)
// at the table of the rule set config returns, the engine's current one.
func (t *sharingTable) follow(opts share.Options, config func() *rules.Config) share.Options {
	opts.Sharing = func(rule string) sluice.Sharing { return t.get(config()).sync[rule] }
	opts.Scale = func(rule string) float64 { return t.get(config()).scale(rule) }
	opts.Portion = func(rule string) int64 { return t.get(config()).portions[rule] }
	opts.AllExact = func() bool { return t.get(config()).allExact }
	return opts
}

func (e *sharingEntry) scale(rule string) float64 {
	if f, ok := e.regions[rule]; ok {
		return f
	}
	return 1
}

// gatewayID names this process in the store's membership set.
func gatewayID() string {
	host, _ := os.Hostname()
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

// serveUntilDone serves hs on ln, reloading the rules on SIGHUP and file
// changes, until ctx is done; then it drains in-flight requests.
func (c *common) serveUntilDone(ctx context.Context, s *setup, servers ...*listening) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.configs) > 0 {
		go s.eng.ReloadOnSignal(ctx, c.configs)
	}
	go s.live.Run(ctx)
	if *c.watch > 0 && len(c.configs) > 0 {
		go s.eng.WatchFile(ctx, *c.watch, c.configs...)
	}
	errc := make(chan error, len(servers))
	for _, l := range servers {
		go func() { errc <- l.srv.Serve(l.ln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.log.Info("sluice: draining")
	shutdown, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	// Every listener drains at once: a rolling restart's clients move
	// to other replicas while this one finishes what it has taken.
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, l := range servers {
		wg.Go(func() { errs[i] = l.srv.Shutdown(shutdown) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

type listening struct {
	srv interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
	}
	ln net.Listener
}

// listen opens addr with server timeouts against slow clients.
func listen(addr string, h http.Handler, certs *certFiles) (*listening, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &listening{ln: certs.wrap(ln, "h2", "http/1.1"), srv: &http.Server{
		Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
	}}, nil
}

// runServe is `sluice serve`: its flags, their checks, then the listeners
// started and served until ctx ends; one linear sequence, read whole.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := commonFlags(fs, "127.0.0.1:8080")
	grpcListen := fs.String("grpc-listen", envDefault("SLUICE_GRPC_LISTEN", ""), "listen address of Envoy's rate limit service (gRPC), such as 127.0.0.1:8081")
	grpcServer := fs.String("grpc-server", envDefault("SLUICE_GRPC_SERVER", "sluice"), "the gRPC server behind --grpc-listen: sluice (its own unary HTTP/2 server, the faster) or grpc-go")
	grpcMaxConns := fs.Int("grpc-max-connections", envoy.DefaultGRPCMaxConnections, "the most gRPC connections served at once; beyond it, new ones wait to be accepted")
	grpcIdle := fs.Duration("grpc-max-connection-idle", envoy.DefaultGRPCIdle, "close a gRPC connection that has had no call for this long (negative: never)")
	grpcAge := fs.Duration("grpc-max-connection-age", envoy.DefaultGRPCMaxAge, "drain a gRPC connection this long after it opened, ±10%, so that clients spread over new replicas (negative: never)")
	grpcGrace := fs.Duration("grpc-max-connection-age-grace", envoy.DefaultGRPCMaxAgeGrace, "what the calls of a connection drained for its age have before it closes")
	dynMeta := fs.Bool("envoy-dynamic-metadata", os.Getenv("SLUICE_ENVOY_DYNAMIC_METADATA") == "true", "add envoyproxy/ratelimit's dynamic metadata (domain, descriptors, hits_addend, metadata of passed descriptors) to Envoy answers")
	legacy := fs.Bool("legacy-headers", os.Getenv("SLUICE_LEGACY_HEADERS") == "true", "also answer X-RateLimit-Limit, -Remaining and -Reset (in /v1/check's headers, forward-auth answers and Envoy's response headers)")
	xf := xdsFlagSet(fs)
	authProxy := fs.String("auth-proxy", envDefault("SLUICE_AUTH_PROXY", "nginx"), "the proxy calling forward-auth (/v1/auth): nginx, traefik, caddy or envoy; only the headers it sets are believed")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice serve --config FILE [--config FILE...] [--listen 127.0.0.1:8080] [--grpc-listen 127.0.0.1:8081] [--store memory]")
		fmt.Fprintln(stderr, "\nServes the decision API (POST /v1/check, /v1/check:batch), forward-auth")
		fmt.Fprintln(stderr, "(/v1/auth), /metrics, /healthz, /readyz, the admin endpoints and, with")
		fmt.Fprintln(stderr, "--grpc-listen, Envoy's rate limit service. A --config may be in")
		fmt.Fprintln(stderr, "envoyproxy/ratelimit's format (top-level domain/descriptors). Reloads the")
		fmt.Fprintln(stderr, "rule files on SIGHUP and when they change; drains on SIGTERM.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice serve --config examples/shop.yaml\n  curl -s -d '{\"attributes\":{\"user\":\"u42\"}}' http://127.0.0.1:8080/v1/check")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) > 0 {
		return errUsage{fmt.Errorf("unexpected arguments %q", positional)}
	}
	if *grpcServer != "sluice" && *grpcServer != "grpc-go" {
		return errUsage{fmt.Errorf("--grpc-server %q: want sluice or grpc-go", *grpcServer)}
	}
	if *grpcMaxConns <= 0 || *grpcGrace <= 0 {
		return errUsage{errors.New("--grpc-max-connections and --grpc-max-connection-age-grace must be > 0")}
	}
	proxy, err := server.ParseAuthProxy(*authProxy)
	if err != nil {
		return errUsage{err}
	}
	if t := os.Getenv("CONFIG_TYPE"); t != "" && t != "FILE" && t != "GRPC_XDS_SOTW" {
		return errUsage{fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", t)}
	}
	var sub *xds.Client
	if *xf.server != "" {
		c.fromXDS = true
		if sub, err = xf.client(*c.mergeDomains); err != nil {
			return errUsage{err}
		}
	}
	s, err := c.build(stderr)
	if err != nil {
		return err
	}
	defer s.close()
	var rulesSource server.RulesSource
	if sub != nil {
		rulesSource = sub
		sub.Logger = s.log
		sub.Apply = func(cfg *rules.Config, version string) {
			s.eng.Reload(cfg)
			s.log.Info("sluice: rules applied from xDS", "version", version, "rules", len(cfg.Rules), "domains", cfg.EnvoyDomains)
		}
		s.metrics.WatchRules(sub)
	}
	srv, err := server.New(server.Options{
		Rules: rulesSource, Tracer: s.tracer, Region: *c.region,
		Engine: s.eng, Memory: s.mem, Metrics: s.metrics, Logger: s.log, Share: s.share,
		AdminToken: *c.adminToken, Loopback: server.IsLoopback(*c.listen), AdminHosts: c.allowedHosts(), AuthProxy: proxy,
		HTTP: httplimit.Options{LegacyHeaders: *legacy}, Live: s.live, Pressure: c.pressure, Overrides: s.overrides,
	})
	if err != nil {
		return err
	}
	if !server.IsLoopback(*c.listen) && *c.adminToken == "" {
		s.log.Warn("sluice: listening beyond loopback without an admin token: the admin endpoints are refused")
	}
	l, err := listen(*c.listen, srv, s.tls)
	if err != nil {
		return err
	}
	s.log.Info("sluice: serving", "listen", l.ln.Addr().String(), "tls", s.tls != nil, "rules", s.rules, "store", redactedURL(*c.store))
	if sub != nil {
		s.log.Info("sluice: taking the rules from xDS", "server", sub.Server, "node", sub.NodeID, "tls", sub.TLS != nil)
		s.say(stdout, "sluice serving on %s://%s (rules from the xDS server %s, node %s)", s.scheme("http"), l.ln.Addr(), sub.Server, sub.NodeID)
		go func() {
			if err := sub.Run(ctx); err != nil {
				s.log.Error("sluice: no xDS subscription", "error", err)
			}
		}()
	} else {
		s.say(stdout, "sluice serving on %s://%s (%s)", s.scheme("http"), l.ln.Addr(), plural(s.rules, "rule"))
	}
	base := s.scheme("http") + "://" + l.ln.Addr().String()
	s.say(stdout, "sluice live page %s/ui, metrics %s/metrics, readiness %s/readyz", base, base, base)
	servers := []*listening{l}
	if *grpcListen != "" {
		gl, err := net.Listen("tcp", *grpcListen)
		if err != nil {
			l.ln.Close()
			return err
		}
		o := envoy.GRPCOptions{
			MaxConnections: *grpcMaxConns, MaxConnectionIdle: *grpcIdle,
			MaxConnectionAge: *grpcAge, MaxConnectionAgeGrace: *grpcGrace,
		}
		if s.tls != nil {
			o.TLS = s.tls.config()
		}
		rls, err := envoy.New(envoy.Options{
			Engine: s.eng, HTTP: httplimit.Options{LegacyHeaders: *legacy}, DynamicMetadata: *dynMeta,
			Metrics: s.metrics, Logger: s.log, Tracer: s.tracer, QuotaFleet: s.fleet,
		})
		if err != nil {
			gl.Close()
			l.ln.Close()
			return err
		}
		s.metrics.WatchQuota(func() metrics.QuotaStats {
			st := rls.Quota().Stats()
			return metrics.QuotaStats{
				Streams: st.Streams, Subscriptions: st.Subscriptions, Pending: st.Pending, Buckets: st.Buckets,
				Reports: st.Reports, Responses: st.Responses, Refused: st.Refused, Unpaid: st.Unpaid, Lost: st.Lost, Abandoned: st.Abandoned,
			}
		})
		g, err := rls.NewGRPC(*grpcServer, o)
		if err != nil {
			gl.Close()
			l.ln.Close()
			return errUsage{err}
		}
		servers = append(servers, &listening{ln: patient.Listener(gl, s.log), srv: g})
		s.log.Info("sluice: Envoy rate limit service", "listen", gl.Addr().String(), "server", *grpcServer)
		s.say(stdout, "sluice Envoy rate limit service and rate limit quota service on %s://%s", s.scheme("grpc"), gl.Addr())
	}
	return c.serveUntilDone(ctx, s, servers...)
}

func (s *setup) close() {
	if s.mem != nil {
		s.mem.Close()
	}
	for _, c := range s.closers {
		c()
	}
}

// faults lists a load error's faults, one string each.
func faults(err error) []string {
	var es rules.Errors
	if errors.As(err, &es) {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = e.Error()
		}
		return out
	}
	return []string{err.Error()}
}

// scheme is plain, or plain+"s" when the listeners serve TLS.
func (s *setup) scheme(plain string) string {
	if s.tls != nil {
		return plain + "s"
	}
	return plain
}

// allowedHosts is --admin-allowed-hosts as a list.
func (c *common) allowedHosts() []string {
	var hosts []string
	for h := range strings.SplitSeq(*c.adminHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// pressureFactor is the engine's pressure source: the gateway's measured
// one with --adaptive, else one that only an operator sets (PUT
// /v1/pressure).
func (c *common) pressureFactor() func() float64 {
	if c.pressure == nil {
		c.pressure = concurrency.NewPressure(concurrency.PressureOptions{})
	}
	return c.pressure.Factor
}
