package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-rl/sluice"
)

// Concurrent decisions on one Redis go to it together.
//
// A script call costs Redis a fixed part beside the decision itself: reading
// and parsing the command, starting the script, defining its functions —
// about 3 µs of Redis' CPU against about 8 µs for a fixed window's decision
// (measured with redis-benchmark and INFO commandstats on redis-server
// 7.0.15). Redis runs on one core, so under load that fixed part bounds the
// decisions per second.
//
// So at most maxFlights script calls of one script are in flight at once.
// A call that finds fewer in flight goes at once, alone: a lone caller waits
// no longer than before. A call that finds maxFlights in flight queues, and
// when a flight lands, everything queued meanwhile (up to maxBatch calls)
// goes as one batch call of the same script, which decides the calls one
// after another, each exactly as it would be decided alone (take.lua): the
// batch is one serial order of calls that were concurrent anyway, so every
// guarantee of a single call holds for each. Batches grow with the load and
// vanish without it.
//
// Not batched: on a cluster (a script call must keep to one hash slot, and
// concurrent calls rarely share one), and with a fixed Clock (each call
// sends its own time). A queued call whose context ends before its batch
// leaves is answered with the context's error and not sent, as is one past
// its sluice.SendBy (answered sluice.ErrNotSent): a backlog of calls whose
// callers stopped waiting is not piled on a Redis that is already slow.
// Once sent, as for any call, its outcome is what Redis decided.
const (
	maxFlights = 2
	maxBatch   = 128
)

type batcher struct {
	mu      sync.Mutex
	flights int
	queue   []*queued
}

// queued is a call waiting for a batch. What the batch needs of the
// call's context is read when it queues: the context may be reused once
// its caller has gone (a followed call's is, see sluice.SendBy), so the
// batch never reads it.
type queued struct {
	ctx      context.Context // for the caller only
	deadline time.Time       // zero: none
	sendBy   time.Time       // zero: none
	keys     []string
	args     []string // the call's number of takes, hold flag and takes' arguments
	takes    int      // its takes: its keys are theirs and those they carry from
	vals     []int64
	err      error
	done     chan struct{}
}

// run sends one script call (keys, args as take.lua reads them), batched
// with others when Redis is busy.
func (s *Store) run(ctx context.Context, c rueidis.Client, name string, keys, args []string) ([]int64, error) {
	b := s.batchers[name]
	if b == nil || s.clock != nil || c.Mode() == rueidis.ClientModeCluster {
		return s.scripts[name].Exec(ctx, c, keys, args).AsIntSlice()
	}
	b.mu.Lock()
	if b.flights < maxFlights {
		b.flights++
		b.mu.Unlock()
		vals, err := s.scripts[name].Exec(ctx, c, keys, args).AsIntSlice()
		s.landed(c, name, b)
		return vals, err
	}
	takes, _ := strconv.Atoi(args[1])
	q := &queued{ctx: ctx, keys: keys, args: args[1:], takes: takes, done: make(chan struct{})}
	q.deadline, _ = ctx.Deadline()
	if sb, ok := ctx.(sluice.SendBy); ok {
		q.sendBy = sb.SendBy()
	}
	s.batched.Add(1)
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
		return q.vals, q.err
	case <-ctx.Done():
		// Not sent unless its batch has left already.
		b.mu.Lock()
		if i := slices.Index(b.queue, q); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		return nil, ctx.Err()
	}
}

// landed frees a flight, or fills it with what queued meanwhile.
func (s *Store) landed(c rueidis.Client, name string, b *batcher) {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.flights--
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = append([]*queued(nil), b.queue[n:]...)
	b.mu.Unlock()
	go s.fly(c, name, b, batch)
}

// fly sends a batch and answers each of its calls.
func (s *Store) fly(c rueidis.Client, name string, b *batcher, batch []*queued) {
	defer s.landed(c, name, b)
	live := batch[:0]
	var last time.Time
	now := time.Now()
	for _, q := range batch {
		if !q.deadline.IsZero() && !now.Before(q.deadline) {
			q.err = context.DeadlineExceeded // gave up before it was sent
			close(q.done)
			continue
		}
		if !q.sendBy.IsZero() && now.After(q.sendBy) {
			q.err = sluice.ErrNotSent // followed, but no longer waited for
			close(q.done)
			continue
		}
		if q.deadline.After(last) {
			last = q.deadline
		}
		live = append(live, q)
	}
	if len(live) == 0 {
		return
	}
	nk, na, nt := 0, 3, 0
	for _, q := range live {
		nk += len(q.keys)
		nt += q.takes
		na += len(q.args)
	}
	keys := make([]string, 0, nk)
	args := make([]string, 0, na)
	args = append(args, "", "b", strconv.Itoa(len(live)))
	for _, q := range live {
		keys = append(keys, q.keys...)
		args = append(args, q.args...)
	}
	// The batch may take as long as its most patient call allows; each call
	// still stops waiting at its own deadline.
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !last.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, last)
	}
	vals, err := s.scripts[name].Exec(ctx, c, keys, args).AsIntSlice()
	cancel()
	if err == nil && len(vals) != 6*nt {
		err = errors.New("redis: the batch script answered an unexpected shape")
	}
	off := 0
	for _, q := range live {
		if err != nil {
			q.err = err
		} else {
			q.vals = vals[off : off+6*q.takes : off+6*q.takes]
			off += 6 * q.takes
		}
		close(q.done)
	}
}
