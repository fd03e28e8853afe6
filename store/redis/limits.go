package redis

import (
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice"
)

// What a limit contributes to a script call — its parameters in
// microseconds, their decimal strings, the fingerprint in its keys — is the
// same for every take under it, and costs more to compute than it looks:
// the fingerprint formats the limit as text and hashes it. Computed per take,
// that was about 5% of the decision service's CPU on Redis; so each limit's
// is computed once and kept.
//
// Limits come from the rules, and also from requests (an Envoy descriptor's
// own limit, its descriptor limit), so the cache is bounded: past maxCachedLimits limits, the
// rest are computed per take, as if there were no cache. It is a map
// replaced whole on each addition (at most maxCachedLimits times), read
// without a lock.
const maxCachedLimits = 256

// limitInfo is one limit's part of every script call under it. Shared by
// the calls: never modified once cached.
type limitInfo struct {
	params
	fp   string    // fingerprint(l)
	args [5]string // T, D, W, L and own in decimal
}

type limitCache struct {
	m  atomic.Pointer[map[sluice.Limit]*limitInfo]
	mu sync.Mutex // serializes additions
}

// info returns l's limitInfo, or the reason l cannot be run by a script.
func (c *limitCache) info(l sluice.Limit) (*limitInfo, error) {
	if m := c.m.Load(); m != nil {
		if li := (*m)[l]; li != nil {
			return li, nil
		}
	}
	p, err := paramsOf(l)
	if err != nil {
		return nil, err
	}
	li := &limitInfo{params: p, fp: fingerprint(l), args: [5]string{itoa(p.t), itoa(p.d), itoa(p.w), itoa(p.l), itoa(p.own)}}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil && len(*old) >= maxCachedLimits {
		return li, nil
	}
	next := make(map[sluice.Limit]*limitInfo, 1)
	if old != nil {
		if cached := (*old)[l]; cached != nil {
			return cached, nil
		}
		next = make(map[sluice.Limit]*limitInfo, len(*old)+1)
		for k, v := range *old {
			next[k] = v
		}
	}
	next[l] = li
	c.m.Store(&next)
	return li, nil
}
