package rules

import (
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/sluice-rl/sluice"
)

// Config is a loaded, validated rule file.
type Config struct {
	File string
	// Sources are the named key sources: the defaults, overridden and
	// extended by the file's keys section.
	Sources map[string]*Source
	// TrustedProxies are the peers whose forwarding headers are believed.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is the prefix length IPv6 client addresses are counted by.
	IPv6Prefix int
	Rules      []*Rule
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
	// Cost is what one request takes (default 1).
	Cost int64
	// Shadow rules are evaluated and reported but never reject.
	Shadow bool
	// FailClosed rejects when the store fails; the default fails open.
	FailClosed bool
	// CountOn, when set, charges a request only if its response status is
	// listed: the rule rejects once exhausted, but only such responses count.
	CountOn []int
	// Penalty, when set, locks a key out after repeated rejections.
	Penalty *Penalty
	// RejectMissingKey rejects a request that lacks a key source instead of
	// skipping the rule for it.
	RejectMissingKey bool
	// Fallback is the loose per-node limit applied while failing open.
	Fallback sluice.Limit
	// Line is where the rule starts in its file.
	Line int
}

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
	Hosts   []string
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
		return nil, d.errs
	}
	return c, nil
}

// NeedsBody reports whether any rule takes its key from the request body, so
// the caller knows whether to read it.
func (c *Config) NeedsBody() bool {
	for _, r := range c.Rules {
		for _, s := range r.Key {
			if s.Kind == FromBody {
				return true
			}
		}
	}
	return false
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
