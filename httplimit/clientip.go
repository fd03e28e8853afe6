package httplimit

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluice-rl/sluice/rules"
)

// Trust says whose word about a request's client is taken: the proxies
// whose forwarding fields are believed, and how the client is read behind
// them. Every plane finds the client with it, from plain arguments.
type Trust struct {
	// Proxies are the trusted proxies; a peer outside them is the client,
	// whatever its forwarding fields say.
	Proxies []netip.Prefix
	// Depth, when above 0, takes the Depth-th X-Forwarded-For address
	// from the right, as Traefik's ipStrategy.depth does (see
	// ClientIPAtDepth); 0 walks the chain to the first untrusted hop.
	Depth int
	// XFFOnly reads X-Forwarded-For alone, for proxies known to set it and
	// not Forwarded (a Forwarded field the client sent is then ignored).
	XFFOnly bool
}

// Trust is the trust every face of o puts in a request's forwarding
// fields under the rule set cfg: o.TrustedProxies, or the rule file's
// trustedProxies when o names none, and the rule file's clientIPDepth.
func (o *Options) Trust(cfg *rules.Config) Trust {
	proxies := o.TrustedProxies
	if proxies == nil {
		proxies = cfg.TrustedProxies
	}
	return Trust{Proxies: proxies, Depth: cfg.ClientIPDepth}
}

// Trust is l's Options.Trust under cfg.
func (l *Limiter) Trust(cfg *rules.Config) Trust { return l.o.Trust(cfg) }

// Trusts reports whether peer is a trusted proxy.
func (t Trust) Trusts(peer netip.Addr) bool { return peer.IsValid() && isTrusted(peer, t.Proxies) }

// Client returns the client's address, given the socket's peer and the
// request's header (only Forwarded and X-Forwarded-For are read): the peer,
// unless it is a trusted proxy; then the forwarding chain is walked from
// the right (the hop nearest to us) and the first address that is not a
// trusted proxy is the client. RFC 7239 Forwarded is preferred to
// X-Forwarded-For when both are present. Any malformed or obfuscated hop
// makes the chain unusable, and the peer is returned.
func (t Trust) Client(peer netip.Addr, header http.Header) netip.Addr {
	if !t.Trusts(peer) {
		return peer
	}
	var hops []netip.Addr
	var ok bool
	if t.Depth > 0 {
		hops, ok = xForwardedFor(header.Values("X-Forwarded-For"))
		if !ok || len(hops) == 0 {
			return peer
		}
		return hops[max(len(hops)-t.Depth, 0)]
	}
	if fwd := header.Values("Forwarded"); !t.XFFOnly && len(fwd) > 0 {
		hops, ok = forwardedFor(fwd)
	} else if xff := header.Values("X-Forwarded-For"); len(xff) > 0 {
		hops, ok = xForwardedFor(xff)
	} else {
		return peer
	}
	if !ok || len(hops) == 0 {
		return peer
	}
	for i := len(hops) - 1; i >= 0; i-- {
		if !isTrusted(hops[i], t.Proxies) {
			return hops[i]
		}
	}
	return hops[0] // every hop is a trusted proxy: the first one is the origin
}

// ClientIP returns the address of the client that sent r, trusting the
// forwarding fields of the proxies in trusted (see Trust.Client).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	return Trust{Proxies: trusted}.Client(parseHost(r.RemoteAddr), r.Header)
}

// ClientIPFromXFF is ClientIP reading X-Forwarded-For alone, for a trusted
// proxy known to set that header and not Forwarded: a Forwarded header sent
// by the client and passed through is then ignored.
func ClientIPFromXFF(r *http.Request, trusted []netip.Prefix) netip.Addr {
	return Trust{Proxies: trusted, XFFOnly: true}.Client(parseHost(r.RemoteAddr), r.Header)
}

// ClientIPAtDepth returns the client address as Traefik's ipStrategy.depth
// does: the depth-th address of X-Forwarded-For counted from the right,
// when the peer is a trusted proxy (otherwise the peer: an untrusted client
// could write any chain). It assumes every request crosses the same
// depth-1 proxies after the client, each appending what it saw; with fewer
// hops, the leftmost is taken. A depth of 0 is ClientIP.
func ClientIPAtDepth(r *http.Request, trusted []netip.Prefix, depth int) netip.Addr {
	return Trust{Proxies: trusted, Depth: depth}.Client(parseHost(r.RemoteAddr), r.Header)
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseAddr parses one address as a proxy writes it in a header: "ip",
// "ip:port", "[ipv6]" or "[ipv6]:port"; the zero Addr if it does not parse.
func ParseAddr(s string) netip.Addr { return parseHost(s) }

// parseHost parses "ip", "ip:port", "[ipv6]" or "[ipv6]:port".
func parseHost(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap()
	}
	return netip.Addr{}
}

func xForwardedFor(lines []string) ([]netip.Addr, bool) {
	var hops []netip.Addr
	for _, line := range lines {
		for part := range strings.SplitSeq(line, ",") {
			a := parseHost(part)
			if !a.IsValid() {
				return nil, false
			}
			hops = append(hops, a)
		}
	}
	return hops, true
}

// forwardedFor reads the for= parameters of RFC 7239 Forwarded elements.
func forwardedFor(lines []string) ([]netip.Addr, bool) {
	var hops []netip.Addr
	for _, line := range lines {
		for elem := range strings.SplitSeq(line, ",") {
			found := false
			for pair := range strings.SplitSeq(elem, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if !ok || !strings.EqualFold(k, "for") {
					continue
				}
				a := parseHost(strings.Trim(v, `"`))
				if !a.IsValid() {
					return nil, false // "unknown", an obfuscated node, or garbage
				}
				hops = append(hops, a)
				found = true
			}
			if !found {
				return nil, false
			}
		}
	}
	return hops, true
}
