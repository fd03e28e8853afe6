package global

import (
	"testing"
	"time"
)

// exchange is one region's exchange at now (s), for the test's one key.
func exchange(o *Options, a *KeyAllocation, region string, held, want int64, now float64) Grant {
	return o.Exchange(a, region, Ask{Key: "k", Held: held, Want: want}, int64(now*float64(time.Second)))
}

// A lull in a busy region's traffic does not hand its share to regions
// that ask for nothing; when another region wants it, the busy region is
// told (Wanted) and the newcomer gets only what was given up or whose
// lease ended, never a share another region may still hold.
func TestSharesFollowDemandAndNeverOverlap(t *testing.T) {
	o := Options{Own: map[string]int64{"eu": 500, "us": 500}}.WithDefaults()
	var a KeyAllocation
	exchange(&o, &a, "us", 500, 0, 0)
	if g := exchange(&o, &a, "eu", 500, 1000, 0.1); g.Share != 500 {
		t.Fatalf("eu got %d while us may hold its own 500, want 500", g.Share)
	}
	exchange(&o, &a, "us", 0, 0, 0.2) // us gives its share up
	if g := exchange(&o, &a, "eu", 500, 1000, 0.3); g.Share != 1000 {
		t.Fatalf("eu got %d after us gave its share up, want 1000", g.Share)
	}
	// A lull: eu wants 200 of the 1000 it holds; us asks for nothing.
	if g := exchange(&o, &a, "eu", 1000, 200, 1.3); g.Share != 1000 || g.Wanted {
		t.Fatalf("a lull: eu got %+v, want to keep 1000, not wanted", g)
	}
	if g := exchange(&o, &a, "us", 0, 0, 1.4); g.Share != 0 {
		t.Fatalf("idle us got %d of what eu holds", g.Share)
	}
	// us wants 600: it gets nothing eu may still hold, and eu is told.
	if g := exchange(&o, &a, "us", 0, 600, 1.5); g.Share != 0 {
		t.Fatalf("us got %d while eu may hold all 1000", g.Share)
	}
	if g := exchange(&o, &a, "eu", 1000, 200, 2.3); g.Share != 400 || !g.Wanted {
		t.Fatalf("eu, wanted elsewhere: %+v, want 400 (its 200 and the 200 nobody wants) and Wanted", g)
	}
	if g := exchange(&o, &a, "us", 0, 600, 2.4); g.Share != 0 {
		// eu was granted 400 but may still hold its declared 1000 until
		// that lease (from 1.3, 3 s) ends.
		t.Fatalf("us got %d while eu's lease of 1000 runs", g.Share)
	}
	if g := exchange(&o, &a, "eu", 400, 200, 2.5); g.Share > 400 {
		t.Fatalf("eu got %d back", g.Share)
	}
	if g := exchange(&o, &a, "us", 0, 600, 2.6); g.Share != 600 {
		t.Fatalf("us got %d once eu declared 400, want 600", g.Share)
	}
}

// A region that stops exchanging (cut off) keeps its lease until it ends
// on the coordinator's count, and not a moment less; then the others get
// it.
func TestACutOffRegionsLeaseIsGivenAwayOnlyAfterItEnds(t *testing.T) {
	o := Options{Own: map[string]int64{"eu": 500, "us": 500}}.WithDefaults()
	var a KeyAllocation
	if g := exchange(&o, &a, "eu", 500, 1000, 0); g.Share != 500 {
		t.Fatalf("eu got %d while us may hold its own 500", g.Share)
	}
	if g := exchange(&o, &a, "us", 500, 0, 0.1); g.Share != 0 || !g.Wanted {
		t.Fatalf("idle us, with eu wanting more: %+v, want 0 and Wanted", g)
	}
	exchange(&o, &a, "us", 0, 0, 0.2) // us gave it up
	if g := exchange(&o, &a, "eu", 500, 1000, 0.3); g.Share != 1000 {
		t.Fatalf("eu got %d, want 1000", g.Share)
	}
	// eu is cut off from here; us's demand comes back.
	for _, at := range []float64{0.5, 1.5, 2.5, 3.29} {
		if g := exchange(&o, &a, "us", 0, 1000, at); g.Share != 0 {
			t.Fatalf("at %vs us got %d while eu's lease (to 3.3 s) runs", at, g.Share)
		}
	}
	// After the lease, eu holds its own share at most, and us gets the rest.
	if g := exchange(&o, &a, "us", 0, 1000, 3.31); g.Share != 500 {
		t.Fatalf("after eu's lease us got %d, want 500 (eu keeps its own)", g.Share)
	}
}

// Over the capacity, wants are met max-min fairly: the smallest whole, the
// rest equally; borrowing raises the capacity.
func TestWantsBeyondTheCapacityAreSharedMaxMin(t *testing.T) {
	o := Options{Own: map[string]int64{"a": 0, "b": 0, "c": 0}, Borrow: 30}.WithDefaults()
	var a KeyAllocation
	for _, r := range []struct {
		name string
		want int64
	}{{"a", 100}, {"b", 900}, {"c", 900}} {
		exchange(&o, &a, r.name, 0, r.want, 0)
	}
	got := o.targets(&a, 0)
	if got["a"] != 100 || got["b"] != 465 || got["c"] != 465 {
		t.Fatalf("targets %v, want a 100, b and c 465 each of 1030", got)
	}
}
