package rules

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	goccyyaml "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// decoder walks the YAML node tree (JSON parses as YAML too), so that every
// value keeps its line and column, and collects every fault instead of
// stopping at the first.
type decoder struct {
	file  string
	errs  Errors
	paths PathOptions // from the paths section, applied to rule patterns
}

// pattern parses a rule's path pattern in the normal form of the file's
// paths section, so that it matches the paths it is written for.
func (d *decoder) pattern(s string) (*Pattern, error) {
	n, ok := d.paths.Normalize(s)
	if !ok {
		return nil, fmt.Errorf("path pattern %q holds what the paths section refuses in a path (an encoded slash or backslash, or a ;)", s)
	}
	return ParsePattern(d.paths.MatchForm(n))
}

func (d *decoder) fail(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: d.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

// fields walks a mapping, calling the handler of each known key and
// reporting unknown and repeated ones.
func (d *decoder) fields(n *yaml.Node, field string, known map[string]func(v *yaml.Node, field string)) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, field, "want a mapping, got %s", describe(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		sub := k.Value
		if field != "" {
			sub = field + "." + k.Value
		}
		h, ok := known[k.Value]
		switch {
		case !ok:
			names := make([]string, 0, len(known))
			for name := range known {
				names = append(names, name)
			}
			slices.Sort(names)
			d.fail(k, sub, "unknown field %q (known: %s)", k.Value, strings.Join(names, ", "))
		case seen[k.Value]:
			d.fail(k, sub, "field given twice")
		default:
			seen[k.Value] = true
			h(v, sub)
		}
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

func (d *decoder) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		d.fail(n, field, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(n *yaml.Node, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, field, "want an integer, got %s", describe(n))
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		if num, per, ok := strings.Cut(n.Value, "/"); ok && strings.HasSuffix(field, "rate") {
			// "rate: 100/m": the limit written as sluice.ParseLimit takes it.
			if _, e := strconv.ParseInt(strings.TrimSpace(num), 10, 64); e == nil {
				d.fail(n, field, "want an integer, got %q: write rate: %s and per: %s", n.Value, strings.TrimSpace(num), periodHint(strings.TrimSpace(per)))
				return 0, false
			}
		}
		d.fail(n, field, "want an integer, got %q", n.Value)
		return 0, false
	}
	return v, true
}

// positive decodes an integer that must be above 0. It returns what was
// written even when it fails, as integer does.
func (d *decoder) positive(n *yaml.Node, field string) (int64, bool) {
	x, ok := d.integer(n, field)
	if ok && x <= 0 {
		d.fail(n, field, "must be > 0, got %d", x)
		return x, false
	}
	return x, ok
}

// choice decodes one of words and returns its index; want lists them for
// the error ("open or closed", with what each means where that helps).
func (d *decoder) choice(n *yaml.Node, field, want string, words ...string) (int, bool) {
	s, ok := d.str(n, field)
	if !ok {
		return 0, false
	}
	if i := slices.Index(words, s); i >= 0 {
		return i, true
	}
	d.fail(n, field, "want %s, got %q", want, s)
	return 0, false
}

// periodHint writes a period as per: takes it ("m" is "1m").
func periodHint(p string) string {
	if p != "" && (p[0] < '0' || p[0] > '9') {
		return "1" + p
	}
	return p
}

func (d *decoder) boolean(n *yaml.Node, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "true":
			return true, true
		case "false":
			return false, true
		}
	}
	d.fail(n, field, "want true or false, got %s", describe(n))
	return false, false
}

// Bounds of a rule's onSlowStore: wait.
const (
	DefaultSlowStoreWait = 2 * time.Second
	MaxSlowStoreWait     = 10 * time.Second
)

// slowStore reads onSlowStore: share (0), wait (DefaultSlowStoreWait) or
// {wait: DURATION}.
func (d *decoder) slowStore(n *yaml.Node, field string) time.Duration {
	if n.Kind == yaml.MappingNode {
		wait := DefaultSlowStoreWait
		d.fields(n, field, map[string]func(*yaml.Node, string){
			"wait": func(v *yaml.Node, f string) {
				if p, ok := d.period(v, f); ok {
					if p > MaxSlowStoreWait {
						d.fail(v, f, "at most %v, got %v", MaxSlowStoreWait, p)
					}
					wait = p
				}
			},
		})
		return wait
	}
	s, ok := d.str(n, field)
	switch {
	case !ok:
	case s == "share":
	case s == "wait":
		return DefaultSlowStoreWait
	default:
		d.fail(n, field, "want share (the default: answered from the gateway's share at the store's deadline), wait (up to %v for a slow store) or {wait: DURATION}, got %q", DefaultSlowStoreWait, s)
	}
	return 0
}

