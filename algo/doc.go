// Package algo is the pure math of sluice's seven algorithms.
//
// Each algorithm is a small state value and a Take method that, given the
// limit's [Params], the current time now (int64 nanoseconds) and a cost,
// returns the state after the take and writes a [Result] through a pointer
// (returning a struct of six words by value costs about five times as much,
// in store-forwarding stalls, as the whole decision). Nothing here allocates
// (the sliding log excepted, and only when a key's log outgrows its largest
// size so far), reads a clock, or locks: stores own the state, the time and
// the concurrency. Because Take returns the next state instead of writing it,
// a store can decide several takes and commit them all or none.
//
// All arithmetic is on integer nanoseconds. The bucket family uses the
// emission interval T = Period/Rate rounded up to a whole nanosecond and the
// capacity D = Burst*T, and keeps its level in nanoseconds of refill time, so
// no float ever drifts. The sliding window counter compares
// prev*(W-elapsed) + cur*W with limit*W in 128-bit integers.
//
// Shared conventions:
//   - A cost of 0 peeks: it is allowed, consumes nothing and reports Remaining.
//   - A cost above the burst (or the window's limit) is rejected with
//     [sluice.ReasonTooLarge] and no RetryAfter: waiting cannot help.
//   - Time going backwards counts as no elapsed time: algorithms that keep a
//     last-update time use max(now, last); GCRA and the leaky queue keep only
//     a future instant, so an earlier now only makes the key look fuller.
//   - Sums saturate instead of overflowing, so huge gaps and extreme values
//     give the same answers as merely large ones.
//   - Costs must be >= 0; stores reject negative costs before calling here.
package algo
