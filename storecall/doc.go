// Package storecall is how the engine's calls reach a store: one verb,
// [Client.Take], with a [Call] that says whose call it is, and around it
// what a remote store needs that a rule set does not.
//
//   - A deadline on every call that adapts to the store's latency and to
//     this process's own scheduling delay, so that a busy gateway is not
//     taken for a failed store, and a circuit breaker per store node
//     (guard.go, sched.go).
//   - Calls run on workers and are followed past their deadline: a reply
//     that comes late is credited, not counted twice (late.go).
//   - A ledger of what was admitted while the store did not answer
//     ([Client.Owe]), charged to the store once it does: carried by the
//     key's next owing call or written back in batches (owed.go).
//
// The caller decides what to take and how to answer a failed call (the
// engine answers by each rule's fail mode); the client decides only how a
// call reaches the store and what a failed or late one leaves owed. A store
// that never blocks (the embedded one) is called as it is.
// docs/architecture.md maps the hops; docs/redis.md states the bound over
// a window that the ledger keeps.
package storecall