func (d *decoder) period(n *yaml.Node, field string) (time.Duration, bool) {
	s, ok := d.str(n, field)
	if !ok {
		return 0, false
	}
	p, err := sluice.ParsePeriod(s)
	if err != nil {
		d.fail(n, field, "%v", err)
		return 0, false
	}
	return p, true
}

// strings accepts one string or a list of them.
func (d *decoder) strings(n *yaml.Node, field string) ([]string, []*yaml.Node) {
	if n.Kind == yaml.SequenceNode {
		var out []string
		var nodes []*yaml.Node
		for i, item := range n.Content {
			if s, ok := d.str(item, fmt.Sprintf("%s[%d]", field, i)); ok {
				out = append(out, s)
				nodes = append(nodes, item)
			}
		}
		if len(n.Content) == 0 {
			d.fail(n, field, "empty list")
		}
		return out, nodes
	}
	if s, ok := d.str(n, field); ok {
		return []string{s}, []*yaml.Node{n}
	}
	return nil, nil
}

func (d *decoder) config(data []byte) *Config {
	c := &Config{File: d.file, Sources: defaultSources(), IPv6Prefix: DefaultIPv6Prefix}
	if enc := unmarkedUTF16(data); enc != "" {
		d.errs = append(d.errs, &Error{File: d.file, Msg: "the file is " + enc + " without a byte order mark; save it as UTF-8 (or UTF-16 with a BOM)"})
		return nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.errs = append(d.errs, syntaxError(d.file, data, err))
		return nil
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		d.fail(nil, "", "the file is empty; want a mapping with a rules list")
		return nil
	}
	root := doc.Content[0]
	if isEnvoyFile(root) {
		d.envoyFile(c, root)
		return c
	}
	var rulesNode, priorityNode *yaml.Node
	allowNone := false
	d.fields(root, "", map[string]func(*yaml.Node, string){
		"keys":           func(v *yaml.Node, f string) { d.keys(c, v, f) },
		"trustedProxies": func(v *yaml.Node, f string) { c.TrustedProxies = d.prefixes(v, f) },
		"ipv6Prefix": func(v *yaml.Node, f string) {
			if n, ok := d.integer(v, f); ok {
				if n < 1 || n > 128 {
					d.fail(v, f, "must be between 1 and 128, got %d", n)
				}
				c.IPv6Prefix = int(n)
			}
		},
		"clientIP": func(v *yaml.Node, f string) {
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"depth": func(v *yaml.Node, f string) {
					if n, ok := d.integer(v, f); ok {
						if n < 1 || n > 64 {
							d.fail(v, f, "must be between 1 and 64, got %d", n)
						}
						c.ClientIPDepth = int(n)
					}
				},
			})
		},
		"paths": func(v *yaml.Node, f string) {
			d.pathOptions(&c.Paths, v, f)
			d.paths = c.Paths
		},
		"rules":        func(v *yaml.Node, f string) { rulesNode = v },
		"priority":     func(v *yaml.Node, f string) { priorityNode = v },
		"allowNoRules": func(v *yaml.Node, f string) { allowNone, _ = d.boolean(v, f) },
	})
	if root.Kind != yaml.MappingNode {
		return nil
	}
	if rulesNode == nil {
		d.fail(root, "rules", "missing: a rule file needs a rules list")
		return c
	}
	// The priority section and the rules come last, so that every named
	// key source is known.
	if priorityNode != nil {
		c.Priority = d.priority(c, priorityNode, "priority")
	}
	d.rules(c, rulesNode, allowNone)
	return c
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

