// Package share is how a rule's limit is shared among the gateways that use
// one store, without multiplying the limit. Each mode is decided by [Store],
// a sluice.Store that wraps the shared (remote) store, so the engine and the
// stores stay unaware of it:
//
//   - exact: one atomic store call per decision, through a deny cache that
//     answers a key the store has refused until its retry time locally;
//   - lease: units taken from the store in batches, spent locally, given
//     back when the lease ends (lease.go);
//   - sync: local counts flushed to the store at most once per interval
//     per key (periodic.go);
//   - split and local: counted in the gateway's embedded store, under
//     limit / N or the whole limit;
//   - auto: lease for the rule's hot keys (hot.go), exact for the rest.
//
// A call it has nothing to do for (exact takes at their whole limit, not
// sharded, no deny cache: on the embedded store, every call but those of
// the modes above and of shards and regions) goes to the store as it came,
// without a copy; when Options.AllExact says that holds for every rule,
// without asking each take's rule its sharing either.
//
// Membership (membership.go) counts the live gateways sharing the store,
// for split and for the share each gateway counts while the store fails.
package share
