package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rl/sluice/rules"
)

// renackEvery paces NACKs: a server may answer each at once.
const renackEvery = time.Second

// maxFaultText bounds a NACK's error_detail and its log line: thousands of
// bad resources would otherwise make a message past the management
// server's receive limit, and a NACK it cannot read breaks the stream.
const maxFaultText = 4 << 10

// faultText is err's text, cut to maxFaultText with the count of what was
// left out.
func faultText(err error) string {
	s := err.Error()
	if len(s) <= maxFaultText {
		return s
	}
	cut := strings.LastIndexByte(s[:maxFaultText], '\n')
	if cut <= 0 {
		cut = maxFaultText
	}
	return fmt.Sprintf("%s\n... and %d more faults (%d bytes)", s[:cut], strings.Count(s[cut:], "\n"), len(s)-cut)
}

// TypeURL is the type of the resources the client subscribes to
// (go-control-plane's resource.RateLimitConfigType, written out: its
// package would bring every xDS resource type into the binary).
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Backoff is how long the client waits before connecting again; see the
// package documentation. The zero value is envoyproxy/ratelimit's default:
// 10 s, at most 60 s, random factor 0.5, jitter on.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	NoJitter     bool
}

// DefaultBackoff is the zero Backoff's meaning.
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: time.Minute, RandomFactor: 0.5}

// wait is the attempt-th wait (from 0).
func (b Backoff) wait(attempt int) time.Duration {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = max(DefaultBackoff.Max, b.Initial)
	}
	if b.RandomFactor <= 0 && !b.NoJitter {
		b.RandomFactor = DefaultBackoff.RandomFactor
	}
	d := b.Initial
	for range min(attempt, 62) {
		if d >= b.Max {
			break
		}
		d *= 2
	}
	d = min(d, b.Max)
	if !b.NoJitter {
		f := min(b.RandomFactor, 1)
		d = time.Duration(float64(d) * (1 - f + 2*f*rand.Float64()))
	}
	return d
}

// Client subscribes to RateLimitConfig resources and applies each
// configuration the management server sends. Set its fields, then Run it.
type Client struct {
	// Server is the management server's address (host:port, or any target
	// grpc.NewClient takes).
	Server string
	// NodeID names this service to the management server, which keys its
	// snapshots by node (envoyproxy/ratelimit's default: "default").
	NodeID string
	// NodeMetadata is sent with the node.
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on the stream (for an
	// authenticating proxy in front of the management server).
	Headers map[string]string
	// TLS, if set, secures the connection; nil is plaintext.
	TLS *tls.Config
	// MaxMessageBytes bounds a response's size (0: gRPC's 4 MiB).
	MaxMessageBytes int
	Backoff         Backoff
	// MergeDomains lets several resources declare one domain, merged, as
	// rules.LoadOptions.MergeDomains does for files.
	MergeDomains bool
	// Apply serves a configuration that loaded; it must take it whole, at
	// once. version is the response's version_info.
	Apply  func(cfg *rules.Config, version string)
	Logger *slog.Logger

	version   atomic.Pointer[string]
	applied   atomic.Uint64
	refused   atomic.Uint64
	connected atomic.Bool
	lastErr   sync.Mutex
	lastFault string
}

// Version is the version_info of the configuration applied last, and
// whether one has been.
func (c *Client) Version() (string, bool) {
	if v := c.version.Load(); v != nil {
		return *v, true
	}
	return "", false
}

// Updates returns how many responses were applied and how many refused
// (NACKed).
func (c *Client) Updates() (applied, refused uint64) { return c.applied.Load(), c.refused.Load() }

// Connected reports whether a stream to the management server is open.
func (c *Client) Connected() bool { return c.connected.Load() }

// LastFault is why the last refused response was refused ("" if none was).
func (c *Client) LastFault() string {
	c.lastErr.Lock()
	defer c.lastErr.Unlock()
	return c.lastFault
}

// Run subscribes until ctx is done, connecting again whenever the stream
// ends. It returns an error only if Server cannot be a gRPC target.
func (c *Client) Run(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if c.TLS != nil {
		creds = credentials.NewTLS(c.TLS)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.MaxMessageBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.MaxMessageBytes)))
	}
	cc, err := grpc.NewClient(c.Server, opts...)
	if err != nil {
		return fmt.Errorf("xds: %s: %w", c.Server, err)
	}
	defer cc.Close()
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for attempt := 0; ; attempt++ {
		got, err := c.subscribe(ctx, cc, log)
		c.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			attempt = 0
		}
		wait := c.Backoff.wait(attempt)
		log.Warn("sluice: the xDS stream ended; the rules last applied keep serving", "server", c.Server, "error", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (c *Client) node() *corev3.Node {
	id := c.NodeID
	if id == "" {
		id = "default"
	}
	n := &corev3.Node{Id: id}
	if len(c.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(c.NodeMetadata))
		for k, v := range c.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		n.Metadata = &structpb.Struct{Fields: fields}
	}
	return n
}

