// Package fleet holds the end-to-end tests of several `sluice serve`
// processes sharing Redis, run as a user runs them (the built binary,
// default flags, real redis-server processes): exact admission on a
// machine whose cores are busy, what each sync mode admits against its
// limit and how many store calls it makes, regions, what each store fault
// that stops a node costs (Redis slowed, hung, killed, away at start, a
// cluster master stopped, a Sentinel failover), and the faults that move a
// key's count (failover_test.go: a cluster master killed and its replica
// promoted, Redis hung and restarted from its append-only file, slots
// resharded and rebalanced onto a new master), each held to the bound
// docs/redis.md states. The end-to-end suites (this one and cmd/sluice's)
// take a machine-wide lock (proctest.Exclusive) and never run side by
// side; they are one package here because a suite waiting for the lock
// holds one of `go test`'s parallel slots idle.
package fleet
