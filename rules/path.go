package rules

import "strings"

// PathOptions say how request paths are normalised before rules match them
// (the rule file's top-level paths section). Whatever the options, a path is
// matched as an upstream server reads it: empty segments are merged
// ("//otp" is "/otp"), dot segments resolved ("/a/./b/../otp" is "/otp",
// never above the root), and percent-escapes of unreserved characters
// (RFC 3986 §2.3: letters, digits, "-", ".", "_", "~") decoded ("/%6Ftp" is
// "/otp"), while other escapes are kept with their hex in upper case. A
// malformed escape ("%" without two hex digits) is refused.
//
// Where servers disagree, the default refuses or reads the path the way
// that gives a limit the most requests, and the gateway forwards the path
// as it was matched, so that what was limited is what is served:
//
//   - an encoded slash or backslash (%2F, %5C, also escaped twice, %252F)
//     or a raw backslash: nginx and WSGI servers decode %2F to a separator,
//     Go's and Node's keep it as data, IIS reads "\" as "/". Refused (the
//     request gets 400) by default; with DecodeSeparators each is read as a
//     "/" and forwarded so;
//   - path parameters (";jsessionid=1" at the end of a segment): Java
//     servlet containers and Spring drop them before routing, and resolve
//     "..;" as "..". Dropped by default (matched and forwarded without
//     them); Params says otherwise.
type PathOptions struct {
	// KeepTrailingSlash makes "/otp/" a path of its own. By default a
	// trailing slash is dropped, since most servers route "/otp/" and "/otp"
	// to the same handler.
	KeepTrailingSlash bool
	// CaseSensitive matches paths in their own case. By default rules match
	// paths in any ASCII case ("/OTP" is "/otp"), since Express, ASP.NET
	// and IIS route them alike: counting /OTP against a rule for /otp costs
	// a case-sensitive upstream nothing (it answers 404), while missing it
	// lets an upstream that routes in any case serve it uncounted. The case
	// is folded for matching and keys only: the gateway forwards the path
	// in the case it was sent (MatchForm).
	CaseSensitive bool
	// DecodeSeparators reads encoded slashes and backslashes, and raw
	// backslashes, as "/" instead of refusing the path.
	DecodeSeparators bool
	// Params is what becomes of path parameters.
	Params ParamMode
}

// ParamMode is what becomes of a segment's ";parameters".
type ParamMode uint8

// The param modes.
const (
	// ParamsStrip drops them (the default): "/otp;a=b" is "/otp", and
	// "/x/..;/otp" is "/otp", as a servlet container reads them.
	ParamsStrip ParamMode = iota
	// ParamsKeep reads ";" as an ordinary character, as Go, Node and Python
	// servers do: "/otp;a=b" is a path of its own.
	ParamsKeep
	// ParamsReject refuses a path with a ";".
	ParamsReject
)

// Normalize returns path in the normal form described at [PathOptions],
// or false when the options refuse it (an encoded slash, a ";" with
// ParamsReject). A path already in normal form is returned as is, without
// allocating. A path that does not start with "/" (such as "*" or an
// absolute URL) is returned unchanged: no rule pattern matches it.
func (o PathOptions) Normalize(path string) (string, bool) {
	if path == "" || path[0] != '/' || o.isNormal(path) {
		return path, true
	}
	decoded, ok := decodeUnreserved(path)
	if !ok {
		return "", false
	}
	if hasSeparator(decoded) {
		if !o.DecodeSeparators {
			return "", false
		}
		decoded = decodeSeparators(decoded)
	}
	if o.Params == ParamsReject && strings.IndexByte(decoded, ';') >= 0 {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(decoded))
	segs := make([]string, 0, 8)
	last := ""
	for seg := range strings.SplitSeq(decoded[1:], "/") {
		if o.Params == ParamsStrip {
			seg, _, _ = strings.Cut(seg, ";")
		}
		last = seg
		switch seg {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	for _, seg := range segs {
		b.WriteByte('/')
		b.WriteString(seg)
	}
	trailing := last == "" || last == "." || last == ".."
	if b.Len() == 0 || (o.KeepTrailingSlash && trailing) {
		b.WriteByte('/')
	}
	return b.String(), true
}

// Why says why Normalize refuses path, for the 400's detail.
func (o PathOptions) Why(path string) string {
	decoded, ok := decodeUnreserved(path)
	switch {
	case !ok:
		return "its path holds a malformed percent-escape (a % without two hex digits), which servers read in different ways"
	case hasSeparator(decoded):
		return "its path holds an encoded slash or backslash (%2F, %5C) or a backslash, which servers read in different ways"
	}
	return "its path holds a path parameter (;), which this service does not take"
}

// MatchForm is a normalised path as rules match it: in lower case unless
// paths are case-sensitive. It allocates only for a path with upper-case
// letters.
func (o PathOptions) MatchForm(normal string) string {
	if o.CaseSensitive {
		return normal
	}
	return strings.ToLower(normal)
}

// hasSeparator reports whether a path (its unreserved escapes decoded, the
// others in upper case) holds an encoded slash or backslash, once or twice
// escaped, or a raw backslash.
func hasSeparator(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' || escapedSeparator(p[i:]) > 0 {
			return true
		}
	}
	return false
}

// escapedSeparator returns the length of the escaped slash or backslash
// that p starts with ("%2F" or "%5C": 3; escaped twice, "%252F" or
// "%255C": 5; hex in any case), or 0.
func escapedSeparator(p string) int {
	switch {
	case len(p) >= 3 && p[0] == '%' && sep(p[1:3]):
		return 3
	case len(p) >= 5 && p[0] == '%' && p[1:3] == "25" && sep(p[3:5]):
		return 5
	}
	return 0
}

func sep(hex string) bool { return strings.EqualFold(hex, "2F") || strings.EqualFold(hex, "5C") }

// decodeSeparators turns every separator hasSeparator finds into "/".
func decodeSeparators(p string) string {
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); {
		if p[i] == '\\' {
			b.WriteByte('/')
			i++
		} else if n := escapedSeparator(p[i:]); n > 0 {
			b.WriteByte('/')
			i += n
		} else {
			b.WriteByte(p[i])
			i++
		}
	}
	return b.String()
}

// isNormal reports whether Normalize would return path unchanged: the
// common case, checked without allocating.
func (o PathOptions) isNormal(path string) bool {
	prev := byte(0)
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '%' || c == '\\':
			return false
		case c == ';' && o.Params != ParamsKeep:
			return false
		case c == '/' && prev == '/':
			return false
		case c == '.' && prev == '/' && dotSegment(path[i:]):
			return false
		}
		prev = c
	}
	return o.KeepTrailingSlash || len(path) == 1 || path[len(path)-1] != '/'
}

// dotSegment reports whether s (which starts with ".") is a "." or ".."
// segment.
func dotSegment(s string) bool {
	end := strings.IndexByte(s, '/')
	if end < 0 {
		end = len(s)
	}
	return end == 1 || (end == 2 && s[1] == '.')
}

// decodeUnreserved decodes the percent-escapes of unreserved characters and
// writes the hex of the others in upper case. It reports false for a
// malformed escape ("%" not followed by two hex digits): servers refuse or
// read it in different ways, and kept as it is, decoding next to it could
// make an escape of it ("%7%30" would be "%70", then "p").
func decodeUnreserved(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "", false
		}
		c := unhex(s[i+1])<<4 | unhex(s[i+2])
		if unreserved(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', upperHex(s[i+1]), upperHex(s[i+2]))
		}
		i += 2
	}
	return string(b), true
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}
