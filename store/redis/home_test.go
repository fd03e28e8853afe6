package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/global"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// The home on Redis answers each exchange as the coordinator's own
// decisions do on the same accounts at the same time: random exchanges of
// three regions on four keys, the store on a manual clock, against
// global.Options.Exchange on accounts kept in the test.
func TestTheHomeAnswersAsTheCoordinatorDoes(t *testing.T) {
	_, s, clock := homeOnManualClock(t)
	ctx := context.Background()
	o := global.Options{Own: map[string]int64{"us": 400, "eu": 300, "ap": 300}, Period: time.Second, LeaseFor: 3 * time.Second}
	regions := []string{"ap", "eu", "us"}
	keys := []string{"k0", "k1", "k2", "k3"}
	model := map[string]*global.KeyAllocation{}
	wantedSet := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	// The accounts begin, and a lease passes: the home then grants as the
	// coordinator does (TestAHomeThatLostItsAccountsGrantsNoGrowth).
	if _, _, err := s.Exchange(ctx, "r1", "us", &o, nil); err != nil {
		t.Fatal(err)
	}
	clock.Advance(o.LeaseFor)
	for step := range 600 {
		clock.Advance(time.Duration(rng.IntN(700)) * time.Millisecond)
		region := regions[rng.IntN(len(regions))]
		var asks []global.Ask
		for _, k := range keys {
			if rng.IntN(2) == 0 {
				asks = append(asks, global.Ask{Key: k, Held: int64(rng.IntN(1001)), Want: int64(rng.IntN(1100))})
			}
		}
		grants, wanted, err := s.Exchange(ctx, "r1", region, &o, asks)
		if err != nil {
			t.Fatal(err)
		}
		if len(grants) != len(asks) {
			t.Fatalf("step %d: %d grants for %d asks", step, len(grants), len(asks))
		}
		for i, a := range asks {
			m := model[a.Key]
			if m == nil {
				m = &global.KeyAllocation{}
				model[a.Key] = m
			}
			want := o.Exchange(m, region, a, clock.Now())
			if o.AtRest(m, clock.Now()) {
				delete(model, a.Key) // the home forgets it; so does the model
			}
			if grants[i] != want {
				t.Fatalf("step %d, %s asks %+v: the home granted %+v, the coordinator %+v", step, region, a, grants[i], want)
			}
		}
		for _, a := range asks { // the home's wanted set, as its exchanges leave it
			m := model[a.Key]
			wantedSet[a.Key] = m != nil && o.WantedByAny(m, clock.Now())
		}
		var others []string // keys of the set not asked that other regions want more of
		for _, k := range keys {
			if m := model[k]; m != nil && wantedSet[k] && !slices.ContainsFunc(asks, func(a global.Ask) bool { return a.Key == k }) && o.Wanted(m, region, clock.Now()) {
				others = append(others, k)
			}
		}
		sort.Strings(wanted)
		if !slices.Equal(wanted, others) {
			t.Fatalf("step %d: the home named %q wanted elsewhere to %s, the coordinator %q", step, wanted, region, others)
		}
	}
}

