package server

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/sluice-rl/sluice"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
)

// admin guards an admin handler: with a token, every call must carry it as
// "Authorization: Bearer <token>"; without one, admin calls are served only
// on a loopback listener, and only to requests that name this listener
// (sameListener).
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.o.AdminToken == "" {
			if !s.o.Loopback {
				writeProblem(w, http.StatusForbidden, "Forbidden", "admin endpoints need an admin token when the listener is not loopback", "")
				return
			}
			if why := s.sameListener(r); why != "" {
				writeProblem(w, http.StatusForbidden, "Forbidden", why, "")
				return
			}
			h(w, r)
			return
		}
		// The scheme is case-insensitive (RFC 9110, section 11.1), the token
		// compared in constant time.
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(token), []byte(s.o.AdminToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			writeProblem(w, http.StatusUnauthorized, "Unauthorized", "a valid admin bearer token is required", "")
			return
		}
		h(w, r)
	}
}

// scrape guards /metrics, which Prometheus reads without a token: on a
// loopback listener without an admin token, it answers only requests
// addressed to this listener, as the admin endpoints do, so that a web
// page cannot read the rules' counts through DNS rebinding. Elsewhere it
// is open (a listener beyond loopback is the operator's network to guard).
func (s *Server) scrape(h http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.o.AdminToken == "" && s.o.Loopback && !s.allowedHost(r.Host) {
			writeProblem(w, http.StatusForbidden, "Forbidden", fmt.Sprintf("/metrics answers only requests addressed to this listener (Host %q is not a loopback address, localhost or an --admin-allowed-hosts name)", r.Host), "")
			return
		}
		h.ServeHTTP(w, r)
	}
}

