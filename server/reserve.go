package server

import (
	"errors"
	"net/http"

	"github.com/sluice-rl/sluice/engine"
)

// reserve is POST /v1/reserve: a check that reserves an estimate on the
// rules with a reserve section, answered as /v1/check plus the id and
// deadline of the reservations.
func (s *Server) reserve(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	if !decode(w, r, &req) {
		return
	}
	rr, opt, err := toCheck(&req)
	if err != nil {
		writeBad(w, err)
		return
	}
	if opt.DryRun {
		writeBad(w, &badRequest{"dryRun", "a dry run reserves nothing: use /v1/check"})
		return
	}
	opt.Reserve = true
	var res engine.Result
	if err := s.traceCheck(r, rr, opt, &res); err != nil {
		writeBad(w, &badRequest{"", err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, s.respond(&res))
}

// SettleRequest is the body of POST /v1/settle.
type SettleRequest struct {
	// ID is a reservation's id, from /v1/reserve.
	ID string `json:"id"`
	// Actual is the real cost; Cancel gives the whole estimate back (as
	// an actual of 0). Give one of them.
	Actual *int64 `json:"actual"`
	Cancel bool   `json:"cancel"`
}

// SettleResponse is the answer of POST /v1/settle: one entry per rule the
// reservation was counted under.
type SettleResponse struct {
	Settled []SettledJSON `json:"settled"`
}

// SettledJSON is one rule's part of a settle.
type SettledJSON struct {
	Rule string `json:"rule"`
	// Settled is true when the reservation was open and is now settled;
	// else Reason says why not: no-reservation (settled already,
	// cancelled, or past its deadline, when the estimate stood) or
	// no-rule (the rule is gone from the rule set, or no longer reserves).
	Settled bool   `json:"settled"`
	Reason  string `json:"reason"`
	// The key's state after the settle: a key in debt has 0 remaining
	// until it is paid off, and its reset lies further ahead.
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"resetAfterMs"`
}

func (s *Server) settle(w http.ResponseWriter, r *http.Request) {
	var req SettleRequest
	if !decode(w, r, &req) {
		return
	}
	var actual int64
	switch {
	case req.ID == "":
		writeBad(w, &badRequest{"id", "missing: the id /v1/reserve answered"})
		return
	case req.Actual != nil && req.Cancel:
		writeBad(w, &badRequest{"cancel", "give actual or cancel, not both"})
		return
	case req.Actual == nil && !req.Cancel:
		writeBad(w, &badRequest{"actual", "missing: the real cost, or cancel: true"})
		return
	case req.Actual != nil && *req.Actual < 0:
		writeBad(w, &badRequest{"actual", "must be >= 0"})
		return
	case req.Actual != nil:
		actual = *req.Actual
	}
	out, err := s.e.Settle(r.Context(), req.ID, actual)
	switch {
	case errors.Is(err, engine.ErrBadReservation):
		writeBad(w, &badRequest{"id", "not a reservation id: pass the id /v1/reserve answered, unchanged"})
		return
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable",
			"the store did not answer; the reservation stands at its estimate until settled again or past its deadline", "")
		return
	}
	resp := SettleResponse{Settled: make([]SettledJSON, len(out))}
	for i, st := range out {
		reason := st.Reason.String()
		if !st.Reserved {
			reason = "no-rule"
		}
		if st.Allowed {
			reason = "settled"
		}
		resp.Settled[i] = SettledJSON{
			Rule: st.Rule, Settled: st.Allowed, Reason: reason,
			Remaining: st.Remaining, ResetAfterMs: ms(st.ResetAfter),
		}
	}
	writeJSON(w, http.StatusOK, resp)
}
