package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/global"
)

// A Redis that every region reaches can be the home of global rules: it
// keeps the coordinator's accounts and runs each region's exchange on them
// as one script (home.lua), atomic on the home's clock. The script makes
// global.Options.Exchange's decisions, the model it is tested against;
// run in one script, an exchange is one round trip between regions and no
// other region's exchange can interrupt it. Two exchanges deciding on the
// same accounts would each grant the same free share.
//
// Accounts that began less than a lease ago (a home restarted empty) grant
// no region more than it holds: a grant the home forgot ends within a
// lease. A rule's accounts lie in one hash and its wanted keys in one set,
// with the instant they began, all under the rule's hash tag, so one Redis Cluster slot holds them: a rule
// sees regions × 1/period exchanges a second, few enough for one node.

var homeScript = rueidis.NewLuaScript(luaFile("home"))

// MaxAsks bounds the keys of one exchange: the region's agent asks about
// the keys it used lately, and splits more into several exchanges.
const MaxAsks = 1000

// maxWanted bounds the keys an exchange names that other regions want.
const maxWanted = 100

// homeKeys names a rule's accounts and wanted keys.
func (s *Store) homeKeys(rule string) []string {
	tag := s.prefix + "{g:" + hashTag(rule) + "}"
	return []string{tag + "a", tag + "w", tag + "b", tag + "o"}
}

// Exchange runs a region's exchange of a global rule on this store, its
// home (global.Home): for each ask, global.Options.Exchange's decision on
// the key's accounts at this store's time, all in one atomic step. It
// answers a grant for each ask, in order, and names up to a hundred keys
// the region did not ask about that other regions want more of, for the
// region to give up what it does not use of them.
func (s *Store) Exchange(ctx context.Context, rule, region string, o *global.Options, asks []global.Ask) ([]global.Grant, []string, error) {
	if len(asks) > MaxAsks {
		return nil, nil, fmt.Errorf("redis: global exchange of %d keys, at most %d", len(asks), MaxAsks)
	}
	c := s.conn()
	if c == nil {
		return nil, nil, s.notConnected()
	}
	opts := o.WithDefaults()
	now := ""
	if s.clock != nil {
		now = itoa(s.clock.Now() / 1000)
	}
	// The accounts live while regions exchange: a lease ends within
	// LeaseFor, and a region's want counts for a lease and a period, so
	// state older than that says no more than a key never seen.
	ttl := 4 * (opts.LeaseFor + opts.Period).Milliseconds()
	args := make([]string, 0, 8+2*len(opts.Own)+3*len(asks))
	args = append(args, now, region, itoa(opts.Capacity()), itoa(opts.LeaseFor.Microseconds()), itoa(opts.Period.Microseconds()),
		itoa(ttl), itoa(maxWanted), strconv.Itoa(len(opts.Own)))
	names := make([]string, 0, len(opts.Own))
	for name := range opts.Own {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		args = append(args, name, itoa(opts.Own[name]))
	}
	for _, a := range asks {
		args = append(args, a.Key, itoa(a.Held), itoa(a.Want))
	}
	v, err := homeScript.Exec(ctx, c, s.homeKeys(rule), args).ToArray()
	if err == nil && len(v) != 2 {
		err = errors.New("home.lua answered an unexpected shape")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("redis: global exchange: %w", err)
	}
	gs, err := v[0].ToArray()
	if err != nil || len(gs) != len(asks) {
		return nil, nil, fmt.Errorf("redis: global exchange: %d grants for %d asks (%v)", len(gs), len(asks), err)
	}
	grants := make([]global.Grant, len(asks))
	for i, g := range gs {
		pair, err := g.AsIntSlice()
		if err != nil || len(pair) != 2 {
			return nil, nil, fmt.Errorf("redis: global exchange: grant %d: unexpected shape (%v)", i, err)
		}
		grants[i] = global.Grant{Key: asks[i].Key, Share: pair[0], Wanted: pair[1] == 1}
	}
	wanted, err := v[1].AsStrSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("redis: global exchange: %w", err)
	}
	return grants, wanted, nil
}
