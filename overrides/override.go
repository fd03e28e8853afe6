// Package overrides holds the limits an operator changes at run time,
// without a deploy: for one rule and one key (or every key with a prefix),
// a new limit, an exemption or a block, each until it expires or is
// removed.
//
// The rule files stay the base; an override applies on top of its rule for
// the keys it names and goes away on expiry. A process follows the
// overrides in its store (Follower): every process on one store enforces
// the same ones. Expiry needs no timer: an expired override is never found
// (Set.Find compares with the time of the request) and is dropped at the
// next change or re-read.
package overrides

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Action is what an override does to the requests it applies to.
type Action string

// The actions.
const (
	// Limit counts the key under another rate, period and burst, with the
	// rule's algorithm, and the key's state as it stands.
	Limit Action = "limit"
	// Exempt lets the key's requests pass the rule, counting nothing.
	Exempt Action = "exempt"
	// Block refuses the key's requests under the rule until the override
	// ends.
	Block Action = "block"
)

// Bounds of one override and of a set.
const (
	// MaxOverrides is the most overrides a store holds at once; one more
	// is refused.
	MaxOverrides = 10_000
	// MaxKeyBytes bounds a key or a prefix; a longer key value is one the
	// rules store as a digest, which is what the key holds then.
	MaxKeyBytes = 1024
	// MaxTextBytes bounds the reason and who set it.
	MaxTextBytes = 512
	// MaxLifetime is the furthest an expiry may be; longer belongs in the
	// rule file (or UntilRemoved, which says so).
	MaxLifetime = 366 * 24 * time.Hour
)

// Override is one change of a rule for some keys. Its identity is the rule
// and the key (or prefix): there is at most one for each, and setting one
// replaces it.
type Override struct {
	// ID is derived from Rule, Key and Prefix (IDOf); Version counts the
	// changes of the set when this one was last written, for
	// compare-and-set: an operator who read version 7 replaces it only if
	// it is still 7.
	ID      string `json:"id"`
	Version int64  `json:"version"`

	// Rule is the id of the rule it changes (a window's or a file
	// override's id names that one).
	Rule string `json:"rule"`
	// Key is the key as the rule builds it (one source: its value, hashed
	// for secret sources; several: their length-prefixed join). Prefix
	// instead applies to every key that starts with it, for rules of one
	// plain source. The longest matching prefix wins; an exact key wins
	// over any prefix.
	Key    string `json:"key,omitempty"`
	Prefix string `json:"prefix,omitempty"`

	Action Action `json:"action"`
	// Rate per Per, with Burst (0: Rate), for Action Limit.
	Rate  int64    `json:"rate,omitempty"`
	Per   Duration `json:"per,omitempty"`
	Burst int64    `json:"burst,omitempty"`

	// Expires is when it ends; UntilRemoved says it has no end (Expires
	// is then zero). One of the two is required.
	Expires      time.Time `json:"expires,omitzero"`
	UntilRemoved bool      `json:"untilRemoved,omitempty"`

	Reason  string    `json:"reason"`
	By      string    `json:"by"`
	Updated time.Time `json:"updated,omitzero"`
}

// IDOf is the id of the override of rule for key or prefix.
func IDOf(rule, key, prefix string) string {
	h := sha256.New()
	kind := "k"
	if prefix != "" {
		kind, key = "p", prefix
	}
	fmt.Fprintf(h, "%d:%s|%s|%d:%s", len(rule), rule, kind, len(key), key)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Live reports whether o is in force at now.
func (o *Override) Live(now time.Time) bool {
	return o.UntilRemoved || now.Before(o.Expires)
}

// FieldError is a validation error naming the field at fault.
type FieldError struct {
	Field, Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// Check validates o as set at now, without the rules (the caller checks
// that the rule exists and takes such a key): the first field at fault,
// as a *FieldError.
func (o *Override) Check(now time.Time) error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.Rule == "":
		return bad("rule", "missing: the id of the rule to change")
	case o.Key == "" && o.Prefix == "":
		return bad("key", "missing: the key to change (or prefix, for every key that starts with it)")
	case o.Key != "" && o.Prefix != "":
		return bad("prefix", "give key or prefix, not both")
	case len(o.Key) > MaxKeyBytes || len(o.Prefix) > MaxKeyBytes:
		return bad("key", "longer than %d bytes", MaxKeyBytes)
	}
	switch o.Action {
	case Limit:
		switch {
		case o.Rate <= 0:
			return bad("rate", "must be at least 1 for a limit (to refuse everything, use action block)")
		case o.Per.D() == 0:
			return bad("per", "missing: the period of the rate, such as 1m")
		case o.Per.D() < 0:
			return bad("per", "must be a positive period, such as 1m, not %v", o.Per.D())
		case o.Burst < 0:
			return bad("burst", "must be 0 (the rate) or more")
		}
	case Exempt, Block:
		if o.Rate != 0 || o.Per.D() != 0 || o.Burst != 0 {
			return bad("rate", "a %s override takes no rate, per or burst", o.Action)
		}
	case "":
		return bad("action", "missing: limit, exempt or block")
	default:
		return bad("action", "%q: want limit, exempt or block", o.Action)
	}
	switch {
	case o.UntilRemoved && !o.Expires.IsZero():
		return bad("expires", "give expires or untilRemoved, not both")
	case !o.UntilRemoved && o.Expires.IsZero():
		return bad("expires", "missing: when the override ends (RFC 3339), or untilRemoved: true")
	case !o.UntilRemoved && !o.Expires.After(now):
		return bad("expires", "%s is not in the future", o.Expires.Format(time.RFC3339))
	case o.Expires.Sub(now) > MaxLifetime:
		return bad("expires", "more than a year away: put a lasting change in the rule file, or say untilRemoved: true")
	case o.Reason == "":
		return bad("reason", "missing: why (it is logged and listed with the override)")
	case len(o.Reason) > MaxTextBytes || !utf8.ValidString(o.Reason):
		return bad("reason", "must be UTF-8 of at most %d bytes", MaxTextBytes)
	case o.By == "":
		return bad("by", "missing: who sets it")
	case len(o.By) > MaxTextBytes || !utf8.ValidString(o.By):
		return bad("by", "must be UTF-8 of at most %d bytes", MaxTextBytes)
	}
	return nil
}

// Errors of a store's compare-and-set and bounds.
var (
	// ErrVersion: the override changed (or appeared, or went) since the
	// version the caller gave.
	ErrVersion = errors.New("overrides: changed since the version given")
	// ErrFull: the store holds MaxOverrides live overrides.
	ErrFull = fmt.Errorf("overrides: at most %d overrides may be in force; remove some first", MaxOverrides)
	// ErrNotFound: no override has that id.
	ErrNotFound = errors.New("overrides: no such override")
	// ErrNotMade: the store did not make the change before the caller's
	// deadline, and will not make it later.
	ErrNotMade = errors.New("overrides: the store did not answer in time; nothing changed")
	// ErrOutcomeUnknown: the change was sent, and the store did not answer
	// before the caller's deadline and a grace after it. The store made the
	// change before the deadline or never will; only reading it tells which.
	ErrOutcomeUnknown = errors.New("overrides: the store did not answer; the change was made before the deadline or never will be")
)

// Duration is a time.Duration written as Go writes one ("1m0s") and read
// from that form or a number of seconds.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText writes d as "1m0s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads "90s", "1m" or "1h30m".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration such as 1m or 90s", b)
	}
	*d = Duration(v)
	return nil
}
