package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// SourceKind says where a key source reads its value.
type SourceKind uint8

// The kinds of key source.
const (
	FromIP     SourceKind = iota + 1 // the client address
	FromRoute                        // method and matched path pattern
	FromMethod                       // the request method
	FromPath                         // the request path
	FromHost                         // the Host, without port
	FromHeader                       // a request header
	FromQuery                        // a query parameter
	FromCookie                       // a cookie
	FromBody                         // a field of a JSON or form body
)

// Source is one key source.
type Source struct {
	Name   string // as rules refer to it: "user", "ip", "header:X-Org"
	Kind   SourceKind
	Param  string // header (canonical), query, cookie or body field name
	Scheme string // for a header: the auth scheme to strip, such as Bearer
	Hash   bool   // replace the value with a digest: it is a secret
}

var builtinSources = map[string]SourceKind{
	"ip":     FromIP,
	"route":  FromRoute,
	"method": FromMethod,
	"path":   FromPath,
	"host":   FromHost,
}

// source resolves a key source name used by a rule.
func (c *Config) source(name string) (*Source, error) {
	if k, ok := builtinSources[name]; ok {
		return &Source{Name: name, Kind: k}, nil
	}
	if kind, param, ok := strings.Cut(name, ":"); ok {
		if param == "" {
			return nil, fmt.Errorf("key source %q names no %s", name, kind)
		}
		switch kind {
		case "header":
			return &Source{Name: name, Kind: FromHeader, Param: http.CanonicalHeaderKey(param)}, nil
		case "query":
			return &Source{Name: name, Kind: FromQuery, Param: param}, nil
		case "cookie":
			return &Source{Name: name, Kind: FromCookie, Param: param}, nil
		}
		return nil, fmt.Errorf("unknown key source %q (inline sources are header:NAME, query:NAME and cookie:NAME)", name)
	}
	if s, ok := c.Sources[name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("unknown key source %q (built in: ip, route, method, path, host; inline: header:NAME, query:NAME, cookie:NAME; or a name from keys)", name)
}

// MaxBodyBytes is the most of a request body read to find a body key.
const MaxBodyBytes = 64 << 10

// Request is what rules see of a request.
type Request struct {
	Method   string
	Host     string
	Path     string
	RawQuery string
	// ClientIP is the client's address, already resolved through trusted
	// proxies by the caller.
	ClientIP netip.Addr
	Header   http.Header
	// Body holds up to MaxBodyBytes of the body, when a rule needs it.
	Body []byte
	// Attributes supply key source values directly, by source name in
	// lower case (AttributeName); they take precedence over extraction.
	Attributes map[string]string
}

// AttributeName is the name under which Request.Attributes holds a source's
// value: its name in lower case, so that "User" and "user" are one
// attribute, as "X-User-Id" and "x-user-id" are one header.
func AttributeName(source string) string { return strings.ToLower(source) }

// attribute is the value req.Attributes gives the source, if any.
func (s *Source) attribute(req *Request) (string, bool) {
	if req.Attributes == nil {
		return "", false
	}
	v, ok := req.Attributes[AttributeName(s.Name)]
	return v, ok && v != ""
}

// AppendKey appends the rule's key for req to dst. route is the matched
// route (see Match.Matches). It reports false when a key source has no value
// in the request. One source gives its value as is; several are joined with
// length prefixes ("3:u42|11:203.0.113.7"), so no value can forge another's.
func (r *Rule) AppendKey(dst []byte, req *Request, route string, ipv6Prefix int) ([]byte, bool) {
	for i, s := range r.Key {
		start := len(dst)
		var ok bool
		dst, ok = s.appendValue(dst, req, route, ipv6Prefix)
		if !ok {
			return dst[:start], false
		}
		if len(r.Key) > 1 { // insert "|len:" before the value, in place
			var pre [24]byte
			p := pre[:0]
			if i > 0 {
				p = append(p, '|')
			}
			p = strconv.AppendInt(p, int64(len(dst)-start), 10)
			p = append(p, ':')
			n := len(dst) - start
			dst = append(dst, p...)
			copy(dst[start+len(p):], dst[start:start+n])
			copy(dst[start:], p)
		}
	}
	return dst, true
}

func (s *Source) appendValue(dst []byte, req *Request, route string, ipv6Prefix int) ([]byte, bool) {
	if v, ok := s.attribute(req); ok {
		return s.finish(dst, v), true
	}
	var v string
	switch s.Kind {
	case FromIP:
		if !req.ClientIP.IsValid() {
			return dst, false
		}
		a := req.ClientIP.Unmap()
		if a.Is6() && ipv6Prefix < 128 {
			p, _ := a.Prefix(ipv6Prefix)
			return p.AppendTo(dst), true
		}
		return a.AppendTo(dst), true
	case FromRoute:
		v = route
		if v == "" {
			return dst, false
		}
		dst = append(dst, req.Method...)
		dst = append(dst, ' ')
	case FromMethod:
		v = req.Method
	case FromPath:
		v = req.Path
	case FromHost:
		v = strings.ToLower(stripPort(req.Host))
	case FromHeader:
		if vs := req.Header[s.Param]; len(vs) > 0 {
			v = strings.TrimSpace(vs[0])
		}
		if s.Scheme != "" {
			scheme, token, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, s.Scheme) {
				return dst, false
			}
			v = strings.TrimSpace(token)
		}
	case FromQuery:
		v = queryValue(req.RawQuery, s.Param)
	case FromCookie:
		v = cookieValue(req.Header, s.Param)
	case FromBody:
		v = bodyValue(req.Body, req.Header.Get("Content-Type"), s.Param)
	}
	if v == "" {
		return dst, false
	}
	return s.finish(dst, v), true
}

