// Package redis is sluice's distributed store: many gateways share one count
// in Redis (or Redis Cluster), every decision one atomic Lua script.
//
// On one Redis, all of a request's takes are one script call, all or
// nothing. On a cluster, keys are laid out as <prefix>{<key>}:<rule>:<limit>,
// so that all the rules a key is counted under share one hash slot and are
// taken in one call; slots are taken in order, and the ones already taken are
// given back if a later one refuses: best effort across slots, exact within
// one.
//
// Times are the Redis server's (TIME), in microseconds, so gateways with
// skewed clocks agree; a store can instead send its own clock (for tests, or
// for Redis-compatible servers that refuse TIME in scripts). Limits are
// computed in whole microseconds: each emission interval rounds up to one,
// never looser.
package redis