// subscribe runs one stream until it ends, and reports whether it
// delivered a response.
func (c *Client) subscribe(ctx context.Context, cc *grpc.ClientConn, log *slog.Logger) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.Headers))
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := c.node()
	version, _ := c.Version()
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: version}); err != nil {
		return false, err
	}
	var refusedVersion *string // the version last refused, while no other came
	var lastNACK time.Time
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		if !got {
			log.Info("sluice: connected to the xDS management server", "server", c.Server, "node", node.Id)
		}
		got = true
		c.connected.Store(true)
		next := &discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if fault := c.take(resp); fault != nil {
			text := faultText(fault)
			next.VersionInfo, _ = c.Version()
			next.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: text}
			// A server that answers every request whose version is not its
			// own (go-control-plane's snapshot cache does) sends a refused
			// version back at once on each NACK, or alternates bad ones:
			// NACKs go at most once every renackEvery, never in a tight
			// loop.
			if wait := time.Until(lastNACK.Add(renackEvery)); wait > 0 {
				select {
				case <-ctx.Done():
					return got, ctx.Err()
				case <-time.After(wait):
				}
			}
			lastNACK = time.Now()
			if refusedVersion == nil || *refusedVersion != resp.GetVersionInfo() {
				// Counted and logged once per version.
				v := resp.GetVersionInfo()
				refusedVersion = &v
				c.refused.Add(1)
				c.lastErr.Lock()
				c.lastFault = text
				c.lastErr.Unlock()
				log.Error("sluice: xDS configuration refused (NACK); the rules last applied keep serving",
					"version", v, "error", text)
			}
		} else {
			refusedVersion = nil
			c.applied.Add(1)
			v := resp.GetVersionInfo()
			c.version.Store(&v)
			next.VersionInfo = v
		}
		if err := st.Send(next); err != nil {
			return got, err
		}
	}
}

// take loads a response and, if it loads, applies it.
func (c *Client) take(resp *discovery.DiscoveryResponse) error {
	if resp.GetTypeUrl() != TypeURL {
		return fmt.Errorf("a response of type %q: want %s", resp.GetTypeUrl(), TypeURL)
	}
	cfgs := make([]*rules.Config, 0, len(resp.GetResources()))
	var faults []error
	names := map[string]bool{}
	for i, a := range resp.GetResources() {
		var rc rlsconf.RateLimitConfig
		if err := a.UnmarshalTo(&rc); err != nil {
			faults = append(faults, fmt.Errorf("resource %d (%s): %v", i, a.GetTypeUrl(), err))
			continue
		}
		if names[rc.GetName()] {
			faults = append(faults, fmt.Errorf("resource %d: a second RateLimitConfig named %q", i, rc.GetName()))
			continue
		}
		names[rc.GetName()] = true
		cfg, err := load(&rc)
		if err != nil {
			faults = append(faults, err)
			continue
		}
		cfgs = append(cfgs, cfg)
	}
	if err := errors.Join(faults...); err != nil {
		return err
	}
	cfg, err := rules.LoadOptions{MergeDomains: c.MergeDomains}.Merge(cfgs...)
	if err != nil {
		return err
	}
	cfg.Version = resp.GetVersionInfo()
	c.Apply(cfg, cfg.Version)
	return nil
}
