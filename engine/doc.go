// Package engine evaluates requests against a rule set: it selects the rules
// a request matches, builds each rule's key, and takes from every enforced
// rule in one store call, all or nothing. A request enters by one of three
// doors: [Engine.Check] (an HTTP request, from package httplimit's pipeline
// or the JSON API), [Engine.CheckDescriptors] (Envoy's descriptors) and
// [Engine.Charge] / [Engine.ChargeStatus] (a countOn rule's charge after the
// response). Around the one store call it adds what rules promise beyond a
// limit:
//
//   - shadow rules are evaluated in a call of their own and reported, never
//     enforced;
//   - countOn rules are checked with a dry run before the handler and charged
//     after it, only when the response status is listed ([Engine.Charge]);
//   - penalties lock a key out after repeated rejections, with the lock kept
//     in the store so it holds across gateways;
//   - the rule set reloads atomically ([Engine.Reload], [Engine.WatchFile]):
//     an invalid file is refused and the old rules keep serving, and rules
//     whose definition did not change keep their counts.
//
// Below rule evaluation sits the store client (package storecall,
// [Engine.Store]): every call to a remote store has a deadline, a breaker
// per node and a grace for late replies. When a call fails, each rule
// answers by its fail mode (failed): closed refuses; open admits within
// the gateway's share, its part of what the store last said was left of
// the key (follow, fallbackTake), and what it admits is owed to the store
// (storecall.Client.Owe) and written back when it answers. A rule may wait
// longer for a slow store (onSlowStore: wait).
// docs/architecture.md maps the hops; docs/redis.md states the bound.
package engine
