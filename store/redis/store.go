package redis

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaAlgorithms names each algorithm's file and the prefix of its functions.
var luaAlgorithms = []struct {
	name, file, fn string
}{
	{"gcra", "gcra", "gcra"},
	{"token-bucket", "token_bucket", "tb"},
	{"leaky-meter", "leaky_meter", "lm"},
	{"leaky-queue", "leaky_queue", "lq"},
	{"fixed-window", "fixed_window", "fw"},
	{"sliding-window", "sliding_window", "sw"},
	{"sliding-log", "sliding_log", "sl"},
	{"portion", "portion", "por"},
}

func luaFile(name string) string {
	src, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err) // the files are embedded: this cannot happen at run time
	}
	return string(src)
}

// takeScript joins the helpers, the given algorithms (all when algs is
// empty) and the driver into one script. A script per algorithm keeps each
// call from defining the functions of the six it does not use.
func takeScript(algs ...string) string {
	var b, table strings.Builder
	b.WriteString(luaFile("lib"))
	for _, a := range luaAlgorithms {
		if len(algs) > 0 && !slices.Contains(algs, a.name) {
			continue
		}
		b.WriteString(luaFile(a.file))
		fmt.Fprintf(&table, "  [%q] = {%s_decide, %s_write, %s_refund, %s_charge, %s_carry},\n", a.name, a.fn, a.fn, a.fn, a.fn, a.fn)
	}
	b.WriteString(strings.Replace(luaFile("take"), "--ALGOS--\n", table.String(), 1))
	return b.String()
}

// Options configure a Store.
type Options struct {
	// URL is redis://[user:pass@]host:port/db, rediss://... (TLS),
	// redis-cluster://h1:p1,h2:p2 or redis-sentinel://master@h1:p1,h2:p2.
	URL string
	// Prefix is put in front of every key (default none: the keys start
	// with their hash tag, "{").
	Prefix string
	// Clock, if set, is sent as the time of every decision instead of the
	// server's TIME.
	Clock sluice.Clock
	// Lazy makes New succeed when Redis cannot be reached yet: the store
	// keeps trying to connect in the background (every RetryEvery, default
	// 500ms), and until then every Take fails with ErrNotConnected, which
	// the engine answers by each rule's fail mode. A gateway can so start,
	// and serve degraded, while its Redis is down.
	Lazy       bool
	RetryEvery time.Duration
}

// ErrNotConnected is the error of a lazy store that has not reached Redis
// yet.
var ErrNotConnected = errors.New("redis: not connected yet")

// Store is the Redis store. It implements sluice.Store.
type Store struct {
	client   atomic.Pointer[rueidis.Client] // nil until connected
	prefix   string
	clock    sluice.Clock
	scripts  map[string]*rueidis.Lua // by algorithm; "" has them all
	batchers map[string]*batcher     // by algorithm, as scripts (batch.go)
	batched  atomic.Uint64           // calls that waited for a batch
	limits   limitCache              // what each limit sends (limits.go)
	sources  map[string]string       // their texts, for Preload
	members  *rueidis.Lua
	lastErr  atomic.Pointer[error] // why a lazy store is not connected

	slots     atomic.Pointer[slotMap] // Redis Cluster: which node serves which slot
	loaded    atomic.Bool             // scripts loaded on every node
	scripted  sync.Map                // Redis Cluster: masters the scripts were loaded on since, by address
	scripting atomic.Bool             // scriptNewMasters runs
	stop      chan struct{}
	nudge     chan struct{} // a call failed: read the slot map again soon
	stopOnce  sync.Once
	done      chan struct{}
}

// New connects to the Redis (or Redis Cluster, or Sentinel) of o.URL.
func New(o Options) (*Store, error) {
	opt, err := ParseURL(o.URL)
	if err != nil {
		return nil, err
	}
	prefix := o.Prefix
	sources := map[string]string{"": takeScript()}
	for _, a := range luaAlgorithms {
		sources[a.name] = takeScript(a.name)
	}
	scripts, batchers := map[string]*rueidis.Lua{}, map[string]*batcher{}
	for name, src := range sources {
		scripts[name], batchers[name] = rueidis.NewLuaScript(src), &batcher{}
	}
	s := &Store{prefix: prefix, clock: o.Clock, scripts: scripts, batchers: batchers, sources: sources,
		members: rueidis.NewLuaScript(luaFile("members")), stop: make(chan struct{}), done: make(chan struct{}), nudge: make(chan struct{}, 1)}
	retry := o.RetryEvery
	if retry <= 0 {
		retry = 500 * time.Millisecond
	}
	if !o.Lazy {
		client, err := rueidis.NewClient(opt)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		s.client.Store(&client)
	}
	first := make(chan struct{}) // closed after the first attempt to connect
	go s.maintain(opt, retry, first)
	// A lazy store connects in the background. A Redis that accepts
	// connections but never answers (hung) holds the client's set-up for
	// seconds: start-up waits a second at most for it.
	select {
	case <-first:
	case <-time.After(time.Second):
	}
	return s, nil
}

