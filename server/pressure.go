package server

import (
	"fmt"
	"net/http"
	"time"
)

// PressureJSON is the answer of GET and PUT /v1/pressure.
type PressureJSON struct {
	// Factor is what rules marked adaptive admit now, times their rate.
	Factor float64 `json:"factor"`
	// Measured is the factor from the answers the gateway observed (1 when
	// it observes none).
	Measured float64 `json:"measured"`
	// Set is an operator's factor and until when it applies (RFC 3339), if
	// one does.
	Set      *float64 `json:"set,omitempty"`
	SetUntil string   `json:"setUntil,omitempty"`
}

// PressureRequest is the body of PUT /v1/pressure.
type PressureRequest struct {
	// Factor, in (0, 1], applies for ForSeconds (default 60, at most a
	// day): the factor adaptive rules follow is then the smaller of it and
	// the measured one. 1 clears it.
	Factor     *float64 `json:"factor"`
	ForSeconds *int64   `json:"forSeconds"`
}

func (s *Server) pressureJSON() PressureJSON {
	p := s.o.Pressure
	out := PressureJSON{Factor: p.Factor(), Measured: p.Measured()}
	if f, until := p.SetUntil(); !until.IsZero() {
		out.Set, out.SetUntil = &f, until.UTC().Format(time.RFC3339Nano)
	}
	return out
}

func (s *Server) getPressure(w http.ResponseWriter, r *http.Request) {
	if s.o.Pressure == nil {
		writeProblem(w, http.StatusNotFound, "Not Found", "this process follows no pressure", "")
		return
	}
	writeJSON(w, http.StatusOK, s.pressureJSON())
}

func (s *Server) putPressure(w http.ResponseWriter, r *http.Request) {
	if s.o.Pressure == nil {
		writeProblem(w, http.StatusNotFound, "Not Found", "this process follows no pressure", "")
		return
	}
	var req PressureRequest
	if !decode(w, r, &req) {
		return
	}
	secs := int64(60)
	switch {
	case req.Factor == nil:
		writeBad(w, &badRequest{"factor", "missing: the share of their rate adaptive rules keep, in (0, 1]"})
		return
	case !(*req.Factor > 0 && *req.Factor <= 1):
		writeBad(w, &badRequest{"factor", fmt.Sprintf("want a share in (0, 1], got %v", *req.Factor)})
		return
	case req.ForSeconds != nil && (*req.ForSeconds < 1 || *req.ForSeconds > 86400):
		writeBad(w, &badRequest{"forSeconds", fmt.Sprintf("want 1 to 86400 seconds, got %d", *req.ForSeconds)})
		return
	case req.ForSeconds != nil:
		secs = *req.ForSeconds
	}
	if *req.Factor == 1 {
		secs = 0 // cleared
	}
	f := s.o.Pressure.Set(*req.Factor, time.Duration(secs)*time.Second)
	s.log.Info("sluice: pressure factor set by an operator", "factor", f, "for", time.Duration(secs)*time.Second)
	writeJSON(w, http.StatusOK, s.pressureJSON())
}
