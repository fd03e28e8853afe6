package sim

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// base is the simulated epoch: a multiple of every window the scenarios use
// (a day is one), so that t = 0 starts an aligned window.
var base = time.Unix(1_764_028_800, 0).UTC() // 2025-11-25 00:00:00 UTC

// at converts simulated seconds to an instant.
func at(seconds float64) time.Time {
	return base.Add(time.Duration(math.Round(seconds * 1e9)))
}

// newLimiter returns a limiter on a fresh embedded store whose clock the
// scenario moves.
func newLimiter(rule string, l sluice.Limit) (*memory.Limiter, *sluice.ManualClock, error) {
	clock := sluice.NewManualClock(base)
	lim, err := memory.New(memory.WithClock(clock)).Limiter(rule, l)
	return lim, clock, err
}
