package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/envoy/xds"
)

// xdsFlags are serve's flags for taking the rules from an xDS management
// server. Their defaults come from envoyproxy/ratelimit's environment
// variables, so that a deployment written for it (Envoy Gateway's) runs
// sluice unchanged: CONFIG_TYPE=GRPC_XDS_SOTW turns the subscription on.
type xdsFlags struct {
	server, node, ca, cert, key, serverName *string
	useTLS                                  *bool
}

func xdsFlagSet(fs *flag.FlagSet) *xdsFlags {
	server := ""
	if os.Getenv("CONFIG_TYPE") == "GRPC_XDS_SOTW" {
		server = envDefault("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
	}
	x := &xdsFlags{}
	x.server = fs.String("xds", server, "take the rules from this xDS management server (`ADDRESS` host:port): RateLimitConfig resources over ADS, as envoyproxy/ratelimit with CONFIG_TYPE=GRPC_XDS_SOTW; instead of --config")
	x.node = fs.String("xds-node", envDefault("CONFIG_GRPC_XDS_NODE_ID", "default"), "the node id sent to the xDS management server, which keys its snapshots by node")
	useTLS := os.Getenv("CONFIG_GRPC_XDS_SERVER_USE_TLS") == "true"
	x.useTLS = fs.Bool("xds-tls", useTLS, "connect to the xDS server over TLS (implied by the --xds-ca, --xds-cert and --xds-server-name flags)")
	x.ca = fs.String("xds-ca", envIf(useTLS, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), "trust the CAs in this PEM `FILE` for the xDS server's certificate (default: the system's)")
	x.cert = fs.String("xds-cert", envIf(useTLS, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), "a client certificate `FILE` (PEM) for the xDS server; needs --xds-key")
	x.key = fs.String("xds-key", envIf(useTLS, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), "the private key `FILE` of --xds-cert")
	x.serverName = fs.String("xds-server-name", envIf(useTLS, "CONFIG_GRPC_XDS_SERVER_TLS_SAN"), "the name the xDS server's certificate must carry (default: the host of --xds)")
	return x
}

func envIf(on bool, name string) string {
	if !on {
		return ""
	}
	return os.Getenv(name)
}

// client builds the subscription from the flags and the reference's
// remaining variables (backoff, headers, node metadata, message size).
func (x *xdsFlags) client(mergeDomains bool) (*xds.Client, error) {
	c := &xds.Client{Server: *x.server, NodeID: *x.node, MergeDomains: mergeDomains}
	var err error
	if c.NodeMetadata, err = pairs("CONFIG_GRPC_XDS_NODE_METADATA", "="); err != nil {
		return nil, err
	}
	if c.Headers, err = pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ":"); err != nil {
		return nil, err
	}
	if v := os.Getenv("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); v != "" {
		if c.MaxMessageBytes, err = strconv.Atoi(v); err != nil || c.MaxMessageBytes < 0 {
			return nil, fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=%q: want a number of bytes", v)
		}
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", &c.Backoff.Initial}, {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", &c.Backoff.Max}} {
		if v := os.Getenv(d.name); v != "" {
			if *d.to, err = time.ParseDuration(v); err != nil || *d.to <= 0 {
				return nil, fmt.Errorf("%s=%q: want a duration such as 10s", d.name, v)
			}
		}
	}
	if v := os.Getenv("XDS_CLIENT_BACKOFF_RANDOM_FACTOR"); v != "" {
		if c.Backoff.RandomFactor, err = strconv.ParseFloat(v, 64); err != nil || c.Backoff.RandomFactor < 0 || c.Backoff.RandomFactor > 1 {
			return nil, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%q: want a number from 0 to 1", v)
		}
	}
	if v := os.Getenv("XDS_CLIENT_BACKOFF_JITTER"); v != "" {
		jitter, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("XDS_CLIENT_BACKOFF_JITTER=%q: want true or false", v)
		}
		c.Backoff.NoJitter = !jitter
	}
	if c.TLS, err = x.tls(); err != nil {
		return nil, err
	}
	return c, nil
}

// pairs reads a variable of comma-separated name<sep>value pairs.
func pairs(name, sep string) (map[string]string, error) {
	v := os.Getenv(name)
	if v == "" {
		return nil, nil
	}
	m := map[string]string{}
	for p := range strings.SplitSeq(v, ",") {
		k, val, ok := strings.Cut(p, sep)
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not name%svalue", name, p, sep)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return m, nil
}

func (x *xdsFlags) tls() (*tls.Config, error) {
	if !*x.useTLS && *x.ca == "" && *x.cert == "" && *x.serverName == "" {
		return nil, nil // plaintext
	}
	cfg := &tls.Config{ServerName: *x.serverName, MinVersion: tls.VersionTLS12}
	if *x.ca != "" {
		pem, err := os.ReadFile(*x.ca)
		if err != nil {
			return nil, fmt.Errorf("--xds-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-ca %s: no PEM certificate in it", *x.ca)
		}
	}
	if (*x.cert == "") != (*x.key == "") {
		return nil, errors.New("give both --xds-cert and --xds-key, or neither")
	}
	if *x.cert != "" {
		pair, err := tls.LoadX509KeyPair(*x.cert, *x.key)
		if err != nil {
			return nil, fmt.Errorf("--xds-cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
