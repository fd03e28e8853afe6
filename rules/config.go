package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice"
)

// Config is a loaded, validated rule file.
type Config struct {
	File string
	// Version names what the rules were loaded from: "sha256:" and the
	// first 12 hex digits of the file's digest (of the files' digests, for
	// several), or what their source calls its version (an xDS response's
	// version_info). /v1/rules and /metrics report it.
	Version string
	// Sources are the named key sources: the defaults, overridden and
	// extended by the file's keys section.
	Sources map[string]*Source
	// TrustedProxies are the peers whose forwarding headers are believed.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is the prefix length IPv6 client addresses are counted by.
	IPv6Prefix int
	// ClientIPDepth, when set, takes the client address as the depth-th of
	// X-Forwarded-For from the right, behind a trusted proxy (see
	// httplimit.ClientIPAtDepth), instead of the first untrusted hop.
	ClientIPDepth int
	// EnvoyDomains are the domains of the envoyproxy/ratelimit files loaded.
	EnvoyDomains []string
	domainLine   map[string]int // where each domain is declared
	// Paths say how request paths are normalised before matching.
	Paths PathOptions
	// Priority places requests in tiers, for rules with Tiers (nil: no
	// file section; every request is then of the default level).
	Priority *Priority
	Rules    []*Rule

	// What the proxies ask on every request, computed once (a Config is
	// immutable once loaded): see derive.
	needsBody, settlesResp, settlesJSON bool
	derivedOnce                         sync.Once
	headers                             map[string]bool
	headerNames                         []string
	headersOnce                         sync.Once
}

// ReadsHeader reports whether a rule can read the header of that canonical
// name (a header key source, cookies, or the body's Content-Type), so a
// proxy need copy out only those.
func (c *Config) ReadsHeader(canonical string) bool {
	c.readHeaders()
	return c.headers[canonical]
}

// HeaderNames are the canonical names ReadsHeader reports, sorted: a
// proxy that keeps request header names as sent can look for these few
// instead of putting every name it receives in canonical form.
func (c *Config) HeaderNames() []string {
	c.readHeaders()
	return c.headerNames
}

func (c *Config) readHeaders() {
	c.headersOnce.Do(func() {
		c.headers = map[string]bool{}
		for _, r := range c.Rules {
			for _, s := range r.sources() {
				switch s.Kind {
				case FromHeader:
					c.headers[s.Param] = true
				case FromCookie:
					c.headers["Cookie"] = true
				case FromBody:
					c.headers["Content-Type"], c.headers["Content-Encoding"] = true, true
				}
			}
			if r.Tiers != nil && c.Priority != nil && c.Priority.Source != nil {
				switch src := c.Priority.Source; src.Kind {
				case FromHeader:
					c.headers[src.Param] = true
				case FromCookie:
					c.headers["Cookie"] = true
				case FromBody:
					c.headers["Content-Type"], c.headers["Content-Encoding"] = true, true
				}
			}
			if rv := r.Reserve; rv != nil && rv.EstimateHeader != "" {
				c.headers[rv.EstimateHeader] = true
			}
			if rv := r.Reserve; rv != nil && rv.EstimateBody != "" {
				c.headers["Content-Type"], c.headers["Content-Encoding"] = true, true
			}
		}
		c.headerNames = slices.Sorted(maps.Keys(c.headers))
	})
}

