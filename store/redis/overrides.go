package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/overrides"
)

// Overrides keeps the operators' overrides (package overrides) in Redis,
// where every process on the store reads them, in three keys of one hash
// slot:
//
//	{sluice-overrides}:set      hash: id -> "<version>|<JSON of the override>"
//	{sluice-overrides}:expiry   sorted set: id scored by its expiry (ms; +inf: until removed)
//	{sluice-overrides}:version  the version of the set, counted from the time
//	                            of its first change in ms x 1,000
//
// The version starts from the time, not from 0, so that a Redis that lost
// its data (restarted without persistence, flushed) never hands out a
// version a follower already has for other contents. A change is one
// script: it drops what has expired, compares the
// override's version, writes, counts the change and publishes on the
// channel sluice-overrides, which every follower subscribes to (and it
// re-reads on its own besides, so that a lost message heals). On Redis
// Cluster the keys share a slot and the message reaches every node's
// subscribers.
//
// A change never lands after its caller gave up on it. A command sent to
// a Redis that hangs is not lost: it waits in the connection and runs when
// Redis wakes, long after the caller answered "nothing changed". So a
// change first reads Redis's clock (on the node holding the keys) and
// sends, with the script, its caller's deadline on that clock; the script
// refuses to run past it. The deadline is computed from what is left of
// the caller's wait after the clock's answer came back, so it falls no
// later, on Redis's clock, than the caller's own. The caller then waits
// changeGrace beyond its deadline for the answer of a script that ran in
// time; only an answer lost beyond that leaves the outcome unknown. A
// store that sends its own clock (Options.Clock) sends no deadline: a
// change it sent and heard nothing of is unknown.
type Overrides struct {
	s                    *Store
	set, expiry, version string
	channel              string
}

// Overrides returns the overrides kept in s's Redis.
func (s *Store) Overrides() *Overrides {
	p := s.prefix + "{sluice-overrides}:"
	return &Overrides{s: s, set: p + "set", expiry: p + "expiry", version: p + "version", channel: s.prefix + "sluice-overrides"}
}

var (
	overridesLoad = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[3]) or '0'
return {v, redis.call('HGETALL', KEYS[1])}
`)
	// overridesTime is Redis's clock (µs) on the node that holds the
	// overrides: a cluster's nodes each have their own.
	overridesTime = rueidis.NewLuaScript(`
local t = redis.call('TIME')
return tonumber(t[1]) * 1000000 + tonumber(t[2])
`)
	// ARGV: now (ms), id, ifVersion (-1 any, -2 any but one, 0 absent), JSON, expiry (ms
	// or "+inf"), max, channel, deadline (µs on Redis's clock; 0 none).
	// A reply {err, before} or {"", version, before}.
	overridesPut = rueidis.NewLuaScript(lateCheck(8) + `
local now = tonumber(ARGV[1])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
local before = redis.call('HGET', KEYS[1], ARGV[2])
local want = tonumber(ARGV[3])
if want == -2 and not before then return {'version', ''} end
if want >= 0 then
  local have = 0
  if before then have = tonumber(string.match(before, '^(%d+)|')) end
  if have ~= want then return {'version', before or ''} end
