package sluice

import (
	"fmt"
	"time"
)

// Reason says why a [Decision] came out as it did.
type Reason uint8

// The reasons.
const (
	// ReasonOK: the request was admitted (or, for a cost of 0, looked at).
	ReasonOK Reason = iota
	// ReasonLimited: the key has too little left now; RetryAfter says when
	// the same cost will be admitted.
	ReasonLimited
	// ReasonTooLarge: the cost exceeds the burst (or the window's limit), so
	// no amount of waiting admits it. RetryAfter is 0: do not retry.
	ReasonTooLarge
	// ReasonLocked: a penalty locks the key out; RetryAfter is the time left.
	ReasonLocked
	// ReasonUnavailable: the store failed and the rule fails closed.
	ReasonUnavailable
	// ReasonMissingKey: the request lacks a source of the rule's key and the
	// rule rejects such requests.
	ReasonMissingKey
	// ReasonNoReservation: a settle found no open reservation (never
	// opened, already settled or cancelled, or past its deadline, when it
	// stands at its estimate); nothing changed.
	ReasonNoReservation
	// ReasonBadRequest: the request cannot be counted as its upstream
	// would read it (a path servers read in different ways, a key given
	// twice with different values, a body too large to read its key from):
	// it is refused, and nothing is counted.
	ReasonBadRequest
)

var reasonNames = [...]string{
	ReasonOK:          "ok",
	ReasonLimited:     "limited",
	ReasonTooLarge:    "cost-exceeds-limit",
	ReasonLocked:      "locked",
	ReasonUnavailable: "unavailable",
	ReasonMissingKey:  "missing-key",

	ReasonNoReservation: "no-reservation",
	ReasonBadRequest:    "bad-request",
}

// String returns the reason's stable name, such as "limited".
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the answer for one (rule, key) take, or the combined answer for
// a request that several rules apply to.
type Decision struct {
	// Allowed reports whether the cost was admitted (and consumed).
	Allowed bool
	// Reason says why; ReasonOK when allowed.
	Reason Reason
	// Rule is the id of the deciding rule.
	Rule string
	// Limit is the deciding rule's limit.
	Limit Limit
	// Remaining is the whole number of units that could be taken right after
	// this decision.
	Remaining int64
	// RetryAfter is, when not allowed, the time until the same cost would be
	// admitted; 0 when allowed or when waiting cannot help (ReasonTooLarge).
	RetryAfter time.Duration
	// ResetAfter is the time until the key is back to its full, idle state.
	ResetAfter time.Duration
	// Delay is, for an admitted leaky-queue request, the time it waits in the
	// queue before it leaves; 0 for every other algorithm.
	Delay time.Duration
}
