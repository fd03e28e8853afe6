package engine

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// Reload starts serving cfg. Counts live in the store under (rule id, limit),
// so a rule whose id and limit did not change keeps its counts; its
// statistics carry over too.
func (e *Engine) Reload(cfg *rules.Config) {
	next := compile(cfg)
	prev := e.set.Load()
	for _, r := range next.rules {
		for _, old := range prev.rules {
			if old.ID == r.ID && old.Limit == r.Limit {
				copyCounters(&r.stats, &old.stats)
			}
		}
	}
	e.set.Store(next)
	e.reloads[0].Add(1)
}

func copyCounters(dst, src *counters) {
	dst.allowed.Store(src.allowed.Load())
	dst.limited.Store(src.limited.Load())
	dst.shadowLimited.Store(src.shadowLimited.Load())
	dst.failedOpen.Store(src.failedOpen.Load())
	dst.failedClosed.Store(src.failedClosed.Load())
	dst.skipped.Store(src.skipped.Load())
	dst.locked.Store(src.locked.Load())
	dst.charged.Store(src.charged.Load())
}

// ReloadFile loads path and serves it. An invalid file is refused: the error
// is logged and returned, and the current rules keep serving.
func (e *Engine) ReloadFile(path string) error {
	cfg, err := rules.Load(path)
	if err != nil {
		e.reloads[1].Add(1)
		e.log.Error("sluice: rule file refused; the previous rules keep serving", "file", path, "error", err)
		return err
	}
	e.Reload(cfg)
	e.log.Info("sluice: rules reloaded", "file", path, "rules", len(cfg.Rules))
	return nil
}

// Reloads returns how many reloads succeeded and how many were refused.
func (e *Engine) Reloads() (ok, refused uint64) { return e.reloads[0].Load(), e.reloads[1].Load() }

// WatchFile reloads path whenever its contents change, checking every
// interval, until ctx is done.
func (e *Engine) WatchFile(ctx context.Context, path string, interval time.Duration) {
	last, _ := os.ReadFile(path)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := os.ReadFile(path)
		if err != nil || bytes.Equal(cur, last) {
			continue
		}
		last = cur
		e.ReloadFile(path)
	}
}

// ReloadOnSignal reloads path each time the process receives one of sigs
// (SIGHUP when none are given), until ctx is done.
func (e *Engine) ReloadOnSignal(ctx context.Context, path string, sigs ...os.Signal) {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGHUP}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			e.ReloadFile(path)
		}
	}
}
