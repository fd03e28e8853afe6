package gateway

import (
	"bytes"
	"iter"
	"slices"
	"strings"

	"github.com/sluice-rl/sluice/internal/view"
	"github.com/valyala/fasthttp"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (with the
// obsolete Keep-Alive and Proxy-Connection), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// hopFields is what the removal of hop-by-hop fields saw of them.
type hopFields struct {
	trailers    bool   // TE held "trailers"
	upgrade     string // the Upgrade field
	connUpgrade bool   // Connection named "upgrade"
}

// scrubRequestHop removes the hop-by-hop fields of a request (RFC 9110
// §7.6.1: the fixed list and those its Connection fields name) and the
// fields also names, matching names in any case: the gateway keeps names
// as they arrive, and "proxy-authorization" is Proxy-Authorization. It
// makes one pass over the fields (two when Connection names a field of its
// own), with s, kept with the request's state, as its working memory.
//
// It and scrubResponseHop differ only in the header's type, and are two
// on purpose: called on the concrete type, the header's iterator and the
// loop's body stay on the stack. Through an interface both escaped (three
// allocations a request), and so they do through one shared function
// given the iterator and DelBytes as values (eight a forwarded request,
// BenchmarkFastGatewayForward).
func scrubRequestHop(h *fasthttp.RequestHeader, s *hopScratch, also ...string) hopFields {
	s.reset(also)
	for k, v := range h.All() {
		s.see(k, v)
	}
	for k := range s.namedIn(h.All()) {
		s.doom(k)
	}
	for _, d := range s.doomed {
		h.DelBytes(s.arena[d[0]:d[1]])
	}
	return s.done()
}

// scrubResponseHop is scrubRequestHop for a response.
func scrubResponseHop(h *fasthttp.ResponseHeader, s *hopScratch) hopFields {
	s.reset(nil)
	for k, v := range h.All() {
		s.see(k, v)
	}
	for k := range s.namedIn(h.All()) {
		s.doom(k)
	}
	for _, d := range s.doomed {
		h.DelBytes(s.arena[d[0]:d[1]])
	}
	return s.done()
}

// hopScratch is the hop-by-hop removal's working memory: what it saw, and
// the names it removes once it has looked at every field (the header
// changes as they go, so the names are copied into arena).
type hopScratch struct {
	also   []string
	f      hopFields
	named  []string // fields Connection names beyond the fixed list
	doomed [][2]int // spans of arena
	arena  []byte
}

func (s *hopScratch) reset(also []string) {
	s.also, s.f = also, hopFields{}
	s.named, s.doomed, s.arena = s.named[:0], s.doomed[:0], s.arena[:0]
}

// done is what was seen, once the fields are removed.
func (s *hopScratch) done() hopFields {
	s.also = nil
	return s.f
}

// namedIn yields the names of fields that the Connection fields seen
// named beyond the fixed list (none when they named none).
func (s *hopScratch) namedIn(fields iter.Seq2[[]byte, []byte]) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		if len(s.named) == 0 {
			return
		}
		for k := range fields {
			if slices.ContainsFunc(s.named, func(n string) bool { return foldEq(k, n) }) && !yield(k) {
				return
			}
		}
	}
}

// see looks at one field.
func (s *hopScratch) see(k, v []byte) {
	switch {
	case isHopName(k):
		switch {
		case foldEq(k, "Connection"):
			for t := range strings.SplitSeq(view.String(v), ",") {
				t = strings.TrimSpace(t)
				switch {
				case strings.EqualFold(t, "upgrade"):
					s.f.connUpgrade = true
				case t == "" || strings.EqualFold(t, "close") || isHopName([]byte(t)) ||
					strings.EqualFold(t, "Content-Length") || strings.EqualFold(t, "Host"):
					// The request's framing and target are not the
					// Connection field's to remove.
				default:
					s.named = append(s.named, strings.Clone(t))
				}
			}
		case foldEq(k, "Te"):
			s.f.trailers = s.f.trailers || hasToken(view.String(v), "trailers")
		case foldEq(k, "Upgrade") && s.f.upgrade == "":
			s.f.upgrade = strings.TrimSpace(string(v))
		}
		s.doom(k)
	case slices.ContainsFunc(s.also, func(a string) bool { return foldEq(k, a) }):
		s.doom(k)
	}
}

// doom marks field k for removal, once.
func (s *hopScratch) doom(k []byte) {
	for _, d := range s.doomed {
		if bytes.Equal(s.arena[d[0]:d[1]], k) {
			return
		}
	}
	s.doomed = append(s.doomed, [2]int{len(s.arena), len(s.arena) + len(k)})
	s.arena = append(s.arena, k...)
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
