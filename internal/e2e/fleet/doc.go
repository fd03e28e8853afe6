// Package fleet holds the end-to-end tests of several `sluice serve`
// processes sharing one Redis, one Redis Cluster or a Sentinel group, run as
// a user runs them (the built binary, default flags, real redis-server
// processes): exactness on a busy machine, every sync mode's bound, and
// what each store fault costs (a master killed and its replica promoted,
// Redis hung and restarted, slots resharded and rebalanced, Redis away at
// start). They are a package of their own so that each of the two suites,
// this one and cmd/sluice's, stays well within `go test`'s 10 minutes per
// package on a loaded 2-core machine.
package fleet