// refreshMin spaces readings of a cluster's slot map.
const refreshMin = 100 * time.Millisecond

// maintain connects a lazy store and keeps a cluster's slot map fresh.
func (s *Store) maintain(opt rueidis.ClientOption, retry time.Duration, first chan struct{}) {
	defer close(s.done)
	t := time.NewTicker(retry)
	defer t.Stop()
	refreshed := time.Time{}
	for {
		if s.client.Load() == nil {
			if c, err := rueidis.NewClient(opt); err == nil {
				s.client.Store(&c)
			} else {
				err = fmt.Errorf("redis: %w", err)
				s.lastErr.Store(&err)
			}
		}
		if first != nil {
			close(first)
			first = nil
		}
		// The slot map names the node of each key for the engine's per-node
		// breakers: after a failover it must name the promoted replica soon,
		// or the moved slots stay behind the dead master's open breaker. It
		// is read at every tick (RetryEvery, 500 ms), and sooner (at most
		// every 100 ms) when a call fails.
		if c := s.conn(); c != nil && c.Mode() == rueidis.ClientModeCluster && time.Since(refreshed) >= refreshMin {
			if s.refreshSlots(c) == nil {
				refreshed = time.Now()
			}
			s.scriptNewMasters(opt, c)
		}
		select {
		case <-t.C:
		case <-s.nudge:
			if wait := refreshMin - time.Since(refreshed); wait > 0 {
				time.Sleep(wait)
			}
			refreshed = time.Time{}
		case <-s.stop:
			return
		}
	}
}

// conn returns the client, or nil while a lazy store is not connected.
func (s *Store) conn() rueidis.Client {
	if p := s.client.Load(); p != nil {
		return *p
	}
	return nil
}

// notConnected is the error while there is no client.
func (s *Store) notConnected() error {
	if e := s.lastErr.Load(); e != nil {
		return fmt.Errorf("%w: %v", ErrNotConnected, *e)
	}
	return ErrNotConnected
}

// Close closes the connections.
func (s *Store) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	if c := s.conn(); c != nil {
		c.Close()
	}
}

// ParseURL reads a store URL into rueidis options:
//
//	redis://[user:password@]host:port[/db]     (rediss:// for TLS)
//	redis-cluster://[user:password@]h1:p1,h2:p2
//	redis-sentinel://[user:password@]MASTER@h1:p1,h2:p2
//
// User and password are percent-decoded; for Sentinel they are given to the
// sentinels and to the master. Errors never repeat the password (see
// Redact).
func ParseURL(u string) (rueidis.ClientOption, error) {
	scheme, rest, _ := strings.Cut(u, "://")
	switch scheme {
	case "redis-cluster", "redis-sentinel":
		var creds, master, hosts string
		parts := strings.Split(rest, "@")
		switch {
		case scheme == "redis-cluster" && len(parts) == 1:
			hosts = parts[0]
		case scheme == "redis-cluster":
			creds, hosts = strings.Join(parts[:len(parts)-1], "@"), parts[len(parts)-1]
		case len(parts) == 2:
			master, hosts = parts[0], parts[1]
		case len(parts) > 2:
			creds, master, hosts = strings.Join(parts[:len(parts)-2], "@"), parts[len(parts)-2], parts[len(parts)-1]
		}
		if hosts == "" || (scheme == "redis-sentinel" && master == "") {
			if scheme == "redis-sentinel" {
				return rueidis.ClientOption{}, fmt.Errorf("redis: %s: want redis-sentinel://[user:password@]MASTER@h1:p1,h2:p2", Redact(u))
			}
			return rueidis.ClientOption{}, fmt.Errorf("redis: %s: want redis-cluster://[user:password@]h1:p1,h2:p2", Redact(u))
		}
		opt := rueidis.ClientOption{InitAddress: strings.Split(hosts, ",")}
		if creds != "" {
			user, pass, err := userinfo(creds)
			if err != nil {
				return rueidis.ClientOption{}, fmt.Errorf("redis: %s: %v", Redact(u), err)
			}
			opt.Username, opt.Password = user, pass
		}
		if scheme == "redis-cluster" {
			opt.ShuffleInit = true
		} else {
			opt.Sentinel = rueidis.SentinelOption{MasterSet: master, Username: opt.Username, Password: opt.Password}
		}
		return opt, nil
	case "redis", "rediss":
		opt, err := rueidis.ParseURL(u)
		if err != nil {
			// The parser's own message quotes what it could not read, which
			// may be part of the password.
			return opt, fmt.Errorf("redis: %s: not a URL sluice can read (a password holding @ : / ? # or %% must be percent-encoded)", Redact(u))
		}
		return opt, nil
	}
	return rueidis.ClientOption{}, fmt.Errorf("redis: %s: want a redis://, rediss://, redis-cluster:// or redis-sentinel:// URL", Redact(u))
}

