package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/server"
	"github.com/sluice-rl/sluice/store/memory"
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

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var configs stringList
	fs.Var(&configs, "config", "a rule file (repeatable; their rules apply together) [$SLUICE_CONFIG, comma-separated]")
	listen := fs.String("listen", envDefault("SLUICE_LISTEN", "127.0.0.1:8080"), "HTTP listen address [$SLUICE_LISTEN]")
	store := fs.String("store", envDefault("SLUICE_STORE", "memory"), "where counts live: memory (the embedded store) [$SLUICE_STORE]")
	maxKeys := fs.Int("max-keys", memory.DefaultMaxKeys, "embedded store: most keys per rule")
	adminToken := fs.String("admin-token", "", "bearer token for the admin endpoints [$SLUICE_ADMIN_TOKEN]")
	storeTimeout := fs.Duration("store-timeout", 5*time.Millisecond, "deadline of each store call")
	watch := fs.Duration("watch", 2*time.Second, "how often to check the rule files for changes (0: only on SIGHUP)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice serve --config FILE [--config FILE...] [--listen 127.0.0.1:8080] [--store memory]")
		fmt.Fprintln(stderr, "\nServes the decision API (POST /v1/check, /v1/check:batch), forward-auth")
		fmt.Fprintln(stderr, "(/v1/auth), /metrics, /healthz, /readyz and the admin endpoints. Reloads the")
		fmt.Fprintln(stderr, "rule files on SIGHUP and when they change; drains on SIGTERM.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice serve --config examples/shop.yaml\n  curl -s -d '{\"attributes\":{\"user\":\"u42\"}}' http://127.0.0.1:8080/v1/check")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage{err}
	}
	if len(configs) == 0 {
		if v := os.Getenv("SLUICE_CONFIG"); v != "" {
			configs = strings.Split(v, ",")
		}
	}
	if *adminToken == "" {
		*adminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
	}
	if len(configs) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return errUsage{errors.New("want at least one --config")}
	}
	if *store != "memory" {
		return fmt.Errorf("--store %q: this build has the embedded store only (memory); the Redis store is coming", *store)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, err := rules.LoadAll(configs...)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errExit{1}
	}
	mem := memory.New(memory.WithMaxKeys(*maxKeys), memory.WithSweepEvery(time.Minute))
	defer mem.Close()
	metrics := server.NewMetrics(buildVersion())
	eng, err := engine.New(cfg, engine.Options{
		Store: mem, Fallback: memory.New(), StoreTimeout: *storeTimeout,
		Logger: log, OnStoreCall: metrics.ObserveStoreCall,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Options{
		Engine: eng, Memory: mem, Metrics: metrics, Logger: log,
		AdminToken: *adminToken, Loopback: server.IsLoopback(*listen),
	})
	if err != nil {
		return err
	}
	if !server.IsLoopback(*listen) && *adminToken == "" {
		log.Warn("sluice: listening beyond loopback without an admin token: the admin endpoints are refused")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler: srv, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go eng.ReloadOnSignal(ctx, configs)
	if *watch > 0 {
		go eng.WatchFile(ctx, *watch, configs...)
	}
	log.Info("sluice: serving", "listen", ln.Addr().String(), "rules", len(cfg.Rules), "store", *store)
	fmt.Fprintf(stdout, "sluice serving on http://%s (%d rules)\n", ln.Addr(), len(cfg.Rules))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("sluice: draining")
	shutdown, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	return hs.Shutdown(shutdown)
}
