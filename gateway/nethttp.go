package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
)

// Handler is the net/http data plane of `sluice gateway`: the rate-limiting
// middleware in front of a reverse proxy to upstream (httputil.ReverseProxy;
// upgrades through the same upgrader as the fasthttp plane).
//
// X-Forwarded-For is rebuilt for the upstream: the client address is
// appended to the chain received from a trusted proxy, and any chain sent by
// an untrusted peer is dropped. An unreachable upstream gives 502 with a
// problem+json body, one slower than o.Timeout 504. A panic while serving a
// request is answered with 500, logged and counted, never a dropped
// connection.
func Handler(upstream *url.URL, e *engine.Engine, o Options) http.Handler {
	o.defaults()
	log := o.Logger
	t := UpstreamTransport(TransportOptions{MaxConnsPerHost: o.MaxConns, IdleTimeout: o.UpstreamIdle})
	t.ResponseHeaderTimeout = o.Timeout
	if t.TLSHandshakeTimeout <= 0 || t.TLSHandshakeTimeout > o.Timeout {
		t.TLSHandshakeTimeout = o.Timeout // an upstream's handshake within the timeout, as on the fasthttp plane
	}
	if o.UpstreamTLS != nil {
		t.TLSClientConfig = o.UpstreamTLS.Clone()
	}
	warnings := &rareWarnings{log: log}
	rewrite := func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream)
		pr.Out.Host = pr.In.Host
		trust, peer := o.HTTP.Trust(e.Config()), httplimit.ParseAddr(pr.In.RemoteAddr)
		if trust.Trusts(peer) {
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
		} else {
			for _, k := range clientAddressHeaders {
				pr.Out.Header.Del(k)
			}
		}
		pr.SetXForwarded()
		pr.Out.Header.Del("X-Real-Ip")
		if client := trust.Client(peer, pr.In.Header); client.IsValid() {
			pr.Out.Header.Set("X-Real-Ip", client.String())
		}
	}
	proxy := &httputil.ReverseProxy{
		Transport:  t,
		Rewrite:    rewrite,
		BufferPool: copyBuffers{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				httplimit.Abandon(w) // the client went away: answer nothing, not an empty 200
				return
			}
			upstreamFailed(w, err, upstream.Host, warnings)
		},
	}
	up := newUpgrader(upstream, o)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 && isUpgrade(r.Header.Get("Connection"), r.Header.Get("Upgrade")) {
			up.upgrade(w, r, rewrite, warnings)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	return o.Metrics.Recover(httplimit.Middleware(e, o.HTTP)(next), log)
}

// copyBuffers are the reverse proxy's buffers for copying a response body
// to the client. Without a pool httputil.ReverseProxy makes a new 32 KiB
// buffer for every request, two thirds of what the plane allocates a
// forwarded request, and the garbage collector's work grows with it.
type copyBuffers struct{}

const copyBufferSize = 32 << 10 // httputil.ReverseProxy's own

