package rlqs

import (
	"context"
	"math"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// How a bucket is divided.
const (
	// headroom: a member asks for this much more than it used, so that
	// growing demand shows as use.
	headroom = 1.25
	// hysteresis: a member's grant is replaced only when its share moves by
	// more than this part, since each replacement hands out a full burst.
	hysteresis = 0.1
	// starved: a member granted less than its share by this factor is
	// grown as soon as others give back, not at its next report.
	starved = 1.5
	// keptBack: the part of the rule's rate not divided.
	keptBack = 0.05
	// payback: a replacement must move more tokens over this many report
	// intervals than it costs.
	payback = 4
	// defaultInterval is a member's report interval until its reports tell.
	defaultInterval = time.Second
	// minGap: reports of one member closer than this are noted, not
	// answered again (a flood of reports costs the store nothing more).
	minGap = 50 * time.Millisecond
	// claimEvery and claimLife: how often a process records its claim on
	// a bucket (Fleet), and how long a claim lives unrenewed.
	claimEvery = 250 * time.Millisecond
	claimLife  = 3 * time.Second
	// maxDeparted bounds the departed grants a bucket lists apart.
	maxDeparted = 64
)

// bucket is one bucket id of one domain, and the members (streams) that
// report it. Its division runs under mu, one at a time.
type bucket struct {
	s       *Service
	domain  string
	entries []rules.EnvoyEntry
	name    string
	id      *rlqsv3.BucketId // as its first member sent it: the id of every answer

	mu      sync.Mutex
	members map[*member]struct{}
	gone    []departed // grants of members that left, until they end
	others  []float64  // the other processes' claims (Fleet), as last read
	// claimedAt is when this process's claim was last recorded.
	claimedAt int64
	res       engine.Result
	descs     [1]engine.Descriptor
}

// member is one stream's subscription to one bucket: what it used, how
// often it reports, and its grant. Its fields are the bucket's, under its
// lock.
// departed is the grant of a member whose stream ended: its Envoy may go on
// filling at rate until the grant ends.
type departed struct {
	rate  float64
	until int64
}

type member struct {
	c        *client
	b        *bucket
	id       *rlqsv3.BucketId
	demand   float64       // requests a second, allowed and denied, smoothed
	seen     bool          // demand has been reported
	interval time.Duration // between its reports
	answered int64         // when its last report was answered
	g        grant
	target   float64 // the share its grant was sized for
	expires  int64   // when the Envoy's assignment ends, at the latest send
}

// subscribe makes c a member of bucket name, the bucket made if it is new
// and the server has room for it (MaxBucketBytes); nil if not.
func (s *Service) subscribe(c *client, name string, entries []rules.EnvoyEntry, id *rlqsv3.BucketId) *member {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLingering()
	b := s.buckets[name]
	if b == nil {
		cost := bucketCost(name)
		if s.bucketBytes.Load()+cost > s.o.MaxBucketBytes {
			return nil
		}
		s.bucketBytes.Add(cost)
		b = &bucket{s: s, domain: c.domain, entries: entries, name: name, id: proto.Clone(id).(*rlqsv3.BucketId), members: map[*member]struct{}{}}
		s.buckets[name] = b
	}
	mb := &member{c: c, b: b, id: b.id, interval: defaultInterval}
	b.mu.Lock()
	b.members[mb] = struct{}{}
	b.mu.Unlock()
	return mb
}

func (s *Service) unsubscribe(mb *member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := mb.b
	b.mu.Lock()
	delete(b.members, mb)
	if mb.g.kind == tokens {
		d := departed{mb.g.rate, mb.expires + int64(s.o.Grace)}
		if len(b.gone) >= maxDeparted { // folded: their sum, until the last ends
			for _, g := range b.gone {
				d.rate, d.until = d.rate+g.rate, max(d.until, g.until)
			}
			clear(b.gone)
			b.gone = b.gone[:0]
		}
		b.gone = append(b.gone, d)
	}
	empty := len(b.members) == 0
	lingers := empty && b.departedRate(s.o.Clock.Now()) > 0
	b.mu.Unlock()
	switch {
	case lingers:
		// Its departed grants still fill: the bucket stays, so that a
		// stream that comes back is not handed their rate again.
		s.lingering = append(s.lingering, b)
	case empty:
		delete(s.buckets, b.name)
		s.bucketBytes.Add(-bucketCost(b.name))
	}
}

// forgetLingering forgets the buckets kept for their departed grants
// once those have ended, oldest first, while no stream reports them; under
// s.mu.
func (s *Service) forgetLingering() {
	now := s.o.Clock.Now()
	for len(s.lingering) > 0 {
		b := s.lingering[0]
		b.mu.Lock()
		members, filling := len(b.members), b.departedRate(now) > 0
		b.mu.Unlock()
		if members == 0 && filling {
			return // the oldest still fills: the later ones wait behind it
		}
		s.lingering[0] = nil
		s.lingering = s.lingering[1:]
		if members == 0 && s.buckets[b.name] == b {
			delete(s.buckets, b.name)
			s.bucketBytes.Add(-bucketCost(b.name))
		}
	}
}

// bucketCost is what a bucket holds in memory, roughly: its id as sent,
// as a name and as a descriptor, and the bucket itself.
func bucketCost(name string) int64 { return 3*int64(len(name)) + 512 }

// observe notes a member's report: n requests over elapsed. A report
// without elapsed time (Envoy's first, for a new bucket) counts its
// requests over the member's interval.
func (b *bucket) observe(mb *member, n uint64, elapsed time.Duration, now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if elapsed > 0 {
		mb.interval = min(max(elapsed, 100*time.Millisecond), 10*time.Minute)
	}
	over := max(elapsed, mb.interval).Seconds()
	d := min(float64(n)/over, 1e9)
	// A change within counting noise (two standard deviations of a Poisson
	// count) is smoothed, so an idle Envoy's odd request does not move its
	// share; a larger one is taken at once, so a share follows a real shift
	// within a report.
	if noise := 2 * math.Sqrt(max(float64(n), 1)) / over; mb.seen && math.Abs(d-mb.demand) <= noise {
		d = (d + mb.demand) / 2
	}
	mb.demand, mb.seen = d, true
}

// ttl is a member's assignment TTL: half a report interval beyond the next
// report, so one late report does not end it.
func (mb *member) ttl() time.Duration { return max(mb.interval*3/2, 500*time.Millisecond) }

// rebalance divides the bucket again after reporter's report: the rule's
// rate shared among the members by what they use (divide), each grant whose
// share moved replaced (those that shrink first, so their capacity is given
// back before it is handed out), the reporter's grant renewed otherwise, and
// the new assignments pushed to their streams.
func (b *bucket) rebalance(ctx context.Context, now int64, reporter *member) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.members[reporter]; !ok {
		return
	}
	if reporter.g.kind != none && time.Duration(now-reporter.answered) < minGap {
		return
	}
	reporter.answered = now
	st, ok := b.peek(ctx)
	if !ok {
		return // the store failed: grants lapse into Envoy's own fallback
	}
	if k, open := blanketKind(st); open {
		for mb := range b.members {
			if mb == reporter || mb.g.kind != k {
				b.set(mb, now, grant{kind: k, strategy: blanket(k == allowAll)})
			}
		}
		return
	}
	rate := float64(st.Limit.Rate) / st.Limit.Period.Seconds()
	// Grants are paid ahead, and each replacement hands out a burst and
	// pays the old grant's fill while the new one is on its way: the part
	// of the rate kept back pays for that, so the store's level recovers
	// instead of running down until it refuses.
	rate *= 1 - keptBack
	members := make([]*member, 0, len(b.members))
	claims := make([]float64, 0, len(b.members))
	for mb := range b.members {
		members = append(members, mb)
	}
	floor := rate / float64(4*len(members))
	for _, mb := range members {
		claims = append(claims, max(mb.demand*headroom, floor))
	}
	held := b.departedRate(now)
	shares := divide(b.portion(ctx, now, max(0, rate-held), claims), claims)
	// Those that shrink first, on anyone's report, so that what they give
	// back can be handed out; then the reporter, which grows within what
	// the others fill at now (a member the hysteresis left alone keeps its
	// rate, so the shares alone do not bound the sum). A member grows at
	// its own reports only: growing it on every report as the others
	// shrink one by one would hand it a burst each time.
	mine, shrunk := -1, false
	for i, mb := range members {
		if mb == reporter {
			mine = i
			continue
		}
		if mb.g.kind == tokens && shares[i] < mb.target && (now >= mb.expires || b.worthMoving(mb, shares[i])) {
			b.regrant(ctx, now, mb, shares[i])
			shrunk = true
		}
	}
	sum := held
	for _, o := range members {
		sum += o.g.filling()
	}
	grow := func(mb *member, share float64) float64 {
		return min(share, max(0, rate-(sum-mb.g.filling())))
	}
	mb := reporter
	switch give := grow(mb, shares[mine]); {
	case mb.g.kind == tokens && shares[mine] < mb.target && b.worthMoving(mb, shares[mine]):
		was := mb.g.filling()
		b.regrant(ctx, now, mb, shares[mine])
		sum += mb.g.filling() - was
		shrunk = true
	case mb.g.kind != tokens || now >= mb.expires || b.worthMoving(mb, give):
		was := mb.g.filling()
		b.regrant(ctx, now, mb, give)
		sum += mb.g.filling() - was
	default:
		b.renew(ctx, now, mb)
	}
	if !shrunk {
		return
	}
	// What the shrunk gave back goes at once to members held well below
	// their share (by half or more), not waiting for their reports.
	for i, o := range members {
		if o == reporter || o.g.kind != tokens {
			continue
		}
		if give := grow(o, shares[i]); give > starved*o.target && b.worthMoving(o, give) {
			was := o.g.filling()
			b.regrant(ctx, now, o, give)
			sum += o.g.filling() - was
		}
	}
}

