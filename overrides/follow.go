package overrides

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Follower keeps the overrides of a store current in the process: Run
// reads them at start, then again whenever the store tells of a change and
// every Reread in any case, so that a missed notification heals. Current
// is one atomic load; Find on it costs nothing for a rule without
// overrides.
type Follower struct {
	Store Store
	// Reread is how often the set is read without a notification (0: 5 s).
	Reread time.Duration
	// OnChange, if set, is called with each new set (for metrics).
	OnChange func(*Set)
	Logger   *slog.Logger

	current atomic.Pointer[Set]
	failed  atomic.Bool
	// reading serialises Refresh: callers that arrive while a read runs
	// find the version it read and do not read again.
	reading sync.Mutex
}

// Current returns the set in force (nil before the first read).
func (f *Follower) Current() *Set { return f.current.Load() }

// Healthy reports whether the last read of the store succeeded.
func (f *Follower) Healthy() bool { return !f.failed.Load() }

// Refresh reads the store now: after a change made through this process,
// so that it is in force here before the change is answered.
func (f *Follower) Refresh(ctx context.Context) error {
	f.reading.Lock()
	defer f.reading.Unlock()
	if cur := f.current.Load(); cur != nil {
		v, err := f.Store.Version(ctx)
		if err != nil {
			f.failed.Store(true)
			return err
		}
		if v == cur.Version() {
			f.failed.Store(false)
			return nil
		}
	}
	list, version, err := f.Store.Load(ctx)
	if err != nil {
		f.failed.Store(true)
		return err
	}
	f.failed.Store(false)
	s := NewSet(version, list)
	f.current.Store(s)
	if f.OnChange != nil {
		f.OnChange(s)
	}
	return nil
}

// Run follows the store until ctx ends. A failed read keeps the set in
// force and is tried again at the next notification or Reread.
func (f *Follower) Run(ctx context.Context) {
	log := f.Logger
	if log == nil {
		log = slog.Default()
	}
	every := f.Reread
	if every <= 0 {
		every = 5 * time.Second
	}
	kick := make(chan struct{}, 1)
	go func() {
		for ctx.Err() == nil {
			err := f.Store.Changes(ctx, func() {
				select {
				case kick <- struct{}{}:
				default:
				}
			})
			if err == nil {
				return // no notifications, or ctx ended: Reread alone
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			select { // notifications may have been missed while down
			case kick <- struct{}{}:
			default:
			}
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := f.Refresh(rctx); err != nil && ctx.Err() == nil {
			log.Warn("sluice: overrides not read; those in force stay", "error", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-t.C:
		}
	}
}