// Rule is one rate limit: which requests it applies to, whose count they
// charge, and how many may pass.
type Rule struct {
	ID    string
	Match Match
	// Key lists the sources whose values, together, name the count.
	Key []*Source
	// Limit is the rate, period, burst and algorithm.
	Limit sluice.Limit
	// KeyLimitOf is, for a rule made of another's keyLimits list
	// ("per-key.key-limit-1"), that rule's id: an operator's override of
	// that rule for one of these keys applies here.
	KeyLimitOf string
	// Cost is what one request takes (default 1).
	Cost int64
	// Unit names what the rule counts, in the answers' words ("Limit is
	// 10000 tokens per minute"): the file's unit, else "requests", or
	// "units" for a rule whose requests cost more than one (Units).
	Unit string
	// Shadow rules are evaluated and reported but never reject.
	Shadow bool
	// DelayAfter, for a leaky-queue rule, lets that many requests beyond
	// the rate through at once before the rest wait their turn (nginx's
	// limit_req delay=): each delay is shortened by DelayAfter intervals.
	DelayAfter int64
	// RefusalStatus is the HTTP status of the rule's refusals (status:):
	// 429 Too Many Requests, the default (0), or 503 Service Unavailable,
	// what nginx's limit_req answers unless limit_req_status says otherwise.
	RefusalStatus int
	// FailClosed rejects when the store fails; the default fails open.
	FailClosed bool
	// SlowStoreWait, when above 0, is how long a request waits for a store
	// that is slow but answering (onSlowStore: wait) before it is answered
	// by FailClosed; 0 answers at the store's deadline, from the gateway's
	// share (onSlowStore: share).
	SlowStoreWait time.Duration
	// CountOn, when set, charges a request only if its response status is
	// listed: the rule rejects once exhausted, but only such responses count.
	CountOn []int
	// Adaptive rules follow the protected service's pressure: their rate
	// is multiplied by the factor the gateway or middleware measures
	// (concurrency.Pressure), 1 while the service is healthy.
	Adaptive bool
	// Tiers, when set, share the limit among priority tiers (see
	// Config.Priority): each keeps its share from the tiers below it.
	Tiers  Tiers
	levels []string // the tiers' names, for Summary
	// Reserve, when set, makes the rule count a cost known only after the
	// response (tokens, bytes): a request reserves an estimate, settled
	// later at the real cost.
	Reserve *Reserve
	// Penalty, when set, locks a key out after repeated rejections.
	Penalty *Penalty
	// MissingKey is what a request that lacks a key source gets
	// (onMissingKey): counted under FallbackKey (the default), refused, or,
	// only when the rule says so, not counted by this rule.
	MissingKey MissingKeyMode
	// FallbackKey are the sources a request without the rule's key is
	// counted under (fallbackKey; default [ip]).
	FallbackKey []*Source
	// Fallback is the per-node limit applied while failing open, when the
	// rule sets one (FallbackSet); otherwise the engine applies the rule's
	// share of its limit among the gateways.
	Fallback    sluice.Limit
	FallbackSet bool
	// Line is where the rule starts in its file.
	Line int

	// Exempt lists key source values (for ip, also CIDR prefixes) whose
	// requests the rule skips and counts nothing for: internal networks,
	// monitoring, a partner's key.
	Exempt []ValueSet

	also      []window   // further windows, expanded into rules of their own at load
	keyLimits []keyLimit // limits for some key values, expanded likewise

	// Sync is how the rule's count is shared among gateways (the sync
	// setting; exact by default).
	Sync sluice.Sharing
	// Regions gives named regions a share of the limit (0 to 1 each); a
	// gateway started with --region NAME enforces its region's share.
	Regions map[string]float64
	// Global, when set, makes the rule one limit across regions, each
	// region deciding on its own store (the global setting).
	Global *Global
	// ShowKeys lets the admin API's hot-key list show this rule's keys in
	// the clear; otherwise they are shown hashed.
	ShowKeys bool

	// Envoy, when set, makes this an Envoy descriptor rule, with the
	// settings such a rule has beside its limit (see EnvoyDescriptor).
	Envoy *EnvoyDescriptor
}

// Reserve is how a rule reserves an estimate and settles the real cost.
//
// A check reserves the estimate (the caller's, or the request header
// EstimateHeader, or Estimate); the settle charges the real cost instead:
// the difference comes back if it was less, and is charged if it was more,
// even beyond the limit, leaving the key in debt so later requests wait.
// A reservation not settled within Deadline stands at its estimate.
type Reserve struct {
	// Estimate is the units reserved when the request names none.
	Estimate int64
	// EstimateHeader names a request header, and EstimateBody a field of a
	// JSON or form request body (such as max_tokens), that gives the
	// estimate: a whole number above 0, read by the gateway and the
	// middleware. The header wins when both are given.
	EstimateHeader string
	EstimateBody   string
	// ActualHeader names a response header, and ActualJSON a field of a
	// JSON response body (a dotted path such as usage.total_tokens), that
	// gives the real cost: the gateway settles from it. Without either, the
	// caller settles (the JSON API's /v1/settle, or the library).
	ActualHeader string
	ActualJSON   []string
	// Deadline is how long a reservation stays open (default 1m).
	Deadline time.Duration
}

// SettlesFromResponses reports whether a rule settles its reservations
// from the response (actualHeader or actualJSON): a proxy in front of the
// service then reserves and settles. Computed once, like NeedsBody.
func (c *Config) SettlesFromResponses() bool {
	c.derivedOnce.Do(c.derive)
	return c.settlesResp
}

