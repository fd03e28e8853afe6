package storetest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/global"
)

// testSharesMatchAlgo: a region's parts of a global limit, on random
// traffic with their shares moved (given up, granted under a lease, leases
// running out between takes), decide as algo.Portion does, and the store
// reports each share in force and the lease it has left as the model does.
func testSharesMatchAlgo(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 5, Period: time.Second, Burst: 8, Algorithm: sluice.TokenBucket, Portion: 400}
	clock, s, p := againstModel(t, newStore, l)
	region, ok := s.(global.Region)
	if !ok {
		t.Fatalf("%T keeps global limits' parts (sluice.Limit.Portion) but does not let an agent move their shares (global.Region)", s)
	}
	ctx := context.Background()
	keys := []string{"u1", "u2", "u3"}
	models := map[string]*algo.Portion{}
	model := func(k string) *algo.Portion {
		if models[k] == nil {
			m := algo.NewPortion(&p, l.Portion, clock.Now())
			models[k] = &m
		}
		return models[k]
	}
	rng := rand.New(rand.NewPCG(3, 4))
	moved, leased := 0, 0
	for i := range 1500 {
		advance(clock, time.Duration(rng.Int64N(int64(400*time.Millisecond))))
		k := keys[rng.IntN(len(keys))]
		m := model(k)
		switch rng.IntN(6) {
		case 0: // the agent moves the share
			share := rng.Int64N(algo.Whole + 1)
			var lease time.Duration
			if share > l.Portion {
				lease = time.Duration(1+rng.Int64N(3000)) * time.Millisecond
				leased++
			}
			if err := region.SetShares(ctx, "r", l, []global.Share{{Key: k, Share: share, Lease: lease}}); err != nil {
				t.Fatal(err)
			}
			until := int64(0)
			if lease > 0 {
				until = clock.Now() + int64(lease)
			}
			*m = m.Set(&p, clock.Now(), share, until)
			moved++
		case 1: // the agent reads it
			got, err := region.Shares(ctx, "r", l, []string{k})
			if err != nil {
				t.Fatal(err)
			}
			want := global.Share{Key: k, Share: m.Share(clock.Now())}
			if want.Share > l.Portion {
				want.Lease = time.Duration(m.Until - clock.Now())
			}
			if len(got) != 1 || got[0] != want {
				t.Fatalf("step %d: the store reads %+v of %s, the model %+v", i, got, k, want)
			}
		default:
			cost := int64(1)
			if rng.IntN(4) == 0 {
				cost = rng.Int64N(p.Burst+2) - 1 // a refund of 1, a peek, up to above the burst
			}
			d := take1(t, s, "r", k, l, cost)
			var want algo.Result
			*m = m.Take(&p, clock.Now(), cost, &want)
			if !sameDecision(d, want) {
				t.Fatalf("step %d key %s cost %d (share %d): store %+v, algo %+v", i, k, cost, m.Share(clock.Now()), d, want)
			}
		}
	}
	if moved == 0 || leased == 0 {
		t.Fatalf("%d shares moved, %d leased: the test proves nothing", moved, leased)
	}
}
