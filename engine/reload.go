package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// Reload starts serving cfg. A rule whose id and limit did not change keeps
// its counts and statistics; a rule whose limit changed keeps what each key
// spent, converted to the new limit when the key is next counted (carry.go).
func (e *Engine) Reload(cfg *rules.Config) {
	next := compile(cfg)
	prev := e.set.Load()
	for _, r := range next.rules {
		for _, old := range prev.rules {
			if old.ID == r.ID && old.Limit == r.Limit {
				copyCounters(r.stats, old.stats)
			}
		}
	}
	e.past.noteReload(prev, next)
	e.set.Store(next)
	e.past.wake()
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
	dst.settled.Store(src.settled.Load())
	for i := range dst.tierAllowed {
		dst.tierAllowed[i].Store(src.tierAllowed[i].Load())
		dst.tierLimited[i].Store(src.tierLimited[i].Load())
	}
	dst.unsettled.Store(src.unsettled.Load())
	dst.nearLimit.Store(src.nearLimit.Load())
	dst.overruled.Store(src.overruled.Load())
}

// ReloadFile loads the rule files at paths (their rules apply together) and
// serves them. An invalid file is refused: the error is logged and returned,
// and the current rules keep serving. Files whose contents are those of the
// last call are not loaded again: the file watcher and a SIGHUP that both
// see one change load it once.
func (e *Engine) ReloadFile(paths ...string) error {
	e.fileMu.Lock()
	defer e.fileMu.Unlock()
	h := sha256.New()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			h.Reset() // unreadable: never equal to a digest of contents
			break
		}
		fmt.Fprintf(h, "%d:%s\x00%d:", len(p), p, len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if sum == e.files {
		e.log.Debug("sluice: rule files unchanged since they were last loaded", "files", paths)
		return e.filesErr // what loading them gave, once
	}
	cfg, err := e.load.LoadAll(paths...)
	if err != nil {
		e.reloads[1].Add(1)
		e.log.Error("sluice: rule files refused; the previous rules keep serving", "files", paths, "error", err)
		e.files, e.filesErr = sum, err // refused once, logged once
		return err
	}
	e.files, e.filesErr = sum, nil
	e.Reload(cfg)
	e.log.Info("sluice: rules reloaded", "files", paths, "rules", len(cfg.Rules))
	return nil
}

// Reloads returns how many reloads succeeded and how many were refused.
func (e *Engine) Reloads() (ok, refused uint64) { return e.reloads[0].Load(), e.reloads[1].Load() }

// WatchFile reloads the rule files at paths whenever one's contents change,
// checking every interval, until ctx is done.
func (e *Engine) WatchFile(ctx context.Context, interval time.Duration, paths ...string) {
	last := make([][]byte, len(paths))
	for i, p := range paths {
		last[i], _ = os.ReadFile(p)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed := false
		for i, p := range paths {
			cur, err := os.ReadFile(p)
			if err == nil && !bytes.Equal(cur, last[i]) {
				last[i], changed = cur, true
			}
		}
		if changed {
			e.ReloadFile(paths...)
		}
	}
}

// ReloadOnSignal reloads the rule files at paths each time the process
// receives one of sigs (SIGHUP when none are given), until ctx is done.
func (e *Engine) ReloadOnSignal(ctx context.Context, paths []string, sigs ...os.Signal) {
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
			e.ReloadFile(paths...)
		}
	}
}
