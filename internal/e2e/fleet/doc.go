// Package fleet holds the end-to-end tests of several `sluice serve`
// processes sharing Redis, run as a user runs them (the built binary,
// default flags, real redis-server processes): exact admission on a
// machine whose cores are busy, what each sync mode admits against its
// limit and how many store calls it makes, regions, and what each store
// fault costs against the bound docs/redis.md states (a cluster master
// killed and its replica promoted, Redis hung and restarted from its
// append-only file, slots resharded and rebalanced onto a new master, a
// master stopped, a Sentinel failover, Redis away at start). They are a
// package of their own, apart from cmd/sluice's, so that each suite stays
// well within `go test`'s 10 minutes per package on a loaded 2-core
// machine; within it they run one at a time, as they must on 2 cores.
package fleet