// copyBufferPool holds array pointers: a pointer goes into an interface
// without an allocation, where a slice would be boxed on every Put.
var copyBufferPool = sync.Pool{New: func() any { return new([copyBufferSize]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[copyBufferSize]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if cap(b) == copyBufferSize {
		copyBufferPool.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
	}
}

// netHTTPUpgrade is the net/http plane's side of an upgrade.
type netHTTPUpgrade struct {
	w        http.ResponseWriter
	r, out   *http.Request // as received, and as the upstream gets it
	host     string        // the upstream's, for the log
	warnings *rareWarnings
}

// upgrade passes r, an upgrade request, on (upgrader.serve): the request
// the upstream gets is rewritten as the reverse proxy rewrites any other,
// its hop-by-hop fields but the upgrade's own dropped.
func (u *upgrader) upgrade(w http.ResponseWriter, r *http.Request, rewrite func(*httputil.ProxyRequest), warnings *rareWarnings) {
	asked := r.Header.Get("Upgrade")
	out := r.Clone(r.Context())
	out.Header = r.Header.Clone()
	dropHopHeader(out.Header)
	out.Header.Del("Forwarded") // as httputil.ReverseProxy does with Rewrite
	out.Header.Del("X-Forwarded-For")
	out.Header.Del("X-Forwarded-Host")
	out.Header.Del("X-Forwarded-Proto")
	out.RequestURI = ""
	rewrite(&httputil.ProxyRequest{In: r, Out: out})
	out.Header.Set("Connection", "Upgrade")
	out.Header.Set("Upgrade", asked)
	u.serve(r.Context(), &netHTTPUpgrade{w: w, r: r, out: out, host: u.upstream.Host, warnings: warnings}, asked)
}

func (x *netHTTPUpgrade) problem(status int, title, detail string, retry bool) {
	if retry {
		x.w.Header().Set("Retry-After", "1")
	}
	httplimit.WriteProblem(x.w, &httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
}

func (x *netHTTPUpgrade) writeRequest(w *bufio.Writer) error { return x.out.Write(w) }

func (x *netHTTPUpgrade) failed(err error) {
	if x.r.Context().Err() != nil {
		httplimit.Abandon(x.w)
		return
	}
	upstreamFailed(x.w, err, x.host, x.warnings)
}

func (x *netHTTPUpgrade) relay(resp *http.Response, body io.ReadCloser) {
	defer body.Close()
	for k, vs := range resp.Header {
		x.w.Header()[k] = vs
	}
	x.w.WriteHeader(resp.StatusCode)
	io.Copy(x.w, body)
}

func (x *netHTTPUpgrade) hijack(then func(net.Conn, io.Reader, http.Header)) bool {
	conn, brw, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		return false
	}
	then(conn, brw.Reader, x.w.Header())
	return true
}

// clientAddressHeaders are the fields, besides X-Forwarded-For and
// Forwarded, from which upstreams commonly take a client's address or the
// original request: dropped when the peer is not a trusted proxy, so that a
// client cannot name itself to the upstream. X-Real-IP is set to the
// address the gateway counted.
var clientAddressHeaders = []string{"True-Client-Ip", "X-Client-Ip", "X-Cluster-Client-Ip", "Cf-Connecting-Ip",
	"Fastly-Client-Ip", "X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Prefix", "X-Original-Forwarded-For",
	"X-Original-Uri", "X-Original-Url", "X-Rewrite-Url"}

// TransportOptions size the gateway's connections to its upstream.
type TransportOptions struct {
	// MaxIdlePerHost is how many idle keep-alive connections are kept per
	// upstream host (default 256). Go's default keeps 2: under 64
	// concurrent clients most requests would then open a new TCP
	// connection, and leave one in TIME_WAIT.
	MaxIdlePerHost int
	// IdleTimeout closes an idle connection after this long (default 90 s).
	IdleTimeout time.Duration
	// DialTimeout bounds connecting to the upstream (default 5 s).
	DialTimeout time.Duration
	// MaxConnsPerHost bounds the connections to one upstream host (default:
	// no bound).
	MaxConnsPerHost int
}

// UpstreamTransport returns the gateway's transport to its upstream:
// keep-alive connections sized for the load, HTTP/1.1 or HTTP/2 as the
// upstream offers.
func UpstreamTransport(o TransportOptions) *http.Transport {
	if o.MaxIdlePerHost <= 0 {
		o.MaxIdlePerHost = 256
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(o.MaxIdlePerHost, t.MaxIdleConns)
	t.MaxIdleConnsPerHost = o.MaxIdlePerHost
	t.IdleConnTimeout = o.IdleTimeout
	// The upstream gets the Accept-Encoding the client sent, not one the
	// transport adds (and then undoes by decompressing): what the fasthttp
	// plane sends too.
	t.DisableCompression = true
	t.MaxConnsPerHost = o.MaxConnsPerHost
	t.DialContext = (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// UpstreamCheck returns a readiness check for the gateway's upstream (see
// Options.Upstream): it opens a TCP connection to it, within a second.
func UpstreamCheck(upstream *url.URL) func(context.Context) (string, error) {
	addr := upstream.Host
	if upstream.Port() == "" {
		port := "80"
		if upstream.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(upstream.Hostname(), port)
	}
	return func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return addr, err
		}
		c.Close()
		return addr, nil
	}
}

// upstreamFailed answers a failed upstream exchange (upstreamFailure) on
// net/http.
func upstreamFailed(w http.ResponseWriter, err error, host string, warnings *rareWarnings) {
	p, logged := upstreamFailure(err)
	if logged {
		warnings.warn("sluice: upstream unreachable", "upstream", host, "error", err)
	}
	httplimit.WriteProblem(w, p)
}
