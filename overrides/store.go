package overrides

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

// Store keeps the overrides where every process that enforces them reads
// them: in the process for the embedded store, in Redis for a fleet.
//
// Every change bumps the store's version, so a reader that has a version
// knows whether it has the latest set. Put and Delete are compare-and-set:
// ifVersion is the override's version the caller read (0: it must not
// exist; AnyVersion: whatever it is, if any; Existing: it must exist,
// whatever its version). Both drop the expired overrides they find,
// so none outlives the next change.
//
// A change answered with an error was not made, with one exception: a
// store across a network never makes a change after ctx's deadline (it
// refuses one that reaches it late, ErrNotMade), but a change it made just
// before the deadline may have an answer that is lost on the way:
// ErrOutcomeUnknown, and only a Load tells.
type Store interface {
	// Load returns every override and the store's version.
	Load(ctx context.Context) ([]*Override, int64, error)
	// Version returns the store's version alone: a reader that has it
	// need not Load.
	Version(ctx context.Context) (int64, error)
	// Put writes o (its ID, Version and Updated set by the store) and
	// returns it as written and the override it replaced, if any.
	Put(ctx context.Context, o Override, ifVersion int64, now time.Time) (written, before *Override, err error)
	// Delete removes the override id and returns it.
	Delete(ctx context.Context, id string, ifVersion int64, now time.Time) (*Override, error)
	// Changes tells of changes made by any process, as soon as the store
	// can (a hint: Follower also re-reads on its own). It returns when ctx
	// ends; a store with no way to tell returns nil at once.
	Changes(ctx context.Context, changed func()) error
}

// Memory is a Store in the process: the overrides of one process using
// the embedded store. Its zero value is ready.
type Memory struct {
	mu      sync.Mutex
	version int64
	byID    map[string]*Override
	waiters []chan struct{}
	// nextExpiry is the earliest expiry among byID (zero: none): a change
	// before it has nothing to drop and does not look.
	nextExpiry time.Time
}

// Version returns the version.
func (m *Memory) Version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, nil
}

// Load returns every override and the version.
func (m *Memory) Load(context.Context) ([]*Override, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.byID)), m.version, nil
}

// Put writes o if its current version is ifVersion.
func (m *Memory) Put(_ context.Context, o Override, ifVersion int64, now time.Time) (*Override, *Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(now)
	o.ID = IDOf(o.Rule, o.Key, o.Prefix)
	before := m.byID[o.ID]
	if err := checkVersion(before, ifVersion); err != nil {
		return nil, nil, err
	}
	if before == nil && len(m.byID) >= MaxOverrides {
		return nil, nil, ErrFull
	}
	m.version++
	o.Version, o.Updated = m.version, now.UTC()
	if m.byID == nil {
		m.byID = map[string]*Override{}
	}
	m.byID[o.ID] = &o
	if !o.UntilRemoved && (m.nextExpiry.IsZero() || o.Expires.Before(m.nextExpiry)) {
		m.nextExpiry = o.Expires
	}
	m.notify()
	return &o, before, nil
}

// Delete removes the override id if its version is ifVersion.
func (m *Memory) Delete(_ context.Context, id string, ifVersion int64, now time.Time) (*Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(now)
	before := m.byID[id]
	if before == nil {
		return nil, ErrNotFound
	}
	if err := checkVersion(before, ifVersion); err != nil {
		return nil, err
	}
	delete(m.byID, id)
	m.version++
	m.notify()
	return before, nil
}

// Changes calls changed after each change until ctx ends.
func (m *Memory) Changes(ctx context.Context, changed func()) error {
	for {
		ch := make(chan struct{})
		m.mu.Lock()
		m.waiters = append(m.waiters, ch)
		m.mu.Unlock()
		select {
		case <-ch:
			changed()
		case <-ctx.Done():
			return nil
		}
	}
}

func (m *Memory) notify() {
	for _, ch := range m.waiters {
		close(ch)
	}
	m.waiters = m.waiters[:0]
}

// dropExpired removes what has expired; under mu. It changes no version:
// an expired override was already out of force.
func (m *Memory) dropExpired(now time.Time) {
	if m.nextExpiry.IsZero() || now.Before(m.nextExpiry) {
		return
	}
	m.nextExpiry = time.Time{}
	for id, o := range m.byID {
		switch {
		case !o.Live(now):
			delete(m.byID, id)
		case !o.UntilRemoved && (m.nextExpiry.IsZero() || o.Expires.Before(m.nextExpiry)):
			m.nextExpiry = o.Expires
		}
	}
}

// The versions a change may be conditioned on besides an override's own.
const (
	AnyVersion int64 = -1 // whatever version, and for Put none
	Existing   int64 = -2 // whatever version, but one (HTTP's If-Match: *)
)

// checkVersion is the compare of compare-and-set.
func checkVersion(current *Override, ifVersion int64) error {
	switch {
	case ifVersion == Existing && current == nil:
		return ErrVersion
	case ifVersion < 0:
		return nil
	case current == nil && ifVersion != 0, current != nil && current.Version != ifVersion:
		return ErrVersion
	}
	return nil
}
