package memory_test

import (
	"testing"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		return memory.New(memory.WithClock(c))
	})
}

// A tiny key bound forces eviction on every new key: the suite must still pass
// for the keys it uses, which fit.
func TestConformanceWithSmallBound(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		return memory.New(memory.WithClock(c), memory.WithMaxKeys(128*4))
	})
}

// The store fuzzed over costs and time steps against package algo.
func FuzzCostAndTime(f *testing.F) {
	storetest.FuzzCostAndTime(f, func(t *testing.T, c sluice.Clock) sluice.Store {
		return memory.New(memory.WithClock(c))
	}, storetest.Options{})
}
