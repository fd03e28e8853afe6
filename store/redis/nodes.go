package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-rl/sluice"
)

// slotMap says which node serves each Redis Cluster hash slot.
type slotMap struct {
	node  [16384]uint16 // index into names
	names []string
}

// refreshSlots reads CLUSTER SLOTS into the slot map.
func (s *Store) refreshSlots(c rueidis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ranges, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return err
	}
	m := &slotMap{}
	index := map[string]uint16{}
	for _, r := range ranges {
		f, err := r.ToArray()
		if err != nil || len(f) < 3 {
			return fmt.Errorf("redis: CLUSTER SLOTS: unexpected reply")
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		master, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(master) < 2 || lo < 0 || hi > 16383 {
			return fmt.Errorf("redis: CLUSTER SLOTS: unexpected reply")
		}
		host, _ := master[0].ToString()
		port, _ := master[1].AsInt64()
		name := host + ":" + strconv.FormatInt(port, 10)
		i, ok := index[name]
		if !ok {
			i = uint16(len(m.names))
			index[name] = i
			m.names = append(m.names, name)
		}
		for sl := lo; sl <= hi; sl++ {
			m.node[sl] = i
		}
	}
	if len(m.names) == 0 {
		return fmt.Errorf("redis: CLUSTER SLOTS: no slots")
	}
	s.slots.Store(m)
	return nil
}

// Partition implements storecall.Partitioner: on Redis Cluster it names the
// master that serves the take's key (from CLUSTER SLOTS, read every half
// second and soon after a failed call, so that a promoted replica is named
// within about a second of its promotion), so the engine keeps a circuit
// breaker per master and a stopped master degrades only the keys it owns.
// On one Redis it is "".
func (s *Store) Partition(t *sluice.Take) string {
	m := s.slots.Load()
	if m == nil {
		return ""
	}
	return m.names[m.node[slot(s.Key(t.Rule, t.Key, t.Limit))]]
}

// Heartbeat records that gateway id is alive for ttl and returns how many
// gateways are: the membership that gives each gateway its share of a limit
// while the store fails (see package share). The set lives in the store,
// under the server's clock.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error) {
	return s.membership(ctx, id, max(ttl.Milliseconds(), 1))
}

// Leave removes gateway id from the membership set, on shutdown.
func (s *Store) Leave(ctx context.Context, id string) error {
	_, err := s.membership(ctx, id, 0)
	return err
}

func (s *Store) membership(ctx context.Context, id string, ttlMs int64) (int, error) {
	c := s.conn()
	if c == nil {
		return 0, s.notConnected()
	}
	n, err := s.members.Exec(ctx, c, []string{s.prefix + "{members}"}, []string{id, strconv.FormatInt(ttlMs, 10)}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("redis: %w", err)
	}
	return int(n), nil
}

// scriptNewMasters loads the scripts on each master, as CLUSTER NODES lists
// them, that this store has not loaded them on yet. A master added to a
// cluster serves no slot until a rebalance moves one to it, so neither the
// slot map nor the client knows it beforehand (Preload loaded the scripts on
// the nodes of the start); and while a slot moves, calls reach it by ASK.
// Without its scripts, each of the first calls there would be refused
// NOSCRIPT and sent again with the script's text: two more round trips, on
// a node the client has just dialled, in the middle of a migration. That is
// where a call misses its deadline and is answered degraded.
//
// It runs in the background, one at a time (a master that does not answer
// would hold the dial for seconds, and the slot map must stay fresh
// meanwhile), and retries a master it could not load at the next tick. A
// master restarted empty at an address already loaded is not seen here; its
// first call of each script pays the NOSCRIPT round trip, once.
func (s *Store) scriptNewMasters(opt rueidis.ClientOption, c rueidis.Client) {
	if !s.scripting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.scripting.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		text, err := c.Do(ctx, c.B().ClusterNodes().Build()).ToString()
		if err != nil {
			return
		}
		for _, addr := range clusterMasters(text) {
			if _, done := s.scripted.Load(addr); done {
				continue
			}
			o := opt
			o.InitAddress, o.ForceSingleClient, o.DisableCache = []string{addr}, true, true
			o.Sentinel = rueidis.SentinelOption{}
			node, err := rueidis.NewClient(o)
			if err != nil {
				continue
			}
			ok := true
			for _, src := range s.sources {
				if node.Do(ctx, node.B().ScriptLoad().Script(src).Build()).Error() != nil {
					ok = false
					break
				}
			}
			node.Close()
			if ok {
				s.scripted.Store(addr, true)
			}
		}
	}()
}

// clusterMasters returns the addresses of the masters in a CLUSTER NODES
// reply that are reachable as far as the cluster knows: not failed, not in
// a handshake, with an address.
func clusterMasters(nodes string) []string {
	var out []string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		flags := "," + f[2] + ","
		if !strings.Contains(flags, ",master,") || strings.Contains(flags, ",fail") ||
			strings.Contains(flags, ",handshake,") || strings.Contains(flags, ",noaddr,") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		if addr == "" || strings.HasPrefix(addr, ":") {
			continue
		}
		out = append(out, addr)
	}
	return out
}

// Preload loads every script on every node, so that the first decisions
// after a start or failover do not pay for loading them. A gateway reports
// ready only after it succeeded once.
func (s *Store) Preload(ctx context.Context) error {
	if s.loaded.Load() {
		return nil
	}
	client := s.conn()
	if client == nil {
		return s.notConnected()
	}
	for _, c := range client.Nodes() {
		for _, src := range s.sources {
			if err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
				return fmt.Errorf("redis: loading scripts: %w", err)
			}
		}
	}
	s.loaded.Store(true)
	return nil
}
