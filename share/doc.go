// Package share is how a rule's limit is shared among the gateways that use
// one store. This first part is membership: each gateway keeps a short-lived
// heartbeat in the store and counts the live ones, so that while the store
// fails, a degraded gateway counts only its share of a limit (limit / N), and
// N degraded gateways together admit about the limit, not N times it.
package share
