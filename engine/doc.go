// Package engine evaluates requests against a rule set: it selects the rules
// a request matches, builds each rule's key, and takes from every enforced
// rule in one store call, all or nothing. Around that one call it adds what
// rules promise beyond a limit:
//
//   - shadow rules are evaluated in a call of their own and reported, never
//     enforced;
//   - countOn rules are checked with a dry run before the handler and charged
//     after it, only when the response status is listed ([Engine.Charge]);
//   - penalties lock a key out after repeated rejections, with the lock kept
//     in the store so it holds across gateways;
//   - every store call has a deadline and goes through a circuit breaker; on
//     failure each rule fails open (with a loose per-node fallback limit) or
//     closed, as it says;
//   - the rule set reloads atomically ([Engine.Reload], [Engine.WatchFile]):
//     an invalid file is refused and the old rules keep serving, and rules
//     whose definition did not change keep their counts.
package engine
