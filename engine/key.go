package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/sluice-rl/sluice/rules"
)

// MaxKeyBytes is the longest rate-limit key a store sees as it was sent.
// A longer key is stored as its digest (see boundKey), so a client that
// sends a megabyte phone number or header costs the store 40 bytes, not a
// megabyte, and the same digest is used by every store.
const MaxKeyBytes = 64

// hashedKeyPrefix starts every digest key, missingKeyPrefix every key a
// rule counts a request without its own key under (onMissingKey:
// fallback). A key sent by a client that itself starts with "~" is hashed,
// so no raw key can equal a digest or a fallback key: the key spaces are
// disjoint.
const (
	hashedKeyPrefix  = "~sha256:"
	missingKeyPrefix = "~missing:"
)

// boundKey replaces buf[start:] with its digest when it is longer than
// MaxKeyBytes or starts with "~" (the prefix of sluice's own keys): hashedKeyPrefix followed by
// the hex of the first 128 bits of its SHA-256. Collisions are then as
// unlikely as a 128-bit collision (an attacker cannot aim one key at
// another's count). Shorter keys are kept byte for byte: keys are compared
// as the bytes sent, never normalised or merged.
func boundKey(buf []byte, start int) []byte {
	k := buf[start:]
	if len(k) <= MaxKeyBytes && (len(k) == 0 || k[0] != '~') {
		return buf
	}
	sum := sha256.Sum256(k)
	buf = append(buf[:start], hashedKeyPrefix...)
	return hex.AppendEncode(buf, sum[:16])
}

// StoreKey returns the key the engine hands to the store for key as built
// from a request (see boundKey): for operators' tools, such as the admin
// API, that name a key as the rules build it.
func StoreKey(key string) string {
	return string(boundKey([]byte(key), 0))
}

// upperMethod is the method as rules match it: in upper case. Methods are
// case-sensitive (RFC 9110 §9.1), but some servers read "post" as POST;
// counting it as POST is the strictest reading. strings.ToUpper returns an
// upper-case method as it is, without allocating.
func upperMethod(m string) string { return strings.ToUpper(m) }

// ruleKey appends the key r counts req under, bounded (boundKey): the
// rule's own, or when a source of it is missing and the rule falls back
// (onMissingKey: fallback, the default), missingKeyPrefix and its fallback
// key. It reports KeyFound when it appended a key; otherwise buf is as it
// came and the state says why (missing with another mode, ambiguous, a
// body too large).
func ruleKey(buf []byte, r *rule, req *rules.Request, route string, ipv6Prefix int) ([]byte, rules.KeyState) {
	start := len(buf)
	buf, state := r.AppendKey(buf, req, route, ipv6Prefix)
	switch {
	case state == rules.KeyFound:
		return boundKey(buf, start), state
	case state != rules.KeyMissing || r.MissingKey != rules.MissingFallback:
		return buf, state
	}
	buf = append(buf, missingKeyPrefix...)
	buf, _ = r.AppendFallbackKey(buf, req, route, ipv6Prefix) // none either: one count for all such requests
	r.stats.fellBack.Add(1)
	if len(buf)-start <= MaxKeyBytes {
		return buf, rules.KeyFound
	}
	sum := sha256.Sum256(buf[start:])
	buf = append(buf[:start], hashedKeyPrefix...)
	return hex.AppendEncode(buf, sum[:16]), rules.KeyFound
}
