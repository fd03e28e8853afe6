package rules

import (
	"fmt"
	"strings"
)

// Pattern is a path pattern: "/login", "/users/{id}", "/export/*".
type Pattern struct {
	raw  string
	segs []string // "{}" for a parameter, "*" for a wildcard, else literal
	tail bool     // the last segment is "*": it matches the rest
}

// ParsePattern parses a path pattern. It must start with "/"; a "{name}"
// segment matches exactly one non-empty segment; "*" matches one segment,
// or, as the last segment, any number of them (including none).
func ParsePattern(s string) (*Pattern, error) {
	if !strings.HasPrefix(s, "/") {
		return nil, fmt.Errorf("path pattern %q must start with /", s)
	}
	p := &Pattern{raw: s}
	parts := strings.Split(s[1:], "/")
	for i, seg := range parts {
		switch {
		case seg == "*":
			if i == len(parts)-1 {
				p.tail = true
			}
		case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}"):
			name := seg[1 : len(seg)-1]
			if name == "" || strings.ContainsAny(name, "{}*") {
				return nil, fmt.Errorf("path pattern %q: bad parameter segment %q", s, seg)
			}
			seg = "{}"
		case strings.ContainsAny(seg, "{}*"):
			return nil, fmt.Errorf("path pattern %q: segment %q mixes text with { } or *", s, seg)
		}
		p.segs = append(p.segs, seg)
	}
	if p.tail {
		p.segs = p.segs[:len(p.segs)-1]
	}
	return p, nil
}

// String returns the pattern as written.
func (p *Pattern) String() string { return p.raw }

// Match reports whether path matches the pattern. It does not allocate.
func (p *Pattern) Match(path string) bool {
	if path == "" || path[0] != '/' {
		return false
	}
	rest, done := path[1:], false
	for _, seg := range p.segs {
		if done {
			return false // the pattern wants more segments
		}
		var cur string
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			cur, rest = rest[:j], rest[j+1:]
		} else {
			cur, rest, done = rest, "", true
		}
		if seg == "{}" || seg == "*" {
			if cur == "" {
				return false
			}
		} else if cur != seg {
			return false
		}
	}
	return p.tail || done
}

// Matches reports whether the request is selected by m, and returns the
// route key: the method and the matched pattern ("POST /login"), or the
// method and path when m has no path patterns.
func (m *Match) Matches(method, host, path string) (pattern string, ok bool) {
	if method == MethodMessage && !contains(m.Methods, method) {
		return "", false // a stream's message: only for rules that name it
	}
	if len(m.Methods) > 0 && !contains(m.Methods, method) {
		return "", false
	}
	if len(m.Hosts) > 0 && !containsFold(m.Hosts, stripPort(host)) {
		return "", false
	}
	for _, p := range m.NotPaths {
		if p.Match(path) {
			return "", false
		}
	}
	if len(m.Paths) == 0 {
		return path, true
	}
	for _, p := range m.Paths {
		if p.Match(path) {
			return p.raw, true
		}
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

func stripPort(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.HasSuffix(host, "]") {
		return host[:i]
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}