// portion is this process's part of total, the bucket's rate: all of it
// alone, or with a Fleet what water-filling gives it among the processes'
// claims (each the sum of its streams' claims). The claims are exchanged
// at most every claimEvery; a process's claim lives claimLife, so one that
// died is forgotten within it.
func (b *bucket) portion(ctx context.Context, now int64, total float64, claims []float64) float64 {
	f := b.s.o.Fleet
	if f == nil {
		return total
	}
	mine := 0.0
	for _, c := range claims {
		mine += c
	}
	mine = min(mine, total)
	if b.claimedAt == 0 || time.Duration(now-b.claimedAt) >= claimEvery {
		others, err := f.Claims(ctx, b.name, b.s.id, mine, claimLife)
		if err != nil {
			b.s.lost.Add(1) // the last claims read stand
		} else {
			b.others, b.claimedAt = others, now
		}
	}
	if len(b.others) == 0 {
		return total
	}
	return divide(total, append([]float64{mine}, b.others...))[0]
}

// worthMoving reports whether mb's share moved enough to replace its grant:
// by more than the hysteresis, and by more tokens over a few report
// intervals than the replacement costs (a burst handed out full, and the
// old grant's fill while the new one is on its way).
func (b *bucket) worthMoving(mb *member, share float64) bool {
	moved := math.Abs(share - mb.target)
	cost := float64(mb.g.burst) + mb.g.rate*b.s.o.Grace.Seconds()
	return moved > hysteresis*max(share, mb.target) && moved*payback*mb.interval.Seconds() > cost
}