// userinfo decodes "user:password" (either may be empty, percent-encoded).
func userinfo(s string) (user, pass string, err error) {
	u, p, _ := strings.Cut(s, ":")
	if user, err = neturl.PathUnescape(u); err != nil {
		return "", "", errors.New("the user name is not percent-encoded right")
	}
	if pass, err = neturl.PathUnescape(p); err != nil {
		return "", "", errors.New("the password is not percent-encoded right")
	}
	return user, pass, nil
}

// Redact returns a store URL with its password replaced by "xxxxx", for
// logs and errors. It needs no valid URL: of what stands before the host
// list, every "@"-separated part that holds a ":" is taken for
// user:password, and a part without one for a password given alone,
// except a Sentinel URL's master name (the part just before the hosts).
func Redact(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		if strings.Contains(u, "@") {
			return "(a store URL, not shown: it may hold a password)"
		}
		return u
	}
	parts := strings.Split(rest, "@")
	sentinel := strings.EqualFold(scheme, "redis-sentinel")
	for i := range parts[:len(parts)-1] {
		switch user, _, hasPass := strings.Cut(parts[i], ":"); {
		case hasPass:
			parts[i] = user + ":xxxxx"
		case sentinel && i == len(parts)-2:
			// the master's name
		default:
			parts[i] = "xxxxx"
		}
	}
	return scheme + "://" + strings.Join(parts, "@")
}

// Key returns the Redis key of (rule, key) under limit l:
// <prefix>{<tag>}<rule><fingerprint of l>, where tag is key with "%", "{"
// and "}" percent-escaped (see hashTag) and the fingerprint is five
// characters. The hash tag puts every rule of one key in one slot, whatever
// bytes the key holds. The limit's fingerprint gives a rule whose limit
// changes fresh counts (as the embedded store does), and keeps a changed
// algorithm from reading another's state.
//
// The key is as short as that allows, because Redis spends it on every key:
// no prefix unless one is configured, and no separators: the tag's closing
// brace ends it, and the fingerprint has a fixed length, so the rule is what
// lies between the tag and the last five characters. A key name of up to 28
// bytes costs Redis 32 with its header, the next size up 40: Envoy's
// descriptor user=k999 of domain bench is {9:user=k999}bench.user82qjF,
// 28 bytes.
func (s *Store) Key(rule, key string, l sluice.Limit) string {
	if li, err := s.limits.info(l); err == nil {
		return s.key(rule, key, li)
	}
	return s.prefix + "{" + hashTag(key) + "}" + rule + fingerprint(l)
}

// key is Key for a limit already looked up.
func (s *Store) key(rule, key string, li *limitInfo) string {
	return s.prefix + "{" + hashTag(key) + "}" + rule + li.fp
}

// fingerprint returns 30 bits of the FNV-1a hash of l (and of the state
// encoding's version, so that a new encoding never reads an old one's keys)
// as five URL-safe base64 characters.
func fingerprint(l sluice.Limit) string {
	h := fnv.New32a()
	h.Write([]byte("v2 "))
	h.Write([]byte(l.String()))
	v := h.Sum32()
	const digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var b [5]byte
	for i := range b {
		b[i] = digits[v&63]
		v >>= 6
	}
	return string(b[:])
}

