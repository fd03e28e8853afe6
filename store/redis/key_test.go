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
		if k := s.Key("r", tc.key, l); !strings.HasPrefix(k, "sluice:"+tc.tag+":r:") {
			t.Errorf("Key(%q) = %q, want the tag %s", tc.key, k, tc.tag)
		} else if slot(k) != slot(tc.tag[1:len(tc.tag)-1]) {
			t.Errorf("Key(%q) is not in its tag's slot", tc.key)
		}
	}
}
