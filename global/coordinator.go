package global

import (
	"slices"
	"sort"
	"time"

	"github.com/sluice-rl/sluice/algo"
)

// Options are a global limit's settings.
type Options struct {
	// Period is how often a region exchanges with the coordinator (default
	// 1 s); a region short of share, or one that gave some up, exchanges
	// sooner, a quarter period at the least.
	Period time.Duration
	// LeaseFor is how long a share above a region's own lasts without a
	// new exchange (default 3 s).
	LeaseFor time.Duration
	// Borrow lets the regions' shares add up to Whole+Borrow (thousandths):
	// at most (1+Borrow/Whole) times the limit in all. Default 0.
	Borrow int64
	// Own gives each region its own share (thousandths): what it holds of
	// a key no exchange has moved, and falls back to. They add up to at
	// most Whole.
	Own map[string]int64
}

// WithDefaults fills the defaults in.
func (o Options) WithDefaults() Options {
	if o.Period <= 0 {
		o.Period = time.Second
	}
	if o.LeaseFor <= 0 {
		o.LeaseFor = 3 * time.Second
	}
	return o
}

// Capacity is what the shares may add up to.
func (o Options) Capacity() int64 { return algo.Whole + max(o.Borrow, 0) }

// Ask is one key of a region's exchange: the share it holds now (after any
// release), and the share it would use (its demand with headroom).
type Ask struct {
	Key  string
	Held int64
	Want int64
}

// Grant is the coordinator's answer for one key: the share to hold, until
// LeaseFor after the exchange was sent when it is above the region's own;
// Wanted says that other regions want more than they hold, so that a
// region with more than it needs gives the rest up even below its own.
type Grant struct {
	Key    string
	Share  int64
	Wanted bool
}

// KeyAllocation is the coordinator's state of one key: each region's
// account. It is what the home store keeps.
type KeyAllocation struct {
	Regions map[string]*RegionAccount `json:"r"`
}

// RegionAccount is what the coordinator knows of one region for one key,
// times on the coordinator's clock (ns).
type RegionAccount struct {
	Held         int64 `json:"h"`            // declared at the last exchange
	HeldUntil    int64 `json:"hu,omitempty"` // when that share, if above Own, ends at the latest
	Granted      int64 `json:"g"`            // answered at the last exchange
	GrantedUntil int64 `json:"gu,omitempty"`
	Want         int64 `json:"w"`
	Seen         int64 `json:"s"` // the last exchange
}

// may is the most a share v, above own until until, can be at now.
func may(v, until, own, now int64) int64 {
	if v > own && (until == 0 || now >= until) {
		return own
	}
	return v
}

// holding is the most region r may be holding of the key at now.
func (o *Options) holding(a *KeyAllocation, r string, now int64) int64 {
	own := o.Own[r]
	acc := a.Regions[r]
	if acc == nil {
		return own
	}
	return max(may(acc.Held, acc.HeldUntil, own, now), may(acc.Granted, acc.GrantedUntil, own, now))
}

// Exchange is the coordinator's side of one region's exchange for one key
// at now (the home store's clock): it records what the region declares and
// grants it a share, never more than what no region may be holding.
func (o *Options) Exchange(a *KeyAllocation, region string, ask Ask, now int64) Grant {
	if a.Regions == nil {
		a.Regions = map[string]*RegionAccount{}
	}
	acc := a.Regions[region]
	if acc == nil {
		acc = &RegionAccount{}
		a.Regions[region] = acc
	}
	own := o.Own[region]
	// What it declares it holds: a share above its own comes from a grant,
	// whose lease ends by the last one answered (the region applies no
	// answer once it has sent a new request).
	acc.Held, acc.HeldUntil = ask.Held, 0
	if ask.Held > own {
		acc.HeldUntil = acc.GrantedUntil
		if acc.HeldUntil == 0 || acc.HeldUntil < now-int64(o.LeaseFor) {
			// A lease this state does not know (it was forgotten): it was
			// granted at most LeaseFor ago, so it ends within LeaseFor.
			acc.HeldUntil = now + int64(o.LeaseFor)
		}
	}
	acc.Granted, acc.GrantedUntil = acc.Held, acc.HeldUntil
	acc.Want, acc.Seen = min(max(ask.Want, 0), o.Capacity()), now

	targets := o.targets(a, now)
	held := int64(0)
	for r := range o.regionsOf(a) {
		held += o.holding(a, r, now)
	}
	free := o.Capacity() - held
	mine := o.holding(a, region, now)
	g := min(targets[region], mine+max(free, 0))
	g = max(g, 0)
	acc.Granted, acc.GrantedUntil = g, 0
	if g > own {
		acc.GrantedUntil = now + int64(o.LeaseFor)
	}
	return Grant{Key: ask.Key, Share: g, Wanted: o.wanted(a, targets, region, now)}
}