end
if not before and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[6]) then return {'full', ''} end
if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('SET', KEYS[3], ARGV[1] .. '000') end
local v = string.format('%.0f', redis.call('INCR', KEYS[3]))
redis.call('HSET', KEYS[1], ARGV[2], v .. '|' .. ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
redis.call('PUBLISH', ARGV[7], v)
return {'', v, before or ''}
`)
	// ARGV: now (ms), id, ifVersion, channel, deadline.
	overridesDelete = rueidis.NewLuaScript(lateCheck(5) + `
local now = tonumber(ARGV[1])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
local before = redis.call('HGET', KEYS[1], ARGV[2])
if not before then return {'absent', ''} end
local want = tonumber(ARGV[3])
if want >= 0 and tonumber(string.match(before, '^(%d+)|')) ~= want then return {'version', before} end
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('SET', KEYS[3], ARGV[1] .. '000') end
local v = string.format('%.0f', redis.call('INCR', KEYS[3]))
redis.call('PUBLISH', ARGV[4], v)
return {'', v, before}
`)
)

// lateCheck is a change script's first lines: past the deadline in
// ARGV[arg], it changes nothing and answers "late".
func lateCheck(arg int) string {
	return fmt.Sprintf(`
local by = tonumber(ARGV[%d])
if by > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) > by then return {'late', ''} end
end`, arg)
}

// afterClock, set only by tests, runs between the clock's answer and the
// change: where a Redis that hangs there is the case the deadline covers.
var afterClock func()

// changeGrace is how long past its caller's deadline a change waits for
// the answer of a script that ran in time.
const changeGrace = time.Second

// change runs a change script under ctx's deadline (see Overrides) and
// returns its reply; an error means nothing changed, except
// ErrOutcomeUnknown.
func (o *Overrides) change(ctx context.Context, script *rueidis.Lua, args []string) ([]string, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	keys := []string{o.set, o.expiry, o.version}
	by, wait := "0", ctx
	// A store that sends its own clock may be on a server that refuses TIME
	// in scripts: its changes carry no deadline, and a change whose answer
	// does not come is said unknown.
	if deadline, bounded := ctx.Deadline(); bounded && o.s.clock == nil {
		now, err := overridesTime.Exec(ctx, c, keys[2:], nil).AsInt64()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", overrides.ErrNotMade, err)
		}
		if afterClock != nil {
			afterClock()
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, overrides.ErrNotMade
		}
		by = strconv.FormatInt(now+left.Microseconds(), 10)
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(changeGrace))
		defer cancel()
	}
	r, err := script.Exec(wait, c, keys, append(args, by)).AsStrSlice()
	_, refused := rueidis.IsRedisErr(err)
	switch {
	case refused:
		return nil, err // refused by Redis: the script did not run
	case err != nil:
		return nil, fmt.Errorf("%w: %w", overrides.ErrOutcomeUnknown, err)
	case len(r) == 0:
		return nil, errors.New("redis: overrides: an empty reply")
	case r[0] == "late":
		return nil, overrides.ErrNotMade
	}
	return r, nil
}

func (o *Overrides) client() (rueidis.Client, error) {
	c := o.s.conn()
	if c == nil {
		return nil, o.s.notConnected()
	}
	return c, nil
}

// Load returns every override and the version of the set.
func (o *Overrides) Load(ctx context.Context) ([]*overrides.Override, int64, error) {
	c, err := o.client()
	if err != nil {
		return nil, 0, err
	}
	r, err := overridesLoad.Exec(ctx, c, []string{o.set, o.expiry, o.version}, nil).ToArray()
	if err != nil {
		return nil, 0, err
	}
	if len(r) != 2 {
		return nil, 0, fmt.Errorf("redis: overrides: a reply of %d parts", len(r))
	}
	vs, _ := r[0].ToString()
	version, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("redis: overrides: version %q", vs)
	}
	kv, err := r[1].AsStrMap()
	if err != nil {
		return nil, 0, err
	}
	list := make([]*overrides.Override, 0, len(kv))
	for id, v := range kv {
		ov, err := decodeOverride(v)
		if err != nil {
			return nil, 0, fmt.Errorf("redis: override %s: %w", id, err)
		}
		list = append(list, ov)
	}
	return list, version, nil
}

// Version returns the version of the set.
func (o *Overrides) Version(ctx context.Context) (int64, error) {
	c, err := o.client()
	if err != nil {
		return 0, err
	}
	v, err := c.Do(ctx, c.B().Get().Key(o.version).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return v, err
}

// Put writes ov if its version is ifVersion (-1: any; 0: absent), and
// not after ctx's deadline.
func (o *Overrides) Put(ctx context.Context, ov overrides.Override, ifVersion int64, now time.Time) (*overrides.Override, *overrides.Override, error) {
	ov.ID = overrides.IDOf(ov.Rule, ov.Key, ov.Prefix)
	ov.Updated, ov.Version = now.UTC(), 0
	body, err := json.Marshal(ov)
	if err != nil {
		return nil, nil, err
	}
	expiry := "+inf"
	if !ov.UntilRemoved {
		expiry = strconv.FormatInt(ov.Expires.UnixMilli(), 10)
	}
	r, err := o.change(ctx, overridesPut, []string{
		strconv.FormatInt(now.UnixMilli(), 10), ov.ID, strconv.FormatInt(ifVersion, 10), string(body), expiry,
		strconv.Itoa(overrides.MaxOverrides), o.channel,
	})
	if err != nil {
		return nil, nil, err
	}
	switch r[0] {
	case "version":
		return nil, nil, overrides.ErrVersion
	case "full":
		return nil, nil, overrides.ErrFull
	}
	ov.Version, _ = strconv.ParseInt(r[1], 10, 64)
	var before *overrides.Override
	if r[2] != "" {
		if before, err = decodeOverride(r[2]); err != nil {
			return nil, nil, err
		}
	}
	return &ov, before, nil
}

// Delete removes the override id if its version is ifVersion (-1: any),
// and not after ctx's deadline.
func (o *Overrides) Delete(ctx context.Context, id string, ifVersion int64, now time.Time) (*overrides.Override, error) {
	r, err := o.change(ctx, overridesDelete, []string{
		strconv.FormatInt(now.UnixMilli(), 10), id, strconv.FormatInt(ifVersion, 10), o.channel,
	})
	if err != nil {
		return nil, err
	}
	switch r[0] {
	case "absent":
		return nil, overrides.ErrNotFound
	case "version":
		return nil, overrides.ErrVersion
	}
	return decodeOverride(r[2])
}

// Changes calls changed for each change published, until ctx ends or the
// subscription fails (its error is returned; the follower subscribes
// again and re-reads).
func (o *Overrides) Changes(ctx context.Context, changed func()) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	err = c.Receive(ctx, c.B().Subscribe().Channel(o.channel).Build(), func(rueidis.PubSubMessage) { changed() })
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("redis: overrides: the subscription ended")
	}
	return err
}

// decodeOverride reads "<version>|<JSON>".
func decodeOverride(v string) (*overrides.Override, error) {
	vs, body, ok := strings.Cut(v, "|")
	if !ok {
		return nil, errors.New("no version")
	}
	var ov overrides.Override
	if err := json.Unmarshal([]byte(body), &ov); err != nil {
		return nil, err
	}
	var err error
	if ov.Version, err = strconv.ParseInt(vs, 10, 64); err != nil {
		return nil, err
	}
	return &ov, nil
}

var _ overrides.Store = (*Overrides)(nil)
