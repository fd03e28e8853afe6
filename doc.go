// Package sluice holds the core types of the sluice rate limiter: a [Limit]
// (a rate per period, a burst and an [Algorithm]), the [Decision] a limiter
// returns, the [Store] interface that keeps per-key state, and the [Clock]
// that stores read time from.
//
// The math of every algorithm lives in package algo; the embedded store in
// store/memory. This package imports nothing but the standard library, so that
// every other package can depend on it.
//
// # Burst ceiling
//
// For the bucket family (token-bucket, leaky-meter, leaky-queue, gcra) a key
// whose limit is r units per second with burst b lets at most b + r*t units
// through in any interval of length t. The window algorithms admit at most
// Rate units per window: fixed-window per aligned window (so up to 2*Rate
// across a boundary), sliding-log in every window-long interval.
package sluice
