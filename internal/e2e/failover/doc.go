// Package failover holds the end-to-end tests of the faults that move a
// key's count while two `sluice serve` processes use it, run as a user
// runs them (the built binary, default flags, real redis-server
// processes): a cluster master killed and its replica promoted, Redis hung
// and restarted from its append-only file, slots resharded and rebalanced
// onto a new master. Each holds every user to the bound docs/redis.md
// states. They are a package apart from internal/e2e/fleet so that each
// stays well within `go test`'s time per package on a loaded 2-core
// machine; the end-to-end suites take a machine-wide lock
// (proctest.Exclusive) and never run side by side.
package failover