// SettlesFromJSON reports whether a rule settles from a JSON response body.
func (c *Config) SettlesFromJSON() bool {
	c.derivedOnce.Do(c.derive)
	return c.settlesJSON
}

// DefaultReserveDeadline is how long a reservation stays open by default.
const DefaultReserveDeadline = time.Minute

// MaxReserveDeadline bounds Reserve.Deadline.
const MaxReserveDeadline = 24 * time.Hour

// Penalty locks a key for Block after After rejections within the rule's
// period.
type Penalty struct {
	After int64
	Block time.Duration
}

// Match selects the requests a rule applies to; an empty Match selects all.
// Each non-empty list must contain the request's value.
type Match struct {
	Methods []string
	Paths   []*Pattern
	// NotPaths are paths the rule does not match even where Paths do
	// (match: {notPath: ...}): what nginx's longest-prefix location leaves
	// to another location, say.
	NotPaths []*Pattern
	Hosts    []string
	// Values are key source values the request must have, each of its
	// set (match: {values: {plan: [gold]}}).
	Values []ValueSet
}

// Default key sources, used unless the file's keys section redefines them.
func defaultSources() map[string]*Source {
	return map[string]*Source{
		"user":    {Name: "user", Kind: FromHeader, Param: "X-User-Id"},
		"tenant":  {Name: "tenant", Kind: FromHeader, Param: "X-Tenant-Id"},
		"api_key": {Name: "api_key", Kind: FromHeader, Param: "Authorization", Scheme: "Bearer", Hash: true},
		"phone":   {Name: "phone", Kind: FromBody, Param: "phone"},
	}
}

// DefaultIPv6Prefix is the prefix IPv6 clients are counted by: a /64 is what
// one subscriber usually owns.
const DefaultIPv6Prefix = 64

// Load reads and validates the rule file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return Parse(path, data)
}

// Parse validates a rule file's contents; name is used in error messages.
// Every fault is reported, as an [Errors].
func Parse(name string, data []byte) (*Config, error) {
	d := &decoder{file: name}
	c := d.config(data)
	if len(d.errs) > 0 {
		// In the file's order, as an editor lists them, whatever order the
		// sections were checked in.
		slices.SortStableFunc(d.errs, func(a, b *Error) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		})
		return nil, d.errs
	}
	c.Version = digest(data)
	return c, nil
}

// digest is a Version for these bytes.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:6])
}

// NeedsBody reports whether any rule takes its key from the request body, so
// the caller knows whether to read it.
// The answer is computed once: the middleware asks on every request.
func (c *Config) NeedsBody() bool {
	c.derivedOnce.Do(c.derive)
	return c.needsBody
}

// derive computes, once, what NeedsBody, SettlesFromResponses and
// SettlesFromJSON answer.
func (c *Config) derive() {
	for _, r := range c.Rules {
		for _, s := range r.sources() {
			if r.Envoy == nil && s.Kind == FromBody {
				c.needsBody = true
			}
		}
		if r.Tiers != nil && c.Priority != nil && c.Priority.Source != nil && c.Priority.Source.Kind == FromBody {
			c.needsBody = true
		}
		if rv := r.Reserve; rv != nil {
			c.needsBody = c.needsBody || rv.EstimateBody != ""
			c.settlesResp = c.settlesResp || rv.ActualHeader != "" || rv.ActualJSON != nil
			c.settlesJSON = c.settlesJSON || rv.ActualJSON != nil
		}
	}
}

// sources are every key source the rule reads: its key's, its match
// values' and its exemptions'.
func (r *Rule) sources() []*Source {
	out := slices.Clone(r.Key)
	for _, v := range r.Match.Values {
		out = append(out, v.Source)
	}
	for _, v := range r.Exempt {
		out = append(out, v.Source)
	}
	return out
}