// finish appends v, or its digest when the source holds a secret.
func (s *Source) finish(dst []byte, v string) []byte {
	if !s.Hash {
		return append(dst, v...)
	}
	sum := sha256.Sum256([]byte(v))
	return hex.AppendEncode(dst, sum[:16])
}

func queryValue(raw, name string) string {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k == name || (strings.ContainsAny(k, "%+") && unescape(k) == name) {
			return unescape(v)
		}
	}
	return ""
}

func unescape(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	u, err := url.QueryUnescape(s)
	if err != nil {
		return ""
	}
	return u
}

func cookieValue(h http.Header, name string) string {
	for _, line := range h["Cookie"] {
		for line != "" {
			var part string
			part, line, _ = strings.Cut(line, ";")
			k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
			if k == name {
				return strings.Trim(v, `"`)
			}
		}
	}
	return ""
}

// bodyValue finds a top-level field of a JSON object or a form body.
func bodyValue(body []byte, contentType, name string) string {
	if len(body) == 0 {
		return ""
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/x-www-form-urlencoded":
		return queryValue(string(body), name)
	case mt == "application/json" || strings.HasSuffix(mt, "+json") || (mt == "" && bytes.HasPrefix(bytes.TrimSpace(body), []byte("{"))):
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil {
			return ""
		}
		raw, ok := fields[name]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String()
		}
	}
	return ""
}

// Value returns the source's value in req as the request gave it: before
// hashing, and for ip the address itself (not its IPv6 prefix). Matches and
// exemptions compare it with the values a rule file lists.
func (s *Source) Value(req *Request, route string) (string, bool) {
	if v, ok := s.attribute(req); ok {
		return v, true
	}
	if s.Kind == FromIP {
		if !req.ClientIP.IsValid() {
			return "", false
		}
		return req.ClientIP.Unmap().String(), true
	}
	plain := *s
	plain.Hash = false
	b, ok := plain.appendValue(nil, req, route, 128)
	return string(b), ok
}

// ValueSet is the values of one key source that a rule's match selects or
// its exempt list skips: exact values, and for ip, addresses and CIDR
// prefixes.
type ValueSet struct {
	Source   *Source
	Values   map[string]bool
	Prefixes []netip.Prefix
}

// Contains reports whether req's value of the source is in the set; a
// request without the value is in no set.
func (v *ValueSet) Contains(req *Request, route string) bool {
	if v.Source.Kind == FromIP {
		// The address itself, not its text: an exempt network costs no
		// allocation per request.
		a := req.ClientIP
		if s, ok := v.Source.attribute(req); ok {
			a, _ = netip.ParseAddr(s)
		}
		if !a.IsValid() {
			return false
		}
		a = a.Unmap()
		for _, p := range v.Prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	s, ok := v.Source.Value(req, route)
	return ok && v.Values[s]
}

// Selects reports whether the rule applies to req beyond its method, host
// and path: each of its match values holds (plans: X-Plan is gold), and no
// exemption does (an allow-listed network or key value). An exempt request
// is not counted by the rule at all.
func (r *Rule) Selects(req *Request, route string) bool {
	for i := range r.Match.Values {
		if !r.Match.Values[i].Contains(req, route) {
			return false
		}
	}
	for i := range r.Exempt {
		if r.Exempt[i].Contains(req, route) {
			return false
		}
	}
	return true
}

// BodyNumber returns the whole number above 0 in the field name of a JSON
// or form body (a reserve rule's estimateBody), if there is one.
func BodyNumber(req *Request, name string) (int64, bool) {
	v := bodyValue(req.Body, req.Header.Get("Content-Type"), name)
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n > 0
}
