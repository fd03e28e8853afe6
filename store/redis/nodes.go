package redis

import (
	"context"
	"fmt"
	"strconv"
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

// Partition implements engine.Partitioner: on Redis Cluster it names the
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