// Rule returns the rule with the given id, or nil.
func (c *Config) Rule(id string) *Rule {
	for _, r := range c.Rules {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// LoadOptions change how several rule files load together.
type LoadOptions struct {
	// MergeDomains lets several envoyproxy/ratelimit files declare one
	// domain, their descriptors merged, as the reference service does with
	// MERGE_DOMAIN_CONFIG=true. Without it, a second file for a domain is
	// refused, as the reference refuses it by default: two teams' files
	// that name one domain by mistake would otherwise limit each other's
	// requests.
	MergeDomains bool
}

// LoadAll loads several rule files and merges them into one rule set: their
// rules apply together. Rule ids must be unique across the files; trusted
// proxies are the union; the IPv6 prefix must agree; an Envoy domain is
// declared by one file only.
func LoadAll(paths ...string) (*Config, error) { return LoadOptions{}.LoadAll(paths...) }

// LoadAll is LoadAll with these options.
func (o LoadOptions) LoadAll(paths ...string) (*Config, error) {
	var cfgs []*Config
	var errs Errors
	for _, p := range paths {
		c, err := Load(p)
		if err != nil {
			var es Errors
			if errors.As(err, &es) {
				errs = append(errs, es...)
				continue
			}
			return nil, err
		}
		cfgs = append(cfgs, c)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return o.Merge(cfgs...)
}

// Merge combines rule sets into one; see LoadAll.
func Merge(cfgs ...*Config) (*Config, error) { return LoadOptions{}.Merge(cfgs...) }

// Merge is Merge with these options.
func (o LoadOptions) Merge(cfgs ...*Config) (*Config, error) {
	if len(cfgs) == 1 {
		return cfgs[0], nil
	}
	out := &Config{Sources: defaultSources(), IPv6Prefix: DefaultIPv6Prefix}
	versions := make([]string, len(cfgs))
	for i, c := range cfgs {
		versions[i] = c.Version
	}
	out.Version = digest([]byte(strings.Join(versions, "\n")))
	names := make([]string, len(cfgs))
	for i, c := range cfgs {
		names[i] = c.File
	}
	out.File = strings.Join(names, ", ")
	domains := map[string]string{} // the file that declared each
	seen := map[string]string{}
	var errs Errors
	for i, c := range cfgs {
		if i == 0 {
			out.IPv6Prefix, out.Paths = c.IPv6Prefix, c.Paths
		} else {
			if c.IPv6Prefix != out.IPv6Prefix {
				errs = append(errs, &Error{File: c.File, Field: "ipv6Prefix", Msg: fmt.Sprintf("%d differs from %d in %s", c.IPv6Prefix, out.IPv6Prefix, cfgs[0].File)})
			}
			if c.Paths != out.Paths {
				errs = append(errs, &Error{File: c.File, Field: "paths", Msg: "differs from the paths section of " + cfgs[0].File})
			}
		}
		if c.ClientIPDepth != 0 {
			if out.ClientIPDepth != 0 && out.ClientIPDepth != c.ClientIPDepth {
				errs = append(errs, &Error{File: c.File, Field: "clientIP.depth", Msg: fmt.Sprintf("%d differs from %d in another file", c.ClientIPDepth, out.ClientIPDepth)})
			}
			out.ClientIPDepth = c.ClientIPDepth
		}
		maps.Copy(out.Sources, c.Sources)
		for _, d := range c.EnvoyDomains {
			if first, dup := domains[d]; dup && !o.MergeDomains {
				errs = append(errs, &Error{File: c.File, Line: c.domainLine[d], Field: "domain", Msg: fmt.Sprintf("%q is also declared by %s: one domain, one file, unless --merge-domains (MERGE_DOMAIN_CONFIG=true) merges them", d, first)})
				continue
			} else if !dup {
				domains[d] = c.File
				out.EnvoyDomains = append(out.EnvoyDomains, d)
			}
		}
		for _, p := range c.TrustedProxies {
			if !slices.Contains(out.TrustedProxies, p) {
				out.TrustedProxies = append(out.TrustedProxies, p)
			}
		}
		for _, r := range c.Rules {
			if first, dup := seen[r.ID]; dup {
				errs = append(errs, &Error{File: c.File, Line: r.Line, Field: "id", Msg: fmt.Sprintf("duplicate id %q (also in %s)", r.ID, first)})
				continue
			}
			seen[r.ID] = c.File
			out.Rules = append(out.Rules, r)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// MissingKeyMode is what a rule does with a request that lacks a source of
// its key.
type MissingKeyMode uint8

// The missing-key modes.
const (
	// MissingFallback counts the request under the rule's FallbackKey (the
	// client address by default), in a key space of its own: a request
	// the rule matches is always counted somewhere.
	MissingFallback MissingKeyMode = iota
	// MissingReject refuses it (400): for rules whose requests must carry
	// the key.
	MissingReject
	// MissingSkip lets the rule count nothing for it: only when written
	// out, and flagged by sluice check.
	MissingSkip
)

// Units is the plural word for what r counts: its Unit, "units" when a
// request may cost other than 1 (a cost, a reservation), else "requests".
func (r *Rule) Units() string {
	switch {
	case r.Unit != "":
		return r.Unit
	case r.Cost != 1 || r.Reserve != nil:
		return "units"
	}
	return "requests"
}
