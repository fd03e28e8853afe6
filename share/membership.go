package share

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Heartbeater is a store that keeps gateway heartbeats, such as the Redis
// store: Heartbeat marks gateway id alive for ttl and returns how many
// gateways are alive; Leave removes id.
type Heartbeater interface {
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error)
	Leave(ctx context.Context, id string) error
}

// Membership counts the live gateways sharing a store. Every Every (1 s by
// default) it renews its own heartbeat, which lives three periods, and reads
// the count of live ones. While the store fails it keeps the last count it
// read: the gateways that were alive with it are presumed alive still, so
// each keeps counting its share. A fixed count (--gateways N) overrides it.
type Membership struct {
	h     Heartbeater
	id    string
	every time.Duration
	fixed int
	live  atomic.Int64
	ok    atomic.Bool
	log   *slog.Logger
	// OnAnswer, if set before Run, is called after each heartbeat the
	// store answered.
	OnAnswer func()
	// back is when the store answered again after failing: for a while
	// after it, the count only grows (see beat).
	back time.Time
}

// NewMembership returns the membership of gateway id in h's set. A fixed
// count above 0 is used instead of the live one.
func NewMembership(h Heartbeater, id string, every time.Duration, fixed int, log *slog.Logger) *Membership {
	if every <= 0 {
		every = time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Membership{h: h, id: id, every: every, fixed: fixed, log: log}
	m.live.Store(1)
	return m
}

// Gateways returns the number of gateways sharing the store: the fixed
// count if set, else the last live count read (at least 1).
func (m *Membership) Gateways() int {
	if m.fixed > 0 {
		return m.fixed
	}
	return int(max(m.live.Load(), 1))
}

// Run keeps the heartbeat until ctx is done, then leaves the set.
func (m *Membership) Run(ctx context.Context) {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		m.beat(ctx)
		select {
		case <-t.C:
		case <-ctx.Done():
			leave, cancel := context.WithTimeout(context.Background(), time.Second)
			m.h.Leave(leave, m.id)
			cancel()
			return
		}
	}
}

func (m *Membership) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.every)
	defer cancel()
	n, err := m.h.Heartbeat(ctx, m.id, 3*m.every)
	if err != nil {
		if m.ok.Swap(false) {
			m.log.Warn("sluice: membership heartbeat failing: keeping the last gateway count", "gateways", m.Gateways(), "error", err)
		}
		m.back = time.Time{}
		return
	}
	// After an outage longer than a heartbeat lives, the others' heartbeats
	// have expired, and come back only as each beats again, within a
	// period. Read before that, the count would be too small, and each
	// gateway's share while the store fails too large: so for two periods
	// after the store answers again the count only grows.
	now := time.Now()
	if !m.ok.Load() && m.back.IsZero() {
		m.back = now
	}
	if cur := m.live.Load(); !m.back.IsZero() && now.Sub(m.back) < 2*m.every && int64(n) < cur {
		n = int(cur)
	}
	if !m.ok.Swap(true) || int64(n) != m.live.Load() {
		m.log.Info("sluice: gateways sharing the store", "gateways", n)
	}
	m.live.Store(int64(max(n, 1)))
	if m.OnAnswer != nil {
		m.OnAnswer()
	}
}