func (d *decoder) keys(c *Config, n *yaml.Node, field string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, field, "want a mapping of key source names, got %s", describe(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		if _, builtin := builtinSources[k.Value]; builtin || strings.Contains(k.Value, ":") || k.Value == "" {
			d.fail(k, f, "%q cannot name a key source: it is built in or contains ':'", k.Value)
			continue
		}
		s := &Source{Name: k.Value}
		kinds := 0
		set := func(kind SourceKind) func(*yaml.Node, string) {
			return func(v *yaml.Node, f string) {
				if p, ok := d.str(v, f); ok {
					if p == "" {
						d.fail(v, f, "empty name")
					}
					s.Kind, s.Param = kind, p
					if kind == FromHeader {
						s.Param = http.CanonicalHeaderKey(p)
					}
					kinds++
				}
			}
		}
		d.fields(v, f, map[string]func(*yaml.Node, string){
			"header": set(FromHeader),
			"query":  set(FromQuery),
			"cookie": set(FromCookie),
			"body":   set(FromBody),
			"scheme": func(v *yaml.Node, f string) { s.Scheme, _ = d.str(v, f) },
			"hash":   func(v *yaml.Node, f string) { s.Hash, _ = d.boolean(v, f) },
			"normalize": func(v *yaml.Node, f string) {
				names, nodes := d.strings(v, f)
				for i, name := range names {
					n, ok := normalizations[name]
					if !ok {
						d.fail(nodes[i], f, "unknown normalization %q (want trim, lower or digits)", name)
					}
					s.Normalize |= n
				}
			},
		})
		switch {
		case kinds == 0 && v.Kind == yaml.MappingNode:
			d.fail(v, f, "name where the key comes from: one of header, query, cookie or body")
		case kinds > 1:
			d.fail(v, f, "give only one of header, query, cookie or body")
		case s.Scheme != "" && s.Kind != FromHeader:
			d.fail(v, f+".scheme", "scheme applies only to a header")
		}
		c.Sources[k.Value] = s
	}
}

// headerName decodes an HTTP header name.
func (d *decoder) headerName(v *yaml.Node, f string) string {
	s, ok := d.str(v, f)
	if !ok {
		return ""
	}
	if s == "" || strings.ContainsFunc(s, func(c rune) bool { return c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) }) {
		d.fail(v, f, "%q is not an HTTP header name", s)
		return ""
	}
	return http.CanonicalHeaderKey(s)
}

func (d *decoder) failedUnder(field string) bool {
	for _, e := range d.errs {
		if strings.HasPrefix(e.Field, field) {
			return true
		}
	}
	return false
}

func validID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// knownMethods are the methods a rule may match: RFC 9110's, PATCH (RFC
// 5789), WebDAV's (RFC 4918), and MethodMessage.
var knownMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
	"PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", MethodMessage}

// MethodMessage is the method of a message a gRPC server receives on a
// stream (package grpclimit): a rule counts such messages only if its
// match names it (`match: {method: MESSAGE, path: /pkg.Service/Upload}`);
// a rule that names no method counts calls and streams, not messages.
const MethodMessage = "MESSAGE"

// syntaxError locates a YAML syntax error. go.yaml.in/yaml/v3 reports a
// parser error at the line before the one at fault, with no column (it
// prints a 0-based line for those); github.com/goccy/go-yaml's parser points
// at the offending token, so when it refuses the file too, its line, column
// and message are used.
func syntaxError(file string, data []byte, err error) *Error {
	e := &Error{File: file, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	if _, perr := goccyparser.ParseBytes(data, 0); perr != nil {
		var ye goccyyaml.Error
		if errors.As(perr, &ye) && ye.GetToken() != nil {
			p := ye.GetToken().Position
			e.Line, e.Column, e.Msg = p.Line, p.Column, ye.GetMessage()
		}
	}
	return e
}

// unmarkedUTF16 names the encoding of a file that is UTF-16 without a byte
// order mark (YAML needs the mark to tell), judged by the NUL bytes ASCII
// characters have in it; "" otherwise.
func unmarkedUTF16(data []byte) string {
	if len(data) < 4 || bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) {
		return ""
	}
	switch {
	case data[0] != 0 && data[1] == 0 && data[2] != 0 && data[3] == 0:
		return "UTF-16LE"
	case data[0] == 0 && data[1] != 0 && data[2] == 0 && data[3] != 0:
		return "UTF-16BE"
	}
	return ""
}

// each calls fn for every item of the list n, with the item's field name;
// anything but a non-empty list is a fault, and want says what was wanted.
func (d *decoder) each(n *yaml.Node, field, want string, fn func(item *yaml.Node, field string)) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		d.fail(n, field, "want %s", want)
		return
	}
	for i, item := range n.Content {
		fn(item, fmt.Sprintf("%s[%d]", field, i))
	}
}

