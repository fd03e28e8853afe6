// Package fleet holds the end-to-end tests of several `sluice serve`
// processes sharing Redis, run as a user runs them (the built binary,
// default flags, real redis-server processes): exact admission on a
// machine whose cores are busy, what each sync mode admits against its
// limit and how many store calls it makes, regions, and what each store
// fault that stops a node costs (Redis slowed, hung, killed, away at
// start, a cluster master stopped, a Sentinel failover). The faults that
// move a key's count (a failover, a hang and a restart, a reshard) are in
// internal/e2e/failover. They are packages of their own, apart from
// cmd/sluice's, so that each suite stays well within `go test`'s time per
// package on a loaded 2-core machine; the end-to-end suites take a
// machine-wide lock (proctest.Exclusive) and never run side by side.
package fleet