// Wanted reports whether regions other than region want more of the key
// than they may hold now: a region that holds some it does not use should
// give it up, even below its own share.
func (o *Options) Wanted(a *KeyAllocation, region string, now int64) bool {
	return o.wanted(a, o.targets(a, now), region, now)
}

func (o *Options) wanted(a *KeyAllocation, targets map[string]int64, region string, now int64) bool {
	for r, t := range targets {
		if r != region && t > o.holding(a, r, now) {
			return true
		}
	}
	return false
}

// WantedByAny reports whether some region wants more of the key than it
// may hold now.
func (o *Options) WantedByAny(a *KeyAllocation, now int64) bool {
	for r, t := range o.targets(a, now) {
		if t > o.holding(a, r, now) {
			return true
		}
	}
	return false
}

// AtRest reports whether the key's accounts say no more than a key never
// seen: every region may hold its own share and no more or less, and none
// wants any. The home may then forget them.
func (o *Options) AtRest(a *KeyAllocation, now int64) bool {
	for r, acc := range a.Regions {
		own := o.Own[r]
		if may(acc.Held, acc.HeldUntil, own, now) != own || may(acc.Granted, acc.GrantedUntil, own, now) != own {
			return false
		}
		if acc.Want > 0 && now-acc.Seen <= o.stale() {
			return false
		}
	}
	return true
}

// regionsOf is every region the rule names or the key's state knows.
func (o *Options) regionsOf(a *KeyAllocation) map[string]bool {
	out := map[string]bool{}
	for r := range o.Own {
		out[r] = true
	}
	for r := range a.Regions {
		out[r] = true
	}
	return out
}

// stale is how long a region's want counts without an exchange: a region
// that stops exchanging (cut off, or idle) is taken to want nothing.
func (o *Options) stale() int64 { return int64(o.LeaseFor + o.Period) }

// targets shares the capacity out by what each region wants: max-min fair
// when the wants exceed it; otherwise each gets its want, a region keeps
// what it holds beyond its want while nobody else wants it (a lull in its
// traffic does not hand its share to regions that ask for nothing), and
// what is left goes first to the regions below their own shares, up to
// them, then to all by their own shares, so that an idle region holds its
// own share for the next request it gets, and a key nobody uses comes back
// to rest (AtRest).
func (o *Options) targets(a *KeyAllocation, now int64) map[string]int64 {
	regions := o.regionsOf(a)
	names := make([]string, 0, len(regions))
	for r := range regions {
		names = append(names, r)
	}
	slices.Sort(names) // the same answer for the same state
	want := map[string]int64{}
	total := int64(0)
	for _, r := range names {
		if acc := a.Regions[r]; acc != nil && now-acc.Seen <= o.stale() {
			want[r] = acc.Want
		}
		total += want[r]
	}
	capacity := o.Capacity()
	out := map[string]int64{}
	if total <= capacity {
		slack := capacity - total
		for _, r := range names {
			out[r] = want[r]
			keep := min(max(o.holding(a, r, now)-want[r], 0), slack)
			out[r] += keep
			slack -= keep
		}
		for _, r := range names { // first back to the own shares given up
			back := min(max(o.Own[r]-out[r], 0), slack)
			out[r] += back
			slack -= back
		}
		ownTotal := int64(0)
		for _, r := range names {
			ownTotal += o.Own[r]
		}
		left := slack
		for _, r := range names {
			if ownTotal > 0 {
				out[r] += left * o.Own[r] / ownTotal
			}
		}
		return out
	}
	// Max-min: the smallest wants are met whole, the rest share equally.
	sort.SliceStable(names, func(i, j int) bool { return want[names[i]] < want[names[j]] })
	left, n := capacity, int64(len(names))
	for _, r := range names {
		fair := left / n
		out[r] = min(want[r], fair)
		left -= out[r]
		n--
	}
	return out
}

// Want is the share a region would use for a demand of asked units a
// second, against a limit of rate units a second: the demand with a
// quarter of headroom and one thousandth more, at most the capacity.
func Want(asked, rate float64, capacity int64) int64 {
	if rate <= 0 || asked <= 0 {
		return 0
	}
	w := asked/rate*algo.Whole*1.25 + 1
	return min(int64(w), capacity)
}
