package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
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
	// Normalize rewrites the value before it is counted, so that the
	// spellings an application treats as one ("+880 1799-999999" and
	// "8801799999999") are one key.
	Normalize Normalization
}

// Normalization is a set of rewrites of a key value, applied in the order
// of the constants.
type Normalization uint8

// The rewrites.
const (
	// NormTrim drops white space at both ends.
	NormTrim Normalization = 1 << iota
	// NormLower folds letters to lower case (Unicode).
	NormLower
	// NormDigits keeps only the digits, each written as its ASCII digit,
	// without leading zeros: the number Python's int() reads. For phone
	// numbers, where an application strips "+", spaces, dashes and
	// parentheses, reads the digits of any script as int() and \d do
	// ("８８０" and "٨٨٠" are "880"), and takes the international prefix
	// "00" for "+" ("00880..." and "+880..." are "880...").
	NormDigits
)

// normalizations are the names the rule file uses.
var normalizations = map[string]Normalization{"trim": NormTrim, "lower": NormLower, "digits": NormDigits}

// apply rewrites v; a value with nothing left is missing.
func (n Normalization) apply(v string) string {
	if n&NormTrim != 0 {
		v = strings.TrimSpace(v)
	}
	if n&NormLower != 0 {
		v = strings.ToLower(v)
	}
	if n&NormDigits != 0 {
		v = strings.Map(asciiDigit, v)
		if number := strings.TrimLeft(v, "0"); number != "" || v == "" {
			v = number
		} else {
			v = "0" // zeros only: the number 0
		}
	}
	return v
}