// Regions exchanging at once (one that gives all up and wants none, three
// racing for what it frees), each honest (it declares the share in force
// and applies a grant, counting its lease from before it sent the
// request), never hold more than the capacity between them at any instant:
// each exchange reads and writes the accounts as one step, so two regions
// are never granted the same free share. The regions' shares are logged
// on one clock and summed at every change.
func TestRegionsExchangingAtOnceNeverHoldMoreThanTheCapacity(t *testing.T) {
	s, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := global.Options{Own: map[string]int64{"r0": 250, "r1": 250, "r2": 250, "r3": 250},
		Period: 100 * time.Millisecond, LeaseFor: 300 * time.Millisecond}
	var (
		mu     sync.Mutex
		log    []shareChange // every share a region puts in force, on one clock
		exchgs int
	)
	start := time.Now()
	at := func() time.Duration { return time.Since(start) }
	// r0 gives its share up before the others start: there is free share
	// from the first exchange on.
	if _, _, err := s.Exchange(context.Background(), "busy", "r0", &o, []global.Ask{{Key: "k", Held: 0, Want: 0}}); err != nil {
		t.Fatal(err)
	}
	log = append(log, shareChange{at: at(), region: "r0", share: 0})
	// New accounts grant no growth for a lease (a home that lost its
	// accounts may have forgotten leases running): the race starts after.
	time.Sleep(o.LeaseFor)
	var wg sync.WaitGroup
	for i := range 4 {
		region := fmt.Sprintf("r%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			own := o.Own[region]
			held, until := own, time.Duration(0) // the share, above own until until
			if i == 0 {
				held = 0
			}
			inForce := func(now time.Duration) int64 {
				if held > own && now >= until {
					return own
				}
				return held
			}
			for range 150 {
				now := at()
				declare := inForce(now)
				quiet := i == 0                // gives all up and wants none: the others race for it
				if quiet || rng.IntN(4) == 0 { // gives some up before it says so
					declare = int64(rng.IntN(int(declare) + 1))
					if quiet {
						declare = 0
					}
					mu.Lock()
					held, until = declare, 0
					log = append(log, shareChange{at: at(), region: region, share: declare})
					mu.Unlock()
				}
				want := 600 + int64(rng.IntN(401)) // more than the capacity in all: max-min shares, above the own ones
				if quiet {
					want = 0
				}
				sent := at()
				grants, _, err := s.Exchange(context.Background(), "busy", region, &o, []global.Ask{{Key: "k", Held: declare, Want: want}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				exchgs++
				held, until = grants[0].Share, sent+o.LeaseFor
				if held <= own {
					until = 0
				}
				log = append(log, shareChange{at: at(), region: region, share: held, until: until})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	sort.SliceStable(log, func(i, j int) bool { return log[i].at < log[j].at })
	grown := 0
	for _, c := range log {
		if c.share > o.Own[c.region] {
			grown++
		}
	}
	if grown == 0 {
		t.Fatalf("%d exchanges and no region ever held more than its own share: the test proves nothing", exchgs)
	}
	if over, when, sum := firstOver(log, o.Own, o.Capacity()); over {
		t.Fatalf("at %v the regions held %d thousandths in all, capacity %d (%d exchanges)", when, sum, o.Capacity(), exchgs)
	}
}

type shareChange struct {
	at     time.Duration
	region string
	share  int64
	until  time.Duration // a share above the region's own ends then
}

// firstOver sums the shares in force at every change and every lease's end.
func firstOver(log []shareChange, own map[string]int64, capacity int64) (bool, time.Duration, int64) {
	instants := []time.Duration{}
	for _, c := range log {
		instants = append(instants, c.at)
		if c.until != 0 {
			instants = append(instants, c.until)
		}
	}
	slices.Sort(instants)
	last := map[string]shareChange{}
	i := 0
	for _, now := range instants {
		for ; i < len(log) && log[i].at <= now; i++ {
			last[log[i].region] = log[i]
		}
		sum := int64(0)
		for r, o := range own {
			c, ok := last[r]
			switch {
			case !ok:
				sum += o
			case c.share > o && c.until != 0 && now >= c.until:
				sum += o
			default:
				sum += c.share
			}
		}
		if sum > capacity {
			return true, now, sum
		}
	}
	return false, 0, 0
}

// A region is told of keys it did not ask about that other regions want,
// so it gives up what it does not use of them; and once every region is
// back at its own share, the home forgets the key.
func TestTheHomeNamesKeysWantedElsewhereAndForgetsKeysAtRest(t *testing.T) {
	srv, s, clock := homeOnManualClock(t)
	ctx := context.Background()
	o := global.Options{Own: map[string]int64{"us": 500, "eu": 500}}
	if _, _, err := s.Exchange(ctx, "r", "eu", &o, nil); err != nil { // the accounts begin
		t.Fatal(err)
	}
	clock.Advance(o.WithDefaults().LeaseFor)
	if _, _, err := s.Exchange(ctx, "r", "eu", &o, []global.Ask{{Key: "hot", Held: 500, Want: 1000}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Millisecond)
	_, wanted, err := s.Exchange(ctx, "r", "us", &o, []global.Ask{{Key: "other", Held: 500, Want: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wanted, []string{"hot"}) {
		t.Fatalf("us, which holds its own 500 of hot that eu wants, is told %q are wanted, want [hot]", wanted)
	}
	// us gives hot up; eu gets it; then eu's demand goes, and both return
	// to their own shares.
	if _, _, err := s.Exchange(ctx, "r", "us", &o, []global.Ask{{Key: "hot", Held: 0, Want: 0}}); err != nil {
		t.Fatal(err)
	}
	g, _, err := s.Exchange(ctx, "r", "eu", &o, []global.Ask{{Key: "hot", Held: 500, Want: 1000}})
	if err != nil || g[0].Share != 1000 {
		t.Fatalf("eu, with us's share given up: %+v (%v), want 1000", g, err)
	}
	clock.Advance(10 * time.Second) // eu's lease and both wants end
	// Each declares what it holds: eu its own share (its lease ended), us
	// nothing (it gave hot up); the first answers bring both back.
	held := map[string]int64{"eu": 500, "us": 0}
	for range 2 {
		for _, r := range []string{"eu", "us"} {
			g, _, err := s.Exchange(ctx, "r", r, &o, []global.Ask{{Key: "hot", Held: held[r], Want: 0}, {Key: "other", Held: 500, Want: 0}})
			if err != nil {
				t.Fatal(err)
			}
			held[r] = g[0].Share
		}
	}
	if held["eu"] != 500 || held["us"] != 500 {
		t.Fatalf("with nobody wanting hot, the regions hold %v of it, want their own 500 each", held)
	}
	if n, err := srv.Do("HLEN", "{g:r}a"); err != nil || n != ":0" {
		t.Fatalf("every region back at its own share, want nothing, and the home keeps %s keys' accounts (%v)", n, err)
	}
}

// A home that lost its accounts (restarted empty) while a region held a
// lease grants no region more than it holds until a lease has passed: the
// region it forgot may still hold the lease. Without the wait, us, which
// gave its own share up to eu, would get it back while eu still holds all.
func TestAHomeThatLostItsAccountsGrantsNoGrowth(t *testing.T) {
	srv, s, clock := homeOnManualClock(t)
	ctx := context.Background()
	o := global.Options{Own: map[string]int64{"us": 500, "eu": 500}, Period: time.Second, LeaseFor: 3 * time.Second}
	exchange := func(region string, held, want int64) int64 {
		t.Helper()
		g, _, err := s.Exchange(ctx, "r", region, &o, []global.Ask{{Key: "hot", Held: held, Want: want}})
		if err != nil {
			t.Fatal(err)
		}
		return g[0].Share
	}
	exchange("us", 0, 0)
	if g := exchange("eu", 500, 1000); g != 500 {
		t.Fatalf("eu got %d while the accounts are new, want what it holds, 500", g)
	}
	clock.Advance(o.LeaseFor)
	exchange("us", 0, 0)
	if g := exchange("eu", 500, 1000); g != 1000 {
		t.Fatalf("eu got %d once us gave its share up, want 1000", g)
	}
	clock.Advance(time.Second)
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if g := exchange("us", 0, 1000); g != 0 {
		t.Fatalf("us got %d from a home that forgot eu's lease of 1000, want 0", g)
	}
	clock.Advance(o.LeaseFor)
	if g := exchange("us", 0, 1000); g != 500 {
		t.Fatalf("us got %d once eu's forgotten lease ended, want 500 (eu counted at its own)", g)
	}
}

// Regions that disagree on their own shares (a rolling change of the rule)
// could hold more than the limit between them: the home refuses the
// exchanges of the shares it is not keeping, and names both.
func TestTheHomeRefusesRegionsThatDisagreeOnTheirShares(t *testing.T) {
	s, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	eu := global.Options{Own: map[string]int64{"eu": 900, "us": 100}}
	us := global.Options{Own: map[string]int64{"eu": 100, "us": 900}}
	if _, _, err := s.Exchange(ctx, "r", "eu", &eu, []global.Ask{{Key: "k", Held: 900, Want: 1000}}); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Exchange(ctx, "r", "us", &us, []global.Ask{{Key: "k", Held: 900, Want: 1000}})
	if err == nil || !strings.Contains(err.Error(), "disagree") || !strings.Contains(err.Error(), "eu 900 us 100") {
		t.Fatalf("us, with other own shares than eu's, was answered %v; want the disagreement named", err)
	}
	if _, _, err := s.Exchange(ctx, "r", "us", &eu, []global.Ask{{Key: "k", Held: 100, Want: 0}}); err != nil {
		t.Fatalf("us, agreeing again: %v", err)
	}
}

// homeOnManualClock is a home on a fresh redis-server whose exchanges read
// the returned clock instead of TIME, closed when the test ends.
func homeOnManualClock(t *testing.T) (*redistest.Server, *redis.Store, *sluice.ManualClock) {
	t.Helper()
	clock := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	srv := redistest.Start(t)
	s, err := redis.New(redis.Options{URL: srv.URL(), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return srv, s, clock
}
