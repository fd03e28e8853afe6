package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The store's Key escapes braces so that the whole value is the tag, one
// to one, and its slot is the slot of its tag.
func TestKeyEscapesBracesInTheHashTag(t *testing.T) {
	s := &Store{prefix: "sluice:"}
	l := sluice.Limit{Rate: 1, Period: time.Second}
	for _, tc := range []struct{ key, tag string }{
		{"u42", "{u42}"}, {"}x", "{%7Dx}"}, {"{T}", "{%7BT%7D}"}, {"50%", "{50%25}"}, {"%7D", "{%257D}"},
	} {
		if k := s.Key("r", tc.key, l); !strings.HasPrefix(k, "sluice:"+tc.tag+"r") || len(k) != len("sluice:"+tc.tag+"r")+5 {
			t.Errorf("Key(%q) = %q, want the tag %s", tc.key, k, tc.tag)
		} else if slot(k) != slot(tc.tag[1:len(tc.tag)-1]) {
			t.Errorf("Key(%q) is not in its tag's slot", tc.key)
		}
	}
}

// A key is the tag, the rule and a five-character fingerprint of the limit,
// with no prefix by default: the names Redis spends memory on are as short
// as the design allows. Limits that differ in any field get different
// fingerprints, and fingerprints are stable across processes.
func TestKeyIsShortAndNamesTheLimit(t *testing.T) {
	s := &Store{}
	base := sluice.Limit{Rate: 1000, Period: time.Second, Algorithm: sluice.FixedWindow}
	k := s.Key("bench.user", "9:user=k999", base)
	if want := "{9:user=k999}bench.user"; !strings.HasPrefix(k, want) || len(k) != len(want)+5 {
		t.Fatalf("Key = %q, want %q and five characters", k, want)
	}
	if len(k) > 28 {
		t.Fatalf("Key = %q, %d bytes: over the 28 that fit Redis' 32-byte allocation", k, len(k))
	}
	seen := map[string]sluice.Limit{fingerprint(base): base}
	for _, l := range []sluice.Limit{
		{Rate: 1001, Period: time.Second, Algorithm: sluice.FixedWindow},
		{Rate: 1000, Period: time.Minute, Algorithm: sluice.FixedWindow},
		{Rate: 1000, Period: time.Second, Algorithm: sluice.SlidingWindow},
		{Rate: 1000, Period: time.Second},
		{Rate: 1000, Period: time.Second, Burst: 2000},
	} {
		fp := fingerprint(l)
		if prev, ok := seen[fp]; ok {
			t.Fatalf("%v and %v share the fingerprint %q", prev, l, fp)
		}
		seen[fp] = l
	}
	if got, want := fingerprint(base), fingerprint(sluice.Limit{Rate: 1000, Period: time.Second, Algorithm: sluice.FixedWindow}); got != want {
		t.Fatalf("one limit, two fingerprints: %q, %q", got, want)
	}
}
