package rules

import "strings"

// PathOptions say how request paths are normalised before rules match them
// (the rule file's top-level paths section). Whatever the options, a path is
// matched as an upstream server reads it: empty segments are merged
// ("//otp" is "/otp"), dot segments resolved ("/a/./b/../otp" is "/otp",
// never above the root), and percent-escapes of unreserved characters
// (RFC 3986 §2.3: letters, digits, "-", ".", "_", "~") decoded ("/%6Ftp" is
// "/otp"), while other escapes are kept with their hex in upper case
// ("%2f" is "%2F": an encoded slash stays data, not a separator).
type PathOptions struct {
	// KeepTrailingSlash makes "/otp/" a path of its own. By default a
	// trailing slash is dropped, since most servers route "/otp/" and "/otp"
	// to the same handler.
	KeepTrailingSlash bool
	// CaseInsensitive folds ASCII letters to lower case, for upstreams that
	// route "/OTP" like "/otp". Rule patterns are then matched in lower case
	// too.
	CaseInsensitive bool
}

// Normalize returns path in the normal form described at [PathOptions]. A
// path already in normal form is returned as is, without allocating. A path
// that does not start with "/" (such as "*" or an absolute URL) is returned
// unchanged: no rule pattern matches it.
func (o PathOptions) Normalize(path string) string {
	if path == "" || path[0] != '/' || o.isNormal(path) {
		return path
	}
	decoded := decodeUnreserved(path)
	var b strings.Builder
	b.Grow(len(decoded))
	segs := make([]string, 0, 8)
	for seg := range strings.SplitSeq(decoded[1:], "/") {
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
	last := decoded[strings.LastIndexByte(decoded, '/')+1:]
	trailing := last == "" || last == "." || last == ".."
	if b.Len() == 0 || (o.KeepTrailingSlash && trailing) {
		b.WriteByte('/')
	}
	out := b.String()
	if o.CaseInsensitive {
		out = strings.ToLower(out)
	}
	return out
}

// isNormal reports whether Normalize would return path unchanged: the
// common case, checked without allocating.
func (o PathOptions) isNormal(path string) bool {
	prev := byte(0)
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '%':
			return false
		case c == '/' && prev == '/':
			return false
		case c == '.' && prev == '/' && dotSegment(path[i:]):
			return false
		case o.CaseInsensitive && 'A' <= c && c <= 'Z':
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
// writes the hex of the others in upper case. A malformed escape is kept as
// it is.
func decodeUnreserved(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' || i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			b = append(b, s[i])
			continue
		}
		c := unhex(s[i+1])<<4 | unhex(s[i+2])
		if unreserved(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', upperHex(s[i+1]), upperHex(s[i+2]))
		}
		i += 2
	}
	return string(b)
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
