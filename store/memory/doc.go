// Package memory is sluice's embedded store: per-key limiter state in the
// process's own memory, for every algorithm, with no setup.
//
// # Layout
//
// Each (rule, limit) pair has a table of 128 shards, each an open-addressing
// hash table with linear probing under its own mutex; there is no global
// lock. A slot holds a 64-bit hash of the key and the algorithm's state, and
// nothing else: 16 bytes for GCRA. The key string itself is never stored, so
// secrets never linger and memory per key is small and fixed.
//
// Two distinct keys share state only if their 64-bit seeded hashes collide:
// with n keys in a rule the chance of any collision is about n²/2^64 (under
// 10^-5 at 10 million keys), the hash seed is random per process so clients
// cannot aim for one, and the effect of one is a stricter limit for two keys.
//
// # Expiry and bounds
//
// A key whose state is back to idle (GCRA TAT <= now, bucket full, windows
// passed, log empty) is dead: answering from a fresh key gives the same
// answers. Dead slots are reused by the next key that probes past them and
// dropped whenever a shard grows; no timer or janitor is needed for correct
// answers. Each rule holds at most MaxKeys keys ([WithMaxKeys], default
// [DefaultMaxKeys]); at the bound a new key evicts the live key closest to its
// idle state among a few near its slot. An evicted key comes back fresh and
// full — in its client's favour — and every eviction is counted.
//
// # Atomicity
//
// [Store.Take] takes from several (rule, key) pairs all or nothing: it locks
// every shard involved in a fixed global order, decides each take, and undoes
// the allowed ones if any is denied.
package memory
