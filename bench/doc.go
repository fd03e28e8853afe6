// Package bench holds sluice's side-by-side benchmarks against other Go rate
// limiters. It is a separate module so that sluice's own go.mod never depends
// on its peers. See docs/benchmarks.md for the commands and the figures.
package bench
