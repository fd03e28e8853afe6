package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/global"
)

// A Redis that every region reaches can be the home of global rules: it
// keeps the coordinator's accounts (global.KeyAllocation) and runs each
// region's exchange on them. The decisions are global's own, in Go; the
// store makes each exchange one atomic step on its own clock: it watches
// the rule's accounts, reads TIME, decides, and writes in MULTI/EXEC,
// starting again if another region's exchange wrote in between. Two
// exchanges deciding on the same accounts would each grant the same free
// share.
//
// A rule's accounts lie in one hash and its wanted keys in one set, both
// under the rule's hash tag, so one Redis Cluster slot holds them: a rule
// sees regions × 1/period exchanges a second, few enough for one node.

// MaxAsks bounds the keys of one exchange: the region's agent asks about
// the keys it used lately, and splits more into several exchanges.
const MaxAsks = 1000

// maxWanted bounds the keys an exchange names that other regions want.
const maxWanted = 100

// exchangeTries bounds the starts of one exchange that other regions'
// exchanges keep interrupting.
const exchangeTries = 32

// ErrContended is the error of an exchange that other regions' exchanges
// interrupted exchangeTries times: the region keeps what it holds, and its
// leases end on their own.
var ErrContended = errors.New("redis: global exchange interrupted by others too often")

// homeKeys names a rule's accounts and wanted keys.
func (s *Store) homeKeys(rule string) (accounts, wanted string) {
	tag := s.prefix + "{g:" + hashTag(rule) + "}"
	return tag + "a", tag + "w"
}

// Exchange runs a region's exchange of a global rule on this store, its
// home: for each ask, global.Options.Exchange on the key's accounts at
// this store's time, all in one atomic step. It answers a grant for each
// ask, in order, and names up to a hundred keys the region did not ask
// about that other regions want more of, for the region to give up what
// it does not use of them.
func (s *Store) Exchange(ctx context.Context, rule, region string, o *global.Options, asks []global.Ask) ([]global.Grant, []string, error) {
	if len(asks) > MaxAsks {
		return nil, nil, fmt.Errorf("redis: global exchange of %d keys, at most %d", len(asks), MaxAsks)
	}
	c := s.conn()
	if c == nil {
		return nil, nil, s.notConnected()
	}
	opts := o.WithDefaults()
	o = &opts
	accounts, wantedKey := s.homeKeys(rule)
	var grants []global.Grant
	var wanted []string
	err := c.Dedicated(func(d rueidis.DedicatedClient) error {
		for try := range exchangeTries {
			var done bool
			var err error
			grants, wanted, done, err = s.exchangeOnce(ctx, d, accounts, wantedKey, region, o, asks)
			if err != nil || done {
				return err
			}
			// Interrupted: wait a random while, longer each time, so that
			// regions starting together do not interrupt each other again.
			wait := time.Duration(rand.Int64N(int64(time.Millisecond) << min(try, 7)))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
		return ErrContended
	})
	if err != nil {
		if !errors.Is(err, ErrContended) {
			err = fmt.Errorf("redis: global exchange: %w", err)
		}
		return nil, nil, err
	}
	return grants, wanted, nil
}

// exchangeOnce is one try: done is false when another exchange wrote the
// rule's accounts after this one read them.
func (s *Store) exchangeOnce(ctx context.Context, d rueidis.DedicatedClient, accounts, wantedKey, region string, o *global.Options, asks []global.Ask) (grants []global.Grant, wanted []string, done bool, err error) {
	if err := d.Do(ctx, d.B().Watch().Key(accounts, wantedKey).Build()).Error(); err != nil {
		return nil, nil, false, err
	}
	now, err := s.homeNow(ctx, d)
	if err != nil {
		return nil, nil, false, err
	}
	fields := make([]string, len(asks))
	for i, a := range asks {
		fields[i] = a.Key
	}
	allocs, err := readAllocations(ctx, d, accounts, fields)
	if err != nil {
		return nil, nil, false, err
	}
	grants = make([]global.Grant, len(asks))
	writes := make(rueidis.Commands, 0, 2*len(asks)+4)
	writes = append(writes, d.B().Multi().Build())
	asked := make(map[string]bool, len(asks))
	for i, a := range asks {
		asked[a.Key] = true
		grants[i] = o.Exchange(&allocs[i], region, a, now)
		if o.AtRest(&allocs[i], now) {
			writes = append(writes,
				d.B().Hdel().Key(accounts).Field(a.Key).Build(),
				d.B().Srem().Key(wantedKey).Member(a.Key).Build())
			continue
		}
		b, err := json.Marshal(&allocs[i])
		if err != nil {
			return nil, nil, false, err
		}
		writes = append(writes, d.B().Hset().Key(accounts).FieldValue().FieldValue(a.Key, string(b)).Build())
		if o.WantedByAny(&allocs[i], now) {
			writes = append(writes, d.B().Sadd().Key(wantedKey).Member(a.Key).Build())
		} else {
			writes = append(writes, d.B().Srem().Key(wantedKey).Member(a.Key).Build())
		}
	}
	wanted, err = s.wantedElsewhere(ctx, d, accounts, wantedKey, region, o, asked, now)
	if err != nil {
		return nil, nil, false, err
	}
	// The accounts live while regions exchange: a lease ends within
	// LeaseFor, and a region's want counts for a lease and a period, so
	// state older than that says no more than a key never seen.
	ttl := 4 * (o.LeaseFor + o.Period).Milliseconds()
	writes = append(writes,
		d.B().Pexpire().Key(accounts).Milliseconds(ttl).Build(),
		d.B().Pexpire().Key(wantedKey).Milliseconds(ttl).Build(),
		d.B().Exec().Build())
	resps := d.DoMulti(ctx, writes...)
	exec := resps[len(resps)-1]
	if err := exec.Error(); err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, nil, false, nil // another exchange wrote first
		}
		return nil, nil, false, err
	}
	for _, r := range resps[:len(resps)-1] {
		if err := r.Error(); err != nil {
			return nil, nil, false, err
		}
	}
	return grants, wanted, true, nil
}

