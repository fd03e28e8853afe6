// Package sim runs sluice's real algorithms under a simulated clock on
// deterministic traffic, so the numbers it prints are the ones sluice would
// produce, and the same on every run and machine.
package sim
