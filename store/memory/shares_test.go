package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/global"
	"github.com/sluice-rl/sluice/store/memory"
)

// A part that gave its share up, or holds more under a lease, is never
// dropped to make room for new keys: the key would come back fresh at the
// region's own share, full, and the region would admit what it told the
// other regions it no longer holds.
func TestAMovedPartIsNeverDroppedForRoom(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	s := memory.New(memory.WithClock(clock), memory.WithMaxKeys(128*16))
	defer s.Close()
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Second, Algorithm: sluice.TokenBucket, Portion: 500}
	var gaveUp, leased []string
	for i := range 256 {
		k := fmt.Sprintf("moved%d", i)
		sh := global.Share{Key: k, Share: 0}
		if i%2 == 1 {
			sh = global.Share{Key: k, Share: 1000, Lease: time.Hour}
			leased = append(leased, k)
		} else {
			gaveUp = append(gaveUp, k)
		}
		if err := s.SetShares(ctx, "r", l, []global.Share{sh}); err != nil {
			t.Fatal(err)
		}
	}
	var out [1]sluice.Decision
	for i := range 40_000 { // far past the bound: every slot is wanted
		if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: fmt.Sprintf("new%d", i), Limit: l, Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Shares(ctx, "r", l, append(gaveUp, leased...))
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		want := int64(0)
		if i >= len(gaveUp) {
			want = 1000
		}
		if g.Share != want {
			t.Fatalf("after 40,000 new keys, %s holds %d, want %d: the part was dropped and came back fresh", g.Key, g.Share, want)
		}
	}
}