// homeNow is the home store's time, in nanoseconds: TIME, or the store's
// Clock.
func (s *Store) homeNow(ctx context.Context, d rueidis.DedicatedClient) (int64, error) {
	if s.clock != nil {
		return s.clock.Now(), nil
	}
	t, err := d.Do(ctx, d.B().Time().Build()).AsStrSlice()
	if err != nil {
		return 0, err
	}
	if len(t) != 2 {
		return 0, fmt.Errorf("TIME answered %d fields", len(t))
	}
	sec, err1 := strconv.ParseInt(t[0], 10, 64)
	usec, err2 := strconv.ParseInt(t[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return sec*1e9 + usec*1e3, nil
}

// readAllocations reads the accounts of fields; a key never seen, or whose
// accounts do not decode, starts empty (every region at its own share).
func readAllocations(ctx context.Context, d rueidis.DedicatedClient, accounts string, fields []string) ([]global.KeyAllocation, error) {
	allocs := make([]global.KeyAllocation, len(fields))
	if len(fields) == 0 {
		return allocs, nil
	}
	vals, err := d.Do(ctx, d.B().Hmget().Key(accounts).Field(fields...).Build()).ToArray()
	if err != nil {
		return nil, err
	}
	for i, v := range vals {
		if i >= len(allocs) {
			break
		}
		if b, err := v.ToString(); err == nil {
			// A value that does not decode is dropped, not trusted: the
			// accounts then say what a fresh key does, and leases the home
			// forgot are counted as running (global.Options.Exchange).
			_ = json.Unmarshal([]byte(b), &allocs[i])
		}
	}
	return allocs, nil
}

// wantedElsewhere names keys of the wanted set, other than asked, that
// regions other than region want more of.
func (s *Store) wantedElsewhere(ctx context.Context, d rueidis.DedicatedClient, accounts, wantedKey, region string, o *global.Options, asked map[string]bool, now int64) ([]string, error) {
	members, err := d.Do(ctx, d.B().Srandmember().Key(wantedKey).Count(maxWanted).Build()).AsStrSlice()
	if err != nil || len(members) == 0 {
		return nil, err
	}
	var keys []string
	for _, m := range members {
		if !asked[m] {
			keys = append(keys, m)
		}
	}
	allocs, err := readAllocations(ctx, d, accounts, keys)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, k := range keys {
		if o.Wanted(&allocs[i], region, now) {
			out = append(out, k)
		}
	}
	return out, nil
}
