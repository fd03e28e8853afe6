package engine

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/storecall"
)

// Inspect returns the state of key under rule, without consuming anything:
// an operator's view of one client, and how long a penalty lock on it has
// left (0: not locked). key is the rule's key as the engine builds it (see
// rules.Rule.AppendKey): the value itself for a one-source key.
func (e *Engine) Inspect(ctx context.Context, ruleID, key string) (sluice.Decision, time.Duration, error) {
	r := e.set.Load().find(ruleID)
	if r == nil {
		return sluice.Decision{}, 0, ErrNoRule
	}
	key = StoreKey(key)
	out := make([]sluice.Decision, 1)
	if err := e.client.Take(ctx, storecall.Call{}, []sluice.Take{{Rule: r.ID, Key: key, Limit: r.store}}, out); err != nil {
		return sluice.Decision{}, 0, err
	}
	if r.Adaptive {
		unscale(&out[0], r, 1)
	}
	var locked time.Duration
	if r.Penalty != nil {
		// The lock is one unit per block: taken, it comes back (ResetAfter)
		// when the lock ends.
		lk := make([]sluice.Decision, 1)
		if e.client.Take(ctx, storecall.Call{}, []sluice.Take{{Rule: r.lockID, Key: key, Limit: r.lockLimit}}, lk) == nil && lk[0].Remaining == 0 {
			locked = max(lk[0].ResetAfter, 1)
		}
	}
	return out[0], locked, nil
}

// Forgetter is implemented by stores that can drop one key's state, such as
// the embedded store.
type Forgetter interface {
	Forget(rule, key string) bool
}

// ErrCannotReset is returned by Reset when the store cannot drop state.
var ErrCannotReset = errors.New("engine: the store cannot reset a key")

// Reset drops key's state under rule, its penalty lock and rejection count
// and its fallback count: the key starts fresh ("unlock this user").
func (e *Engine) Reset(ruleID, key string) (bool, error) {
	r := e.set.Load().find(ruleID)
	if r == nil {
		return false, ErrNoRule
	}
	key = StoreKey(key)
	f, ok := e.store.(Forgetter)
	if !ok {
		return false, ErrCannotReset
	}
	found := f.Forget(r.ID, key)
	if r.Penalty != nil {
		found = f.Forget(r.lockID, key) || found
		found = f.Forget(r.rejectsID, key) || found
	}
	if fb, ok := e.fallback.(Forgetter); ok {
		fb.Forget(r.fallbackID, key)
		if r.Penalty != nil { // the mirrored lock and the counts made while the store failed
			fb.Forget(r.lockID, key)
			fb.Forget(r.rejectsID, key)
		}
	}
	return found, nil
}
