package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// Reserve now, settle later: for costs known only after the response (LLM
// tokens, bytes sent, compute time). A check with CheckOptions.Reserve takes
// each reserve rule's estimate and opens a reservation in the store; Settle
// charges the real cost instead, giving back what the estimate overstated or
// charging what it understated, even beyond the limit (the key is then in
// debt and later requests wait). A reservation not settled before the rule's
// deadline stands at its estimate.
//
// The reservation is kept by the store beside each key (sluice.Take.Hold),
// so any process sharing the store can settle it, and a settle applies at
// most once. Its id, Result.Reservation, carries what Settle needs to find
// the keys: a random 128-bit store id and the (rule, key) pairs, in
// URL-safe base64. The random part is what makes it unforgeable: an id
// edited to name another key finds no reservation there.

// MaxReservationLen bounds the reservation ids Settle accepts.
const MaxReservationLen = 4096

// ErrBadReservation is returned by Settle for an id it did not make.
var ErrBadReservation = errors.New("engine: not a reservation id")

// estimateFor returns the units a reserve rule takes for this check: the
// caller's estimate, else the request's estimate header or body field (a
// whole number above 0), else the rule's.
func (res *Result) estimateFor(rv *rules.Reserve, req *rules.Request) int64 {
	if res.estimate > 0 {
		return res.estimate
	}
	if rv.EstimateHeader != "" && req.Header != nil {
		if v := req.Header.Get(rv.EstimateHeader); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	if rv.EstimateBody != "" {
		if n, ok := rules.BodyNumber(req, rv.EstimateBody); ok {
			return n
		}
	}
	return rv.Estimate
}

// holdID returns the check's store id for its reservations, making it on
// first use.
func (res *Result) holdID() string {
	if res.hold == "" {
		rand.Read(res.nonce[:])
		res.hold = hex.EncodeToString(res.nonce[:])
	}
	return res.hold
}

// reserved names the reservations an admitted check opened.
func (e *Engine) reserved(res *Result) {
	if !res.Allowed || res.hold == "" {
		return
	}
	b := append([]byte{1}, res.nonce[:]...) // version 1
	var deadline time.Duration
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !st.hold {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(st.r.ID)))
		b = append(b, st.r.ID...)
		b = binary.AppendUvarint(b, uint64(len(st.key)))
		b = append(b, st.key...)
		if d := st.r.Reserve.Deadline; deadline == 0 || d < deadline {
			deadline = d
		}
	}
	if deadline == 0 {
		return
	}
	res.Reservation = base64.RawURLEncoding.EncodeToString(b)
	res.ReservationDeadline = time.Now().Add(deadline)
}

// reservation is a decoded id.
type reservation struct {
	hold  string
	pairs [][2]string // rule id, key
}

func parseReservation(id string) (reservation, error) {
	if len(id) > MaxReservationLen {
		return reservation{}, ErrBadReservation
	}
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < 17 || b[0] != 1 {
		return reservation{}, ErrBadReservation
	}
	r := reservation{hold: hex.EncodeToString(b[1:17])}
	b = b[17:]
	next := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	for len(b) > 0 {
		rule, ok1 := next()
		key, ok2 := next()
		if !ok1 || !ok2 {
			return reservation{}, ErrBadReservation
		}
		r.pairs = append(r.pairs, [2]string{rule, key})
	}
	if len(r.pairs) == 0 {
		return reservation{}, ErrBadReservation
	}
	return r, nil
}

// Settled is one rule's part in a settle.
type Settled struct {
	sluice.Decision // Allowed: settled; else Reason says why not
	// Key is the key the reservation was counted under (hashed key sources
	// appear as their digest).
	Key string
	// Reserved is false when the rule is no longer in the rule set, or no
	// longer reserves: nothing was settled for it.
	Reserved bool
}

// Settle settles the reservations of id (a Result.Reservation) at actual
// units (times each rule's cost): the difference from the estimate is given
// back or charged. actual 0 cancels, giving the whole estimate back. Each
// reservation settles at most once; one already settled, cancelled or past
// its deadline answers sluice.ReasonNoReservation and changes nothing. An
// error means the id is not one Engine made, or the store failed (the
// reservations then stand at their estimates until settled again or
// expired).
func (e *Engine) Settle(ctx context.Context, id string, actual int64) ([]Settled, error) {
	if actual < 0 {
		return nil, fmt.Errorf("engine: actual must be >= 0, got %d", actual)
	}
	r, err := parseReservation(id)
	if err != nil {
		return nil, err
	}
	rs := e.set.Load()
	out := make([]Settled, len(r.pairs))
	var takes []sluice.Take
	var idx []int
	var reserving []*rule
	for i, p := range r.pairs {
		out[i] = Settled{Decision: sluice.Decision{Rule: p[0], Reason: sluice.ReasonNoReservation}, Key: p[1]}
		rule := rs.find(p[0])
		if rule == nil || rule.Reserve == nil {
			continue
		}
		out[i].Reserved, out[i].Limit = true, rule.Limit
		takes = append(takes, sluice.Take{Rule: rule.ID, Key: p[1], Limit: rule.store, Cost: mulCost(rule.Cost, actual), Hold: r.hold, Settle: true})
		idx, reserving = append(idx, i), append(reserving, rule)
	}
	if len(takes) == 0 {
		return out, nil
	}
	decs := make([]sluice.Decision, len(takes))
	if err := e.client.Take(ctx, storecall.Call{}, takes, decs); err != nil {
		return nil, err
	}
	for j, i := range idx {
		out[i].Decision = decs[j]
		if decs[j].Allowed {
			reserving[j].stats.settled.Add(1)
		} else {
			reserving[j].stats.unsettled.Add(1)
		}
	}
	return out, nil
}

// SettleResult settles the reservations a check opened in this process
// (Result.Reservation), each reserve rule at actual(rule), or at its
// estimate when actual reports false (the reservation closes unchanged):
// the gateway's settlement from the upstream's response. Call it at most
// once per result; it reports the store's error, if any.
func (e *Engine) SettleResult(ctx context.Context, res *Result, actual func(*rules.Reserve) (int64, bool)) error {
	if res.hold == "" {
		return nil
	}
	var takes []sluice.Take
	var rs []*rule
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !st.hold {
			continue
		}
		st.hold = false
		cost := st.taken
		if n, ok := actual(st.r.Reserve); ok && n >= 0 {
			cost = mulCost(st.r.Cost, n)
		}
		takes = append(takes, sluice.Take{Rule: st.r.ID, Key: st.key, Limit: st.r.store, Cost: cost, Hold: res.hold, Settle: true})
		rs = append(rs, st.r)
	}
	if len(takes) == 0 {
		return nil
	}
	decs := make([]sluice.Decision, len(takes))
	if err := e.client.Take(context.WithoutCancel(ctx), storecall.Call{}, takes, decs); err != nil {
		return err
	}
	for j, d := range decs {
		if d.Allowed {
			rs[j].stats.settled.Add(1)
		} else {
			rs[j].stats.unsettled.Add(1)
		}
	}
	return nil
}

// Settles reports whether the result holds reservations to settle.
func (res *Result) Settles() bool { return res.Reservation != "" }