// asciiDigit is the ASCII digit of a decimal digit of any script (Unicode
// category Nd), or -1. Unicode writes each script's digits as a run of ten
// code points from zero to nine, runs side by side (the mathematical digits
// are five runs in a row), so a digit's value is its distance from the
// start of its run, modulo ten.
func asciiDigit(r rune) rune {
	switch {
	case '0' <= r && r <= '9':
		return r
	case r < 0x80 || !unicode.IsDigit(r):
		return -1
	}
	start := r
	for start > 0 && unicode.IsDigit(start-1) && r-start < 100 {
		start--
	}
	return '0' + (r-start)%10
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
	Method string
	Host   string
	// Path is the request target's path as sent, escaped as
	// url.URL.EscapedPath escapes it (bytes outside ASCII as %XX).
	Path string
	// Fragment says the request target held a "#" (a "#" in Path says so
	// too, for the callers that pass a path as they got it): a client never sends
	// a fragment (RFC 9112 section 3.2), and servers read what follows it
	// in different ways (as part of the path, of the query, or dropped),
	// so such a request is refused as bad.
	Fragment bool
	RawQuery string
	// ClientIP is the client's address, already resolved through trusted
	// proxies by the caller.
	ClientIP netip.Addr
	Header   http.Header
	// Body holds up to MaxBodyBytes of the body, when a rule needs it;
	// BodyTruncated says the body was longer.
	Body          []byte
	BodyTruncated bool
	// BodyUnseen says the caller never sees the request's body (forward-
	// auth: the proxy sends none; the JSON API): a body source is then
	// missing, whatever the query says, since the body may say otherwise.
	BodyUnseen bool
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

// KeyState says whether a request gives a key source one value.
type KeyState uint8

// The key states.
const (
	// KeyFound: the source has one value (repeated alike, if at all).
	KeyFound KeyState = iota
	// KeyMissing: the source has no value in the request.
	KeyMissing
	// KeyAmbiguous: the source has several different values — a header
	// line or a query, form, JSON or cookie field given twice — of which
	// servers read different ones (the first, the last, any case of a
	// JSON name): counting one of them would let the upstream read another.
	KeyAmbiguous
	// KeyBodyTooLarge: the source is a body field and the body is larger
	// than MaxBodyBytes: what lies beyond (another copy of the field) is
	// not read, so the value the upstream reads is not known.
	KeyBodyTooLarge
	// KeyUnreadable: the source is a body field and the body is in a form
	// that some servers read and sluice does not (compressed, not UTF-8,
	// JSON beyond what Go parses, multipart that does not parse), so the
	// value the upstream reads is not known. See bodyValue.
	KeyUnreadable
)

// AppendKey appends the rule's key for req to dst. route is the matched
// route (see Match.Matches). It reports how the request gave the key: when
// not KeyFound, dst is returned as it came. One source gives its value as
// is; several are joined with length prefixes ("3:u42|11:203.0.113.7"), so
// no value can forge another's.
func (r *Rule) AppendKey(dst []byte, req *Request, route string, ipv6Prefix int) ([]byte, KeyState) {
	return appendKey(dst, r.Key, req, route, ipv6Prefix)
}

// AppendFallbackKey appends the key the rule counts a request under when
// its own key is missing (onMissingKey: fallback): its fallback sources'
// (the client address by default).
func (r *Rule) AppendFallbackKey(dst []byte, req *Request, route string, ipv6Prefix int) ([]byte, KeyState) {
	if len(r.FallbackKey) == 0 {
		return appendKey(dst, clientAddress, req, route, ipv6Prefix)
	}
	return appendKey(dst, r.FallbackKey, req, route, ipv6Prefix)
}

// clientAddress is the default fallback key.
var clientAddress = []*Source{{Name: "ip", Kind: FromIP}}

func appendKey(dst []byte, sources []*Source, req *Request, route string, ipv6Prefix int) ([]byte, KeyState) {
	orig := len(dst)
	for i, s := range sources {
		start := len(dst)
		var state KeyState
		dst, state = s.appendValue(dst, req, route, ipv6Prefix)
		if state != KeyFound {
			return dst[:orig], state
		}
		if len(sources) > 1 { // insert "|len:" before the value, in place
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
	return dst, KeyFound
}

func (s *Source) appendValue(dst []byte, req *Request, route string, ipv6Prefix int) ([]byte, KeyState) {
	if v, ok := s.attribute(req); ok {
		if s.Normalize != 0 {
			if v = s.Normalize.apply(v); v == "" {
				return dst, KeyMissing
			}
		}
		return s.finish(dst, v), KeyFound
	}
	var v string
	state := KeyFound
	switch s.Kind {
	case FromIP:
		if !req.ClientIP.IsValid() {
			return dst, KeyMissing
		}
		a := req.ClientIP.Unmap().WithZone("") // a zone names our interface, not the client
		if a.Is6() && ipv6Prefix < 128 {
			p, _ := a.Prefix(ipv6Prefix)
			return p.AppendTo(dst), KeyFound
		}
		return a.AppendTo(dst), KeyFound
	case FromRoute:
		v = route
		if v == "" {
			return dst, KeyMissing
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
		v, state = headerValue(req.Header[s.Param])
		if state == KeyFound && s.Scheme != "" {
			scheme, token, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, s.Scheme) {
				return dst, KeyMissing
			}
			v = strings.TrimSpace(token)
		}
	case FromQuery:
		v, state = formValue(req.RawQuery, s.Param)
	case FromCookie:
		v, state = cookieValue(req.Header, s.Param)
	case FromBody:
		if req.BodyUnseen {
			return dst, KeyMissing
		}
		// Flask's request.values, Spring's getParameter and PHP's
		// $_REQUEST read the query and the body as one: the query's field
		// of the same name is one more reading (bodyValue).
		var r reading
		r.add(bodyValue(req.Body, req.BodyTruncated, req.Header, s.Param))
		if req.RawQuery != "" {
			r.add(formValue(req.RawQuery, s.Param))
		}
		v, state = r.result()
	}
	if state != KeyFound {
		return dst, state
	}
	if s.Normalize != 0 {
		v = s.Normalize.apply(v)
	}
	if v == "" {
		return dst, KeyMissing
	}
	return s.finish(dst, v), KeyFound
}

// finish appends v, or its digest when the source holds a secret.
func (s *Source) finish(dst []byte, v string) []byte {
	if !s.Hash {
		return append(dst, v...)
	}
	sum := sha256.Sum256([]byte(v))
	return hex.AppendEncode(dst, sum[:16])
}

// headerValue is a header's value: its one line, or lines that agree.
func headerValue(lines []string) (string, KeyState) {
	if len(lines) == 0 {
		return "", KeyMissing
	}
	v := strings.TrimSpace(lines[0])
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) != v {
			return "", KeyAmbiguous
		}
	}
	return v, KeyFound
}

// cookieValue is a cookie's value: its one value, or values that agree,
// over every Cookie line (Go's Request.Cookie reads the first, Python's
// SimpleCookie the last).
func cookieValue(h http.Header, name string) (string, KeyState) {
	v, state := "", KeyMissing
	for _, line := range h["Cookie"] {
		for line != "" {
			var part string
			part, line, _ = strings.Cut(line, ";")
			k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
			if k != name {
				continue
			}
			val = strings.Trim(val, `"`)
			switch {
			case state == KeyMissing:
				v, state = val, KeyFound
			case val != v:
				return "", KeyAmbiguous
			}
		}
	}
	return v, state
}

// Value returns the source's value in req as the request gave it: before
// hashing, and for ip the address itself (not its IPv6 prefix). Matches and
// exemptions compare it with the values a rule file lists.
func (s *Source) Value(req *Request, route string) (string, bool) {
	if v, ok := s.attribute(req); ok {
		if s.Normalize != 0 {
			v = s.Normalize.apply(v)
		}
		return v, v != ""
	}
	if s.Kind == FromIP {
		if !req.ClientIP.IsValid() {
			return "", false
		}
		return req.ClientIP.Unmap().WithZone("").String(), true
	}
	plain := *s
	plain.Hash = false
	b, state := plain.appendValue(nil, req, route, 128)
	return string(b), state == KeyFound
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
// request without the value is in no set. With several different values
// or a value it cannot read one way (KeyAmbiguous, KeyBodyTooLarge,
// KeyUnreadable), ambiguous says what to report.
func (v *ValueSet) Contains(req *Request, route string, ambiguous bool) bool {
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
		a = a.Unmap().WithZone("")
		for _, p := range v.Prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	plain := *v.Source
	plain.Hash = false
	b, state := plain.appendValue(nil, req, route, 128)
	switch state {
	case KeyFound:
		return v.Values[string(b)]
	case KeyMissing:
		return false
	}
	return ambiguous // a value is there, but not one value sluice can name
}

// Selects reports whether the rule applies to req beyond its method, host
// and path: each of its match values holds (plans: X-Plan is gold), and no
// exemption does (an allow-listed network or key value). An exempt request
// is not counted by the rule at all. A source given several different
// values is read the strict way: it matches (the request is counted), and
// exempts nothing.
func (r *Rule) Selects(req *Request, route string) bool {
	for i := range r.Match.Values {
		if !r.Match.Values[i].Contains(req, route, true) {
			return false
		}
	}
	for i := range r.Exempt {
		if r.Exempt[i].Contains(req, route, false) {
			return false
		}
	}
	return true
}

// BodyNumber returns the whole number above 0 in the field name of a JSON
// or form body (a reserve rule's estimateBody), if there is one.
func BodyNumber(req *Request, name string) (int64, bool) {
	v, state := bodyValue(req.Body, req.BodyTruncated, req.Header, name)
	n, err := strconv.ParseInt(v, 10, 64)
	return n, state == KeyFound && err == nil && n > 0
}