// departedRate is what the members that left may still fill at, forgetting
// the grants that have ended.
func (b *bucket) departedRate(now int64) float64 {
	held, kept := 0.0, b.gone[:0]
	for _, d := range b.gone {
		if d.until > now {
			held += d.rate
			kept = append(kept, d)
		}
	}
	clear(b.gone[len(kept):])
	b.gone = kept
	return held
}

// blanketKind is the blanket answer of a bucket whose rule counts nothing:
// no rule, an unlimited or shadow one (allow), a deny-all one (deny).
func blanketKind(st *engine.Status) (kind, bool) {
	def := st.RuleDef()
	switch {
	case st.Rule == "" || st.Unlimited || st.Shadow:
		return allowAll, true
	case def != nil && def.Envoy != nil && def.Envoy.Deny, st.Limit.Rate <= 0:
		return denyAll, true
	}
	return none, false
}

// regrant replaces mb's grant with a token bucket of rate share: what the
// old grant was paid for beyond its delivery is given back, the new one's
// burst and fill to its TTL are paid. When the store has less, the grant is
// what it has; with nothing, DENY_ALL until the next report.
func (b *bucket) regrant(ctx context.Context, now int64, mb *member, share float64) {
	ttl, grace := mb.ttl(), b.s.o.Grace
	refund := mb.g.unspent(now + int64(grace))
	burst := max(1, int64(share*mb.interval.Seconds()/10))
	for try := 0; try < 2 && share > 0; try++ {
		strat, fillRate := tokenStrategy(share, burst)
		paid, left, extra, ok := b.pay(ctx, float64(burst)+fillRate*(ttl+grace).Seconds()-refund)
		if !ok {
			return
		}
		if paid {
			b.set(mb, now, grant{kind: tokens, rate: fillRate, burst: burst, paidUntil: now + int64(ttl+grace), credit: extra, strategy: strat})
			mb.target = share
			return
		}
		b.s.unpaid.Add(1)
		if mb.g.kind == tokens && now < mb.expires {
			return // it keeps what it has, renewed as far as the store pays
		}
		share = (float64(left) + refund - float64(burst)) / (ttl + grace).Seconds() // what the store has
	}
	if _, _, _, ok := b.pay(ctx, -refund); !ok {
		return
	}
	b.set(mb, now, grant{kind: denyAll, strategy: blanket(false)})
	mb.target = 0
}

