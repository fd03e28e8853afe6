package engine

import (
	"testing"

	"github.com/sluice-rl/sluice"
)

// A request target with a fragment is refused as bad, whichever way the
// face that passes it says so: a plane that read it apart (Fragment), or
// an API or proxy that passes the path as it got it ("#" in Path). A path
// with an escaped "#" (%23) is an ordinary path.
func TestAFragmentIsRefusedAsABadRequest(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, match: {path: /otp}, key: [user], rate: 1, per: 1h}\n", Options{})
	for _, tc := range []struct {
		name     string
		path     string
		fragment bool
		refused  bool
	}{
		{"read apart", "/otp", true, true},
		{"in the path", "/otp#x", false, true},
		{"escaped", "/otp%23x", false, false},
	} {
		req := userReq("u-" + tc.name)
		req.Path, req.Fragment = tc.path, tc.fragment
		res := f.check(t, req)
		if bad := !res.Allowed && res.Reason == sluice.ReasonBadRequest; bad != tc.refused {
			t.Errorf("%s: allowed %v, reason %v; want refused as bad: %v", tc.name, res.Allowed, res.Reason, tc.refused)
		}
	}
}