// valueSets reads {source: [values...]}: the values of key sources, by the
// source's name (built in, inline or from keys); an ip source takes
// addresses and CIDR prefixes.
func (d *decoder) valueSets(c *Config, n *yaml.Node, field string) []ValueSet {
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		d.fail(n, field, "want {source: [values]}, such as {plan: [gold]} or {ip: [10.0.0.0/8]}")
		return nil
	}
	var out []ValueSet
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		src, err := c.source(k.Value)
		if err != nil {
			d.fail(k, f, "%v", err)
			continue
		}
		vals, nodes := d.strings(v, f)
		set := ValueSet{Source: src, Values: map[string]bool{}}
		for j, s := range vals {
			if src.Kind == FromIP {
				p, err := parsePrefix(s)
				if err != nil {
					d.fail(nodes[j], fmt.Sprintf("%s[%d]", f, j), "%q is not an IP address or CIDR prefix", s)
					continue
				}
				set.Prefixes = append(set.Prefixes, p)
				continue
			}
			set.Values[s] = true
		}
		out = append(out, set)
	}
	return out
}

// pathOptions decodes the paths section: the normal form paths are
// matched (and forwarded) in.
func (d *decoder) pathOptions(p *PathOptions, v *yaml.Node, f string) {
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"trailingSlash": func(v *yaml.Node, f string) {
			if i, ok := d.choice(v, f, "ignore (the default: /otp/ is /otp) or keep", "ignore", "keep"); ok {
				p.KeepTrailingSlash = i == 1
			}
		},
		"caseInsensitive": func(v *yaml.Node, f string) {
			if b, ok := d.boolean(v, f); ok {
				p.CaseSensitive = !b
			}
		},
		"encodedSlashes": func(v *yaml.Node, f string) {
			if i, ok := d.choice(v, f, "reject (the default: a path with %2F, %5C or a backslash gets 400) or decode (read each as /)", "reject", "decode"); ok {
				p.DecodeSeparators = i == 1
			}
		},
		"params": func(v *yaml.Node, f string) {
			if i, ok := d.choice(v, f, "strip (the default: /otp;a=b is /otp), keep (; is an ordinary character) or reject (400)", "strip", "keep", "reject"); ok {
				p.Params = []ParamMode{ParamsStrip, ParamsKeep, ParamsReject}[i]
			}
		},
	})
}

// prefixes decodes a list of IP addresses and CIDR prefixes.
func (d *decoder) prefixes(v *yaml.Node, f string) []netip.Prefix {
	var out []netip.Prefix
	items, nodes := d.strings(v, f)
	for i, s := range items {
		p, err := parsePrefix(s)
		if err != nil {
			d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%q is not an IP address or CIDR prefix", s)
			continue
		}
		out = append(out, p)
	}
	return out
}

// rules decodes the rules list: each rule, with the rules its key limits
// and further windows make, under ids that must not repeat.
func (d *decoder) rules(c *Config, rulesNode *yaml.Node, allowNone bool) {
	if rulesNode.Kind != yaml.SequenceNode {
		d.fail(rulesNode, "rules", "want a list, got %s", describe(rulesNode))
		return
	}
	if len(rulesNode.Content) == 0 && !allowNone {
		// A file emptied by mistake (or by a bad template) would let every
		// request through on the next reload.
		d.fail(rulesNode, "rules", "empty: with no rules every request passes; write allowNoRules: true if that is meant")
		return
	}
	ids := map[string]int{}
	for i, rn := range rulesNode.Content {
		field := fmt.Sprintf("rules[%d]", i)
		r := d.rule(c, rn, field)
		if r == nil {
			continue
		}
		more := d.keyLimitRules(r) // first: r then exempts the key limits' keys, windows included
		more = append(more, d.windows(r, field)...)
		for _, x := range append([]*Rule{r}, more...) {
			if line, dup := ids[x.ID]; dup && x.ID != "" {
				d.fail(rn, field+".id", "duplicate id %q (first at line %d)", x.ID, line)
			}
			ids[x.ID] = rn.Line
			c.Rules = append(c.Rules, x)
		}
	}
	for _, r := range c.Rules {
		if r.Tiers != nil {
			r.levels = DefaultLevels
			if c.Priority != nil {
				r.levels = c.Priority.Levels
			}
		}
	}
}
