// Package view reads a byte slice as a string without copying it: the one
// place sluice does, so that the rule it relies on is written once.
//
// The rule: a view is valid only while its bytes do not change. A caller
// that views a buffer it reuses (a request's key buffer, a fasthttp
// request's header) must not write the buffer again while the view is in
// use, and whoever receives the view must not keep it past the call that
// received it: sluice's stores copy what they keep (sluice.Store's
// contract, held by store/storetest), and the engine copies a key before
// it outlives a request (its ledger of what is owed, its late calls).
package view

import "unsafe"

// String is b as a string, sharing b's memory; "" for an empty b.
func String(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
