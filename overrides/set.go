package overrides

import (
	"slices"
	"time"
)

// Set is the overrides in force at one version of a store, indexed for
// Find. It is immutable; a change makes a new Set.
type Set struct {
	version  int64
	all      []*Override
	rules    map[string]*ruleIndex
	firstEnd time.Time // the earliest expiry among the set's overrides; zero if none ends
}

// ruleIndex finds one rule's overrides: exact keys in a map, prefixes by
// their lengths (a key is looked up once per distinct prefix length,
// longest first).
type ruleIndex struct {
	exact    map[string]*Override
	prefixes map[string]*Override
	lengths  []int // of prefixes, longest first
}

// NewSet indexes list, the overrides of a store at version. Expired ones
// are kept (Find skips them) until the store drops them.
func NewSet(version int64, list []*Override) *Set {
	s := &Set{version: version, all: list, rules: map[string]*ruleIndex{}}
	for _, o := range list {
		if !o.UntilRemoved && (s.firstEnd.IsZero() || o.Expires.Before(s.firstEnd)) {
			s.firstEnd = o.Expires
		}
		ri := s.rules[o.Rule]
		if ri == nil {
			ri = &ruleIndex{exact: map[string]*Override{}, prefixes: map[string]*Override{}}
			s.rules[o.Rule] = ri
		}
		if o.Prefix == "" {
			ri.exact[o.Key] = o
			continue
		}
		if _, ok := ri.prefixes[o.Prefix]; !ok && !slices.Contains(ri.lengths, len(o.Prefix)) {
			ri.lengths = append(ri.lengths, len(o.Prefix))
		}
		ri.prefixes[o.Prefix] = o
	}
	for _, ri := range s.rules {
		slices.SortFunc(ri.lengths, func(a, b int) int { return b - a })
	}
	return s
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Version is the store's version the set was read at.
func (s *Set) Version() int64 {
	if s == nil {
		return 0
	}
	return s.version
}

// Empty reports whether the set has no override, live or not: the
// engine's fast path.
func (s *Set) Empty() bool { return s == nil || len(s.all) == 0 }

// Has reports whether rule has any override, live or not.
func (s *Set) Has(rule string) bool {
	if s == nil {
		return false
	}
	_, ok := s.rules[rule]
	return ok
}

// Find returns the override in force at now for key under rule: the exact
// key's, else the longest prefix's; nil if none.
func (s *Set) Find(rule, key string, now time.Time) *Override {
	if s == nil {
		return nil
	}
	ri := s.rules[rule]
	if ri == nil {
		return nil
	}
	if o := ri.exact[key]; o != nil && o.Live(now) {
		return o
	}
	for _, n := range ri.lengths {
		if n > len(key) {
			continue
		}
		if o := ri.prefixes[key[:n]]; o != nil && o.Live(now) {
			return o
		}
	}
	return nil
}

// Live returns the overrides in force at now, ordered by rule and key.
func (s *Set) Live(now time.Time) []*Override {
	if s == nil {
		return nil
	}
	var out []*Override
	for _, o := range s.all {
		if o.Live(now) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *Override) int {
		switch {
		case a.Rule != b.Rule:
			return cmpString(a.Rule, b.Rule)
		case a.Key+a.Prefix != b.Key+b.Prefix:
			return cmpString(a.Key+a.Prefix, b.Key+b.Prefix)
		}
		return cmpString(a.ID, b.ID)
	})
	return out
}

// AnyEnded reports whether any override of the set is out of force at now
// (expired, and not yet dropped by its store).
func (s *Set) AnyEnded(now time.Time) bool {
	return s != nil && !s.firstEnd.IsZero() && !now.Before(s.firstEnd)
}

// HasPrefixes reports whether rule has an override of a prefix.
func (s *Set) HasPrefixes(rule string) bool {
	if s == nil {
		return false
	}
	ri := s.rules[rule]
	return ri != nil && len(ri.lengths) > 0
}

// All returns every override of the set, in force or not. The slice is the
// set's own: do not modify it.
func (s *Set) All() []*Override {
	if s == nil {
		return nil
	}
	return s.all
}

// Matching calls fn with every override for key under rule, in force or
// not: the exact key's and every prefix's that key begins with.
func (s *Set) Matching(rule, key string, fn func(*Override)) {
	if s == nil {
		return
	}
	ri := s.rules[rule]
	if ri == nil {
		return
	}
	if o := ri.exact[key]; o != nil {
		fn(o)
	}
	for _, n := range ri.lengths {
		if n <= len(key) {
			if o := ri.prefixes[key[:n]]; o != nil {
				fn(o)
			}
		}
	}
}