// renew extends mb's grant by a TTL from now, paying its fill to there; an
// identical strategy tells Envoy to keep its bucket and extend the TTL.
// When the store has less, the TTL is as long as what it has pays for, and
// the grant lapses into Envoy's own fallback when it has nothing: a store
// running short shortens grants rather than replacing them, which would
// hand out bursts.
func (b *bucket) renew(ctx context.Context, now int64, mb *member) {
	grace := int64(b.s.o.Grace)
	until := now + int64(mb.ttl()) + grace
	owed := mb.g.owedTo(until)
	paid, left, extra, ok := b.pay(ctx, owed)
	if !ok {
		return
	}
	if !paid {
		b.s.unpaid.Add(1)
		if left < 1 || mb.g.rate <= 0 {
			return
		}
		if paid, _, extra, ok = b.pay(ctx, float64(left)); !ok || !paid {
			return
		}
		owed = float64(left)
		until = mb.g.paidUntil + int64((owed+mb.g.credit)/mb.g.rate*1e9)
		extra = 0
	}
	if until-grace <= now {
		return
	}
	g := mb.g
	g.paidUntil, g.credit = until, extra
	b.setFor(mb, now, g, time.Duration(until-grace-now))
}

// set records mb's grant and pushes it to its stream with a TTL from now.
func (b *bucket) set(mb *member, now int64, g grant) { b.setFor(mb, now, g, mb.ttl()) }

func (b *bucket) setFor(mb *member, now int64, g grant, ttl time.Duration) {
	mb.g, mb.expires = g, now+int64(ttl)
	mb.c.push(mb, &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: mb.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl),
				RateLimitStrategy:    g.strategy,
			},
		},
	})
}

// peek reads the bucket's rule and limit without taking anything; ok is
// false when the store failed.
func (b *bucket) peek(ctx context.Context) (*engine.Status, bool) {
	b.descs[0] = engine.Descriptor{Entries: b.entries, HitsSet: true}
	if err := b.s.o.Engine.CheckDescriptors(ctx, b.domain, b.descs[:], &b.res); err != nil || len(b.res.Statuses) != 1 {
		b.s.lost.Add(1)
		return nil, false
	}
	st := &b.res.Statuses[0]
	if st.FailedOpen || st.FailedClosed {
		b.s.lost.Add(1)
		return nil, false
	}
	return st, true
}

// pay takes amount from the bucket's rule in the store, in whole units
// rounded up (a refund when below 0, in whole units rounded down): paid
// reports whether it was taken, left what the key had when it was not,
// extra what was moved beyond amount (the grant's credit). ok is false when
// the store failed.
func (b *bucket) pay(ctx context.Context, amount float64) (paid bool, left int64, extra float64, ok bool) {
	d := engine.Descriptor{Entries: b.entries}
	moved := 0.0
	switch {
	case amount > 0:
		d.Hits, _ = whole(amount)
		moved = float64(d.Hits)
	case amount <= -1:
		d.Hits, d.Negative = int64(min(math.Floor(-amount), 1<<50)), true
		moved = -float64(d.Hits)
	default:
		return true, 0, -amount, true
	}
	b.descs[0] = d
	if err := b.s.o.Engine.CheckDescriptors(ctx, b.domain, b.descs[:], &b.res); err != nil || len(b.res.Statuses) != 1 {
		b.s.lost.Add(1)
		return false, 0, 0, false
	}
	st := &b.res.Statuses[0]
	if st.FailedOpen || st.FailedClosed {
		b.s.lost.Add(1)
		return false, 0, 0, false
	}
	return st.Allowed, max(st.Remaining, 0), moved - amount, true
}
