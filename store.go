package sluice

import (
	"context"
	"errors"
	"time"
)

// Take asks a [Store] for Cost units from the bucket or window of one
// (Rule, Key) pair, governed by Limit.
type Take struct {
	Rule  string // the rule's id: a namespace for keys
	Key   string // the rate-limit key within the rule, such as a user id
	Limit Limit
	// Cost is the number of units to take. 0 peeks: the decision reports the
	// key's state and consumes nothing; it is allowed unless the key is over
	// its limit, in debt after a charge (see Charge), and then refused until
	// the debt is paid off, as Envoy's zero-hit check expects. A negative cost gives -Cost units
	// back (a request admitted but never served); a key never becomes fuller
	// than a fresh one, and a refund is applied whatever the other takes of
	// the call decide.
	Cost int64
	// Floor, when above 0, makes the take leave at least Floor units: it
	// is allowed only if a take of Cost + Floor would be, and consumes
	// Cost. Priority tiers share a limit this way, each lower tier kept
	// off the share of the tiers above it. The decision's Remaining is
	// what is left above the floor, its RetryAfter the time until Cost +
	// Floor units are there.
	Floor int64

	// Hold names a reservation of (Rule, Key): an id the caller chose hard
	// to guess, at most MaxHoldLen bytes. A reservation takes an estimate
	// now and settles the real cost later, for costs known only after the
	// response (tokens, bytes, compute time).
	//
	// With Settle false, a take that is allowed, not a dry run, and whose
	// call admits every take opens the reservation: the store remembers
	// Cost for (Rule, Key, Hold) until HoldFor has passed. Giving the units
	// back (a negative Cost with the same Hold) closes it unsettled.
	//
	// With Settle true, the take settles the reservation at Cost units, if
	// it is still open: the store closes it and applies Cost minus the
	// units reserved, giving back the difference if it is negative and, if
	// it is positive, charging it even beyond the limit, which leaves the
	// key in debt (later takes wait until it is paid off). The decision is
	// then allowed and reports the key as it stands after settling. A
	// reservation that is closed, expired or never opened answers
	// ReasonNoReservation and changes nothing, so a settle applies at most
	// once; an unsettled reservation stands at its estimate. A settle
	// applies whatever the other takes of the call decide.
	Hold    string
	HoldFor time.Duration
	Settle  bool
	// DryRun decides the take as usual but consumes nothing: the decision
	// is the one the real take would get (its Remaining as if taken).
	DryRun bool

	// Charge applies Cost units (above 0) whatever the limit says and
	// whatever the other takes of the call decide, leaving the key in debt
	// if need be (later takes wait until it is paid off, see Settle): for
	// units already spent elsewhere, such as the admissions a gateway made
	// on its own while the store could not be reached, written back once
	// it answers. The decision is allowed and reports the key as it stands
	// after the charge.
	Charge bool

	// Was lists limits the key may have been counted under before Limit:
	// an operator's override set or ended, a rule file reloaded with
	// another limit for the rule. When the key has no state under Limit,
	// the store looks for it under each of Was in turn; the first state it
	// finds is moved to Limit, converted so that what the key spent stays
	// spent (algo's Carry), in one atomic step before the take. A limit of
	// another algorithm is passed over. Was is empty for a rule whose limit
	// never changed: then the take costs nothing more.
	Was []Limit
}

// SendBy is implemented by the context of a store call that its caller
// follows past the time it answers its own client without the call: the
// context lasts as long as the caller listens for the reply (to learn what
// the call applied), and SendBy is when the caller stopped waiting for it.
// A store that queues calls before sending them does not send one still
// queued, or to be sent again, after SendBy: it answers ErrNotSent. So a
// backlog of calls no one waits for is not piled on a store already slow,
// and the caller knows the call applied nothing.
type SendBy interface {
	SendBy() time.Time
}

// ErrNotSent is a store's answer to a call it did not send (see SendBy):
// the call applied nothing.
var ErrNotSent = errors.New("sluice: store call not sent: its caller had stopped waiting")

// PastSendBy reports whether ctx is a call's context whose SendBy has
// passed: a store that queues calls sends it no more.
func PastSendBy(ctx context.Context) bool {
	sb, ok := ctx.(SendBy)
	return ok && time.Now().After(sb.SendBy())
}

// MaxHoldLen bounds a reservation id ([Take.Hold]).
const MaxHoldLen = 64

// Store keeps per-key limiter state and decides takes against it.
//
// Take decides every take in takes as one atomic step and writes the i-th
// decision to out[i] (len(out) must be at least len(takes)): if any take is
// not allowed, none of them consumes anything, and each decision reports what
// its key would have answered alone. A store reads time from its own clock.
// Take returns an error when the store cannot answer (a network failure, a
// deadline or an invalid limit), and out then holds no decisions a caller
// may read. Take must return promptly once ctx is done, must not modify
// takes, and must not retain takes, out or the Key strings after it
// returns: callers may reuse all three.
type Store interface {
	Take(ctx context.Context, takes []Take, out []Decision) error
}

// NonBlocking is implemented by stores whose Take never waits on I/O, such
// as the embedded store: callers need not bound them with a deadline or a
// circuit breaker.
type NonBlocking interface {
	NonBlocking()
}