// sameListener says why a request to the admin endpoints without a token
// is refused, or "" if it is not. A loopback listener without a token is
// open to any program on the machine, and so, through a browser, to any web
// page its user opens: a page can send requests to 127.0.0.1, or to its
// own name made to resolve to 127.0.0.1 (DNS rebinding). So its Host must
// name this listener (a loopback address, localhost, or a name of
// AdminHosts), and a request that changes state must not come from another
// origin (its Origin, when a browser sends one, must name an allowed host
// too). A token, which a page cannot know, is the way for remote use.
func (s *Server) sameListener(r *http.Request) string {
	if !s.allowedHost(r.Host) {
		return fmt.Sprintf("the admin endpoints answer only requests addressed to this listener (Host %q is not a loopback address, localhost or an --admin-allowed-hosts name)", r.Host)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return ""
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return "" // not a browser's cross-origin request
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !s.allowedHost(u.Host) {
		return fmt.Sprintf("the admin endpoints do not take changes from another origin (%q)", origin)
	}
	return ""
}

// allowedHost reports whether a Host (or an origin's host) names this
// listener: a loopback address, localhost (or a name under .localhost), or
// one of AdminHosts, with any port.
func (s *Server) allowedHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return a.Unmap().IsLoopback()
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, h := range s.o.AdminHosts {
		if strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}

// RuleJSON describes one rule for GET /v1/rules.
type RuleJSON struct {
	ID            string   `json:"id"`
	Summary       string   `json:"summary"`
	Key           []string `json:"key"`
	Algorithm     string   `json:"algorithm"`
	Rate          int64    `json:"rate"`
	PeriodSeconds float64  `json:"periodSeconds"`
	Burst         int64    `json:"burst"`
	Cost          int64    `json:"cost"`
	Shadow        bool     `json:"shadow"`
	FailClosed    bool     `json:"failClosed"`
}

func (s *Server) listRules(w http.ResponseWriter, r *http.Request) {
	cfg := s.e.Config()
	w.Header().Set("Sluice-Rules-Version", cfg.Version)
	out := make([]RuleJSON, 0, len(cfg.Rules))
	for _, rule := range cfg.Rules {
		out = append(out, ruleJSON(rule, s.o.Region))
	}
	writeJSON(w, http.StatusOK, out)
}

func ruleJSON(r *rules.Rule, region string) RuleJSON {
	names := make([]string, len(r.Key))
	for i, src := range r.Key {
		names[i] = src.Name
	}
	return RuleJSON{
		ID: r.ID, Summary: r.SummaryIn(region), Key: names, Algorithm: r.Limit.Algorithm.String(),
		Rate: r.Limit.Rate, PeriodSeconds: r.Limit.Period.Seconds(), Burst: r.Limit.Capacity(),
		Cost: r.Cost, Shadow: r.Shadow, FailClosed: r.FailClosed,
	}
}

// StateJSON is one key's state for GET /v1/state.
type StateJSON struct {
	Rule         string `json:"rule"`
	Key          string `json:"key"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMs int64  `json:"resetAfterMs"`
	Locked       bool   `json:"locked"`
	// LockedForMs is how long the key's penalty lock has left (0: none).
	LockedForMs int64 `json:"lockedForMs"`
	// InDebt: the key was charged beyond its limit (usage reported after
	// the fact: /v1/charge, a settle, an Envoy usage report), so nothing
	// passes, not even a request of cost 0, until the debt is paid off, in
	// DebtPaidInMs. Remaining is then 0.
	InDebt       bool  `json:"inDebt"`
	DebtPaidInMs int64 `json:"debtPaidInMs"`
}

// stateKey reads the key a state request names: ?rule=R and the values of
// the rule's key sources as a user writes them, each by its source name
// (?rule=login&user=u42&ip=203.0.113.9), from which the key is built as the
// rules build it (an IPv6 address by its prefix, a hashed source hashed);
// or ?key=K, the key as the rules built it.
func (s *Server) stateKey(w http.ResponseWriter, r *http.Request) (rule, key string, ok bool) {
	q := r.URL.Query()
	rule, key = q.Get("rule"), q.Get("key")
	if rule == "" {
		writeBad(w, &badRequest{"rule", "give the rule, and its key: the values of its key sources by name (user=u42&ip=203.0.113.9), or key=K"})
		return "", "", false
	}
	cfg := s.e.Config()
	rr := cfg.Rule(rule)
	if rr == nil {
		writeProblem(w, http.StatusNotFound, "Not Found", "no such rule", "rule")
		return "", "", false
	}
	if key != "" {
		if len(rr.Key) == 1 && rr.Key[0].Kind == rules.FromIP {
			if a, err := netip.ParseAddr(key); err == nil {
				b, _ := rr.AppendKey(nil, &rules.Request{ClientIP: a}, "", cfg.IPv6Prefix)
				key = string(b)
			}
		}
		return rule, key, true
	}
	key, err := keyOf(cfg, rr, q.Get, "key=K")
	if err != nil {
		writeBad(w, err)
		return "", "", false
	}
	return rule, key, true
}

// keyOf builds the key of rule rr from the values of its key sources, each
// got by the source's name, as the rules build it (an IPv6 address by its
// prefix, a hashed source hashed). other names the other way to give the
// key, for the error when a value is missing.
func keyOf(cfg *rules.Config, rr *rules.Rule, value func(string) string, other string) (string, error) {
	req := &rules.Request{Attributes: map[string]string{}}
	var missing []string
	for _, src := range rr.Key {
		v := value(src.Name)
		if v == "" {
			missing = append(missing, src.Name)
			continue
		}
		if src.Kind == rules.FromIP {
			a, err := netip.ParseAddr(v)
			if err != nil {
				return "", &badRequest{src.Name, fmt.Sprintf("%q is not an IP address", v)}
			}
			req.ClientIP = a
			continue
		}
		req.Attributes[rules.AttributeName(src.Name)] = v
	}
	if len(missing) > 0 {
		return "", &badRequest{missing[0], fmt.Sprintf("rule %s is keyed by %s: give %s (or %s)", rr.ID, strings.Join(sourceNames(rr), " and "), strings.Join(missing, " and "), other)}
	}
	b, state := rr.AppendKey(nil, req, "", cfg.IPv6Prefix)
	if state != rules.KeyFound {
		return "", &badRequest{"rule", "the key could not be built from the values given"}
	}
	return string(b), nil
}

func sourceNames(r *rules.Rule) []string {
	out := make([]string, len(r.Key))
	for i, src := range r.Key {
		out[i] = src.Name
	}
	return out
}

func (s *Server) getState(w http.ResponseWriter, r *http.Request) {
	rule, key, ok := s.stateKey(w, r)
	if !ok {
		return
	}
	d, locked, err := s.e.Inspect(r.Context(), rule, key)
	if err != nil {
		s.adminError(w, err)
		return
	}
	st := StateJSON{Rule: rule, Key: key, Remaining: d.Remaining, ResetAfterMs: ms(d.ResetAfter), Locked: locked > 0, LockedForMs: ms(locked)}
	if !d.Allowed && d.Reason == sluice.ReasonLimited {
		// A look (a take of 0) is refused only while the key owes.
		st.InDebt, st.DebtPaidInMs = true, ms(d.RetryAfter)
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) deleteState(w http.ResponseWriter, r *http.Request) {
	rule, key, ok := s.stateKey(w, r)
	if !ok {
		return
	}
	found, err := s.e.Reset(rule, key)
	if err != nil {
		s.adminError(w, err)
		return
	}
	s.log.Info("sluice: key reset by an operator", "rule", rule)
	writeJSON(w, http.StatusOK, map[string]any{"rule": rule, "reset": found})
}

func (s *Server) adminError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrNoRule):
		writeProblem(w, http.StatusNotFound, "Not Found", "no such rule", "rule")
	case errors.Is(err, engine.ErrCannotReset):
		writeProblem(w, http.StatusNotImplemented, "Not Implemented", err.Error(), "")
	default:
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the store did not answer", "")
	}
}
