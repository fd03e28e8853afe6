//go:build race

package sim

// raceBuild: the tests run under the race detector, some ten times slower.
const raceBuild = true