// hashTag escapes key for use between the braces of a hash tag. Redis
// Cluster hashes only what lies between the first "{" and the next "}", so
// a raw "}" in a key would end the tag early (user "}x" would hash the
// empty tag, that is the whole key, and land each rule of the key in a
// different slot), and a key of "{" or "}" could aim a take at a slot of the
// attacker's choosing. Escaping "%" too keeps the mapping one to one: two
// different keys never share a tag.
func hashTag(key string) string {
	if !strings.ContainsAny(key, "%{}") {
		return key
	}
	return tagEscaper.Replace(key)
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// maxExact is 2^53: Lua's numbers hold integers exactly below it.
const maxExact = 1 << 53

// params are a limit's in microseconds, as the script takes them.
type params struct {
	alg        string
	t, d, w, l int64
	own        int64 // a region's own share of a global limit (portion.lua)
}

func paramsOf(l sluice.Limit) (params, error) {
	p, err := algo.NewParams(l)
	if err != nil {
		return params{}, err
	}
	us := func(ns int64) int64 { return (ns + 999) / 1000 }
	r := params{alg: l.Algorithm.String(), t: us(p.T), w: us(p.W), l: p.Burst}
	r.d = r.t * p.Burst
	if l.Calendar {
		// A fixed window has no use for T: a negative T names its calendar
		// unit for fixed_window.lua (1 day, 2 week, 3 month, 4 year).
		r.t = -map[time.Duration]int64{sluice.CalendarDay: 1, sluice.CalendarWeek: 2, sluice.CalendarMonth: 3, sluice.CalendarYear: 4}[l.Period]
	}
	if l.Algorithm == sluice.SlidingWindow && r.l*r.w >= maxExact {
		return params{}, fmt.Errorf("redis: %v: limit x window must stay below 2^53 microseconds", l)
	}
	if l.Portion > 0 {
		// portion.lua counts tokens in microseconds times thousandths.
		r.alg, r.own = "portion", l.Portion
		if r.d >= maxExact/algo.Whole {
			return params{}, fmt.Errorf("redis: %v: too long for a region's part in Lua (capacity x 1000 below 2^53 microseconds)", l)
		}
	}
	if r.d >= maxExact || r.w >= maxExact {
		return params{}, fmt.Errorf("redis: %v: too long for microsecond arithmetic in Lua", l)
	}
	return r, nil
}

// Take implements sluice.Store. On one Redis all the takes are one atomic
// script call. On a cluster the takes whose keys share a hash slot (every
// rule of one key does) are one call; the slots are taken in order, and the
// ones taken are given back if a later slot refuses.
func (s *Store) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if len(out) < len(takes) {
		return fmt.Errorf("redis: %d takes but room for %d decisions", len(takes), len(out))
	}
	ps := make([]*limitInfo, len(takes))
	for i, tk := range takes {
		p, err := s.limits.info(tk.Limit)
		if err != nil {
			return fmt.Errorf("redis: rule %q: %w", tk.Rule, err)
		}
		if len(tk.Hold) > sluice.MaxHoldLen {
			return fmt.Errorf("redis: rule %q: reservation id longer than %d bytes", tk.Rule, sluice.MaxHoldLen)
		}
		ps[i] = p
	}
	now := ""
	if s.clock != nil {
		now = strconv.FormatInt(s.clock.Now()/1000, 10)
	}
	// Group the takes by the hash slot of the key actually sent, in
	// first-seen order: on one Redis every take of the request goes in one
	// script call; on a cluster, every take whose key shares a slot.
	c := s.conn()
	if c == nil {
		return s.notConnected()
	}
	cluster := c.Mode() == rueidis.ClientModeCluster
	keys := make([]string, len(takes))
	var groups [][]int
	var slots []uint16 // each group's; a request's takes span few slots
	for i, tk := range takes {
		keys[i] = s.key(tk.Rule, tk.Key, ps[i])
		var sl uint16
		if cluster {
			sl = slot(keys[i])
		}
		g := slices.Index(slots, sl)
		if g < 0 {
			g = len(groups)
			slots = append(slots, sl)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	refused := false
	var done []int // groups taken, to give back if a later one refuses
	for g, idx := range groups {
		dry := refused // after a refusal, the rest only report
		if err := s.exec(ctx, takes, keys, ps, idx, now, dry, out); err != nil {
			s.giveBack(ctx, takes, keys, ps, groups, done, now, out)
			return err
		}
		allowed := true
		for _, i := range idx { // a settle that finds nothing refuses nothing
			allowed = allowed && (out[i].Allowed || takes[i].Settle || takes[i].Charge)
		}
		if !allowed && !refused {
			refused = true
			s.giveBack(ctx, takes, keys, ps, groups, done, now, out)
		}
		if allowed && !dry {
			done = append(done, g)
		}
	}
	return nil
}

// settleCap bounds the units of a settle so that the script's arithmetic
// stays exact (below 2^53): a debt of 2^52 microseconds (142 years), or a
// window count of 2^52 (for a sliding window, of 2^53 / W, which already
// refuses everything), is as good as any larger one.
func settleCap(p *params) int64 {
	switch p.alg {
	case "fixed-window", "sliding-log":
		return maxExact / 2
	case "sliding-window":
		return maxExact / max(p.w, 1)
	case "portion":
		return maxExact / 2 / max(p.t, 1) / algo.Whole
	}
	return maxExact / 2 / max(p.t, 1)
}

// exec runs the script for the takes idx (all in one slot).
func (s *Store) exec(ctx context.Context, takes []sluice.Take, keys []string, ps []*limitInfo, idx []int, now string, dry bool, out []sluice.Decision) error {
	sent := make([]string, len(idx), len(idx)+carries(takes, idx))
	hold := "0"
	if dry {
		hold = "1"
	}
	args := make([]string, 3, 3+12*len(idx))
	args[0], args[1], args[2] = now, itoa(int64(len(idx))), hold
	var was []string // the limits carried from: 4 arguments each
	for j, i := range idx {
		tk, p := &takes[i], ps[i]
		sent[j] = keys[i]
		d := "0"
		if tk.DryRun {
			d = "1"
		}
		holdUS := "0"
		switch {
		case tk.Charge && tk.Cost > 0:
			holdUS = "-2"
		case tk.Hold == "":
		case tk.Settle:
			holdUS = "-1"
		case tk.HoldFor > 0:
			holdUS = itoa(max(int64(tk.HoldFor+999)/1000, 1))
		}
		cost := tk.Cost
		if tk.Settle || tk.Charge {
			cost = min(cost, settleCap(&p.params))
		}
		nc := 0
		for _, w := range tk.Was {
			if !carriesFrom(tk.Limit, w) {
				continue
			}
			wi, err := s.limits.info(w)
			if err != nil {
				continue // a limit no script could count: nothing is kept under it
			}
			sent = append(sent, s.key(tk.Rule, tk.Key, wi))
			was = append(was, wi.args[0], wi.args[1], wi.args[2], wi.args[3])
			nc++
		}
		args = append(args, p.alg, p.args[0], p.args[1], p.args[2], p.args[3], itoa(cost), d, tk.Hold, holdUS, itoa(max(tk.Floor, 0)), p.args[4], strconv.Itoa(nc))
	}
	args = append(args, was...)
	script := ps[idx[0]].alg
	for _, i := range idx[1:] {
		if ps[i].alg != ps[idx[0]].alg {
			script = "" // mixed algorithms: the script with all of them
		}
	}
	c := s.conn()
	if c == nil {
		return s.notConnected()
	}
	vals, err := s.run(ctx, c, script, sent, args)
	for wait := time.Millisecond; tryAgain(err); wait = min(2*wait, 50*time.Millisecond) {
		// The slot is moving and these keys are on both sides of it:
		// Redis applied none of the call. The move of one slot takes
		// milliseconds; ask again until it is done or the deadline is.
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis: %w", err)
		case <-time.After(wait):
		}
		if sluice.PastSendBy(ctx) {
			return fmt.Errorf("redis: %w (%w)", err, sluice.ErrNotSent)
		}
		vals, err = s.run(ctx, c, script, sent, args)
	}
	if err != nil {
		select { // the node may have moved: read the slot map again
		case s.nudge <- struct{}{}:
		default:
		}
		return fmt.Errorf("redis: %w", err)
	}
	if len(vals) != 6*len(idx) {
		return errors.New("redis: the script answered an unexpected shape")
	}
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	for j, i := range idx {
		v := vals[6*j : 6*j+6]
		out[i] = sluice.Decision{
			Allowed: v[0] == 1, Reason: sluice.Reason(v[1]), Rule: takes[i].Rule, Limit: takes[i].Limit,
			Remaining: v[2], RetryAfter: us(v[3]), ResetAfter: us(v[4]), Delay: us(v[5]),
		}
	}
	return nil
}

// carries returns how many limits the takes idx may carry from, at most.
func carries(takes []sluice.Take, idx []int) int {
	n := 0
	for _, i := range idx {
		n += len(takes[i].Was)
	}
	return n
}

// carriesFrom reports whether a key counted under w moves to l when its
// limit changes (sluice.Take.Was): a limit of the same algorithm, other
// than l, neither a region's part of a global limit.
func carriesFrom(l, w sluice.Limit) bool {
	return w != l && w.Algorithm == l.Algorithm && w.Portion == 0 && l.Portion == 0
}

// tryAgain reports whether err is Redis Cluster's TRYAGAIN: a call whose
// keys are split between the two masters of a slot being migrated, refused
// whole and safe to send again.
func tryAgain(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && re.IsTryAgain()
}

// giveBack refunds the groups already taken (best effort: a failure here
// leaves those units taken until their keys refill).
func (s *Store) giveBack(ctx context.Context, takes []sluice.Take, keys []string, ps []*limitInfo, groups [][]int, done []int, now string, out []sluice.Decision) {
	for _, g := range done {
		var idx []int
		back := make([]sluice.Take, len(takes))
		copy(back, takes)
		for _, i := range groups[g] {
			if takes[i].Cost > 0 && !takes[i].DryRun && !takes[i].Settle && !takes[i].Charge {
				back[i].Cost = -takes[i].Cost
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		scratch := make([]sluice.Decision, len(takes))
		if s.exec(ctx, back, keys, ps, idx, now, false, scratch) == nil {
			for _, i := range idx { // report the state that stands after the refund
				out[i].Remaining, out[i].ResetAfter = max(scratch[i].Remaining-max(takes[i].Floor, 0), 0), scratch[i].ResetAfter
			}
		}
	}
}

// Forget drops the state of key under rule, whatever limits it has had: an
// operator's "unlock this user". It scans for the key's entries, so it is an
// admin operation, not a serving one.
func (s *Store) Forget(rule, key string) bool {
	return s.deleteMatching(context.Background(), globEscape(s.prefix+"{"+hashTag(key)+"}"+rule)+"?????") > 0
}

// deleteMatching deletes the keys matching a SCAN pattern on every node and
// returns how many it deleted.
func (s *Store) deleteMatching(ctx context.Context, pattern string) int {
	deleted := 0
	client := s.conn()
	if client == nil {
		return 0
	}
	for _, c := range client.Nodes() {
		var cursor uint64
		for {
			entry, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				break
			}
			for _, k := range entry.Elements {
				if n, err := c.Do(ctx, c.B().Del().Key(k).Build()).AsInt64(); err == nil {
					deleted += int(n)
				}
			}
			if cursor = entry.Cursor; cursor == 0 {
				break
			}
		}
	}
	return deleted
}

// globEscape escapes SCAN MATCH's special characters.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// MemoryUsage returns what Redis reports (MEMORY USAGE) for the state of key
// under rule and limit l, in bytes; 0 when there is none.
func (s *Store) MemoryUsage(ctx context.Context, rule, key string, l sluice.Limit) (int64, error) {
	c := s.conn()
	if c == nil {
		return 0, s.notConnected()
	}
	n, err := c.Do(ctx, c.B().MemoryUsage().Key(s.Key(rule, key, l)).Samples(0).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}

// Delete drops the state of key under rule and limit l, if any.
func (s *Store) Delete(ctx context.Context, rule, key string, l sluice.Limit) error {
	c := s.conn()
	if c == nil {
		return s.notConnected()
	}
	return c.Do(ctx, c.B().Del().Key(s.Key(rule, key, l)).Build()).Error()
}

// DeleteRule drops every key of rule under the store's prefix, for tools
// that measure and clean up after themselves. It scans: not for serving
// paths.
func (s *Store) DeleteRule(ctx context.Context, rule string) {
	s.deleteMatching(ctx, globEscape(s.prefix)+"{*}"+globEscape(rule)+"?????")
}
