package gateway

import (
	"bytes"
	"iter"
	"slices"
	"strings"

	"github.com/sluice-rl/sluice/internal/view"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (with the
// obsolete Keep-Alive and Proxy-Connection), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// fastHeader is what scrubHop needs of fasthttp's request and response
// headers.
type fastHeader interface {
	All() iter.Seq2[[]byte, []byte]
	DelBytes([]byte)
}

// hopFields is what scrubHop saw of the fields it removed.
type hopFields struct {
	trailers    bool   // TE held "trailers"
	upgrade     string // the Upgrade field
	connUpgrade bool   // Connection named "upgrade"
}

// scrubHop removes the hop-by-hop fields of h (RFC 9110 §7.6.1: the fixed
// list and those its Connection fields name) and the fields also names,
// matching names in any case: the gateway keeps names as they arrive, and
// "proxy-authorization" is Proxy-Authorization. It makes one pass over the
// fields (two when Connection names a field of its own), and allocates only
// what it removes.
func scrubHop(h fastHeader, also ...string) (f hopFields) {
	var named []string // fields Connection names beyond the fixed list, copied: h changes below
	var doomed [][]byte
	doom := func(k []byte) {
		if !slices.ContainsFunc(doomed, func(d []byte) bool { return bytes.Equal(d, k) }) {
			doomed = append(doomed, bytes.Clone(k))
		}
	}
	for k, v := range h.All() {
		switch {
		case isHopName(k):
			switch {
			case foldEq(k, "Connection"):
				for t := range strings.SplitSeq(view.String(v), ",") {
					t = strings.TrimSpace(t)
					switch {
					case strings.EqualFold(t, "upgrade"):
						f.connUpgrade = true
					case t == "" || strings.EqualFold(t, "close") || isHopName([]byte(t)) ||
						strings.EqualFold(t, "Content-Length") || strings.EqualFold(t, "Host"):
						// The request's framing and target are not the
						// Connection field's to remove.
					default:
						named = append(named, strings.Clone(t))
					}
				}
			case foldEq(k, "Te"):
				f.trailers = f.trailers || hasToken(view.String(v), "trailers")
			case foldEq(k, "Upgrade") && f.upgrade == "":
				f.upgrade = strings.TrimSpace(string(v))
			}
			doom(k)
		case slices.ContainsFunc(also, func(a string) bool { return foldEq(k, a) }):
			doom(k)
		}
	}
	if len(named) > 0 {
		for k := range h.All() {
			if slices.ContainsFunc(named, func(n string) bool { return foldEq(k, n) }) {
				doom(k)
			}
		}
	}
	for _, k := range doomed {
		h.DelBytes(k)
	}
	return f
}

// isHopName reports whether k names a hop-by-hop field of the fixed list,
// in any case.
func isHopName(k []byte) bool {
	switch len(k) {
	case 2:
		return foldEq(k, "Te")
	case 7:
		return foldEq(k, "Trailer") || foldEq(k, "Upgrade")
	case 10:
		return foldEq(k, "Connection") || foldEq(k, "Keep-Alive")
	case 16:
		return foldEq(k, "Proxy-Connection")
	case 17:
		return foldEq(k, "Transfer-Encoding")
	case 18:
		return foldEq(k, "Proxy-Authenticate")
	case 19:
		return foldEq(k, "Proxy-Authorization")
	}
	return false
}

func foldEq(k []byte, name string) bool {
	return len(k) == len(name) && strings.EqualFold(view.String(k), name)
}
