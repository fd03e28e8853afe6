package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rules"
)

// The overrides API, on the admin listener: an operator's change of one
// rule for some keys, in force in every process on the store within a
// second (docs/operations.md).
//
//	GET    /v1/overrides         the overrides in force; ETag: the set's version
//	PUT    /v1/overrides         set one (OverrideRequest); If-Match: "V" replaces version V,
//	                             If-None-Match: * only creates; with neither, it only creates
//	                             (an existing one answers 428 with its version)
//	GET    /v1/overrides/{id}    one; ETag: its version
//	DELETE /v1/overrides/{id}?by=WHO&reason=WHY
//	                             remove it; If-Match: "V" removes only version V

// OverrideRequest sets an override. The key is given as the rule's key
// sources' values by name (keyValues: {"api_key": "k-1"}, built as the
// rules build the key), as the key itself (key), or as a prefix of it
// (prefix). Expires is RFC 3339; for is a duration from now ("2h");
// untilRemoved: true for none.
type OverrideRequest struct {
	Rule         string            `json:"rule"`
	KeyValues    map[string]string `json:"keyValues"`
	Key          string            `json:"key"`
	Prefix       string            `json:"prefix"`
	Action       string            `json:"action"`
	Rate         int64             `json:"rate"`
	Per          string            `json:"per"`
	Burst        int64             `json:"burst"`
	Expires      string            `json:"expires"`
	For          string            `json:"for"`
	UntilRemoved bool              `json:"untilRemoved"`
	Reason       string            `json:"reason"`
	By           string            `json:"by"`
}

// OverridesResponse lists the overrides in force.
type OverridesResponse struct {
	Version   int64                 `json:"version"`
	Overrides []*overrides.Override `json:"overrides"`
}

func (s *Server) overridesOff(w http.ResponseWriter) bool {
	if s.o.Overrides == nil {
		writeProblem(w, http.StatusNotFound, "Not Found", "this process follows no overrides", "")
		return true
	}
	return false
}

func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	set := s.o.Overrides.Current()
	live := set.Live(time.Now())
	if live == nil {
		live = []*overrides.Override{}
	}
	w.Header().Set("ETag", etag(set.Version()))
	writeJSON(w, http.StatusOK, OverridesResponse{Version: set.Version(), Overrides: live})
}

func (s *Server) getOverride(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	id := r.PathValue("id")
	for _, o := range s.o.Overrides.Current().Live(time.Now()) {
		if o.ID == id {
			w.Header().Set("ETag", etag(o.Version))
			writeJSON(w, http.StatusOK, o)
			return
		}
	}
	writeProblem(w, http.StatusNotFound, "Not Found", "no override "+id+" is in force", "id")
}

func (s *Server) putOverride(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	var req OverrideRequest
	if !decode(w, r, &req) {
		return
	}
	now := time.Now()
	o, err := s.overrideOf(&req, now)
	if err == nil {
		err = o.Check(now)
	}
	if err == nil {
		err = s.e.CheckOverride(&o)
	}
	if err != nil {
		writeBad(w, fieldError(err))
		return
	}
	ifVersion, ok := precondition(w, r, true)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), storeWait)
	defer cancel()
	written, before, err := s.o.Overrides.Store.Put(ctx, o, ifVersion, now)
	if err != nil {
		s.storeRefused(w, r, err, overrides.IDOf(o.Rule, o.Key, o.Prefix), ifVersion, "set "+describeOverride(&o), o.By, o.Reason)
		return
	}
	change, status := "created", http.StatusCreated
	if before != nil {
		change, status = "replaced", http.StatusOK
	}
	s.changed(ctx, change, written, before, written.By, written.Reason)
	w.Header().Set("ETag", etag(written.Version))
	writeJSON(w, status, written)
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	by, reason := r.URL.Query().Get("by"), r.URL.Query().Get("reason")
	for _, f := range []struct{ name, v string }{{"by", by}, {"reason", reason}} {
		if f.v == "" || len(f.v) > overrides.MaxTextBytes || !utf8.ValidString(f.v) {
			writeBad(w, &badRequest{f.name, fmt.Sprintf("give ?%s= (UTF-8, at most %d bytes): who removes the override and why are logged", f.name, overrides.MaxTextBytes)})
			return
		}
	}
	ifVersion, ok := precondition(w, r, false)
	if !ok {
		return
	}
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), storeWait)
	defer cancel()
	before, err := s.o.Overrides.Store.Delete(ctx, id, ifVersion, time.Now())
	if err != nil {
		s.storeRefused(w, r, err, id, ifVersion, "remove", by, reason)
		return
	}
	s.changed(ctx, "removed", nil, before, by, reason)
	writeJSON(w, http.StatusOK, before)
}

// changed logs and counts a change, and reads the store again so that the
// change is in force in this process before it is answered.
func (s *Server) changed(ctx context.Context, change string, after, before *overrides.Override, by, reason string) {
	o := after
	if o == nil {
		o = before
	}
	s.log.Info("sluice: override "+change, "id", o.ID, "rule", o.Rule, "key", o.Key, "prefix", o.Prefix,
		"by", by, "reason", reason, "before", describeOverride(before), "after", describeOverride(after))
	s.metrics.OverrideChanged(change)
	// Its own wait: the change may have used all of the request's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeWait)
	defer cancel()
	if err := s.o.Overrides.Refresh(ctx); err != nil {
		s.log.Warn("sluice: override changed, but the overrides could not be read again; the follower will", "error", err)
	}
}

func describeOverride(o *overrides.Override) string {
	if o == nil {
		return "none"
	}
	var b strings.Builder
	b.WriteString(string(o.Action))
	if o.Action == overrides.Limit {
		burst := o.Burst
		if burst == 0 {
			burst = o.Rate
		}
		fmt.Fprintf(&b, " %d per %v, burst %d", o.Rate, o.Per.D(), burst)
	}
	if o.Prefix != "" {
		fmt.Fprintf(&b, " for keys starting %q", o.Prefix)
	}
	if o.UntilRemoved {
		b.WriteString(" until removed")
	} else {
		b.WriteString(" until " + o.Expires.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// storeRefused answers a store's refusal of a change: a version that moved
// (412), a missing precondition (428), a full store (409), an unknown id
// (404), a store that did not answer (503: nothing changed), or one whose
// answer was lost (503: the change was made before the deadline or never
// will be; logged with the change intended, so the audit trail has it).
func (s *Server) storeRefused(w http.ResponseWriter, r *http.Request, err error, id string, ifVersion int64, intended, by, reason string) {
	switch {
	case errors.Is(err, overrides.ErrVersion) && ifVersion == 0 && r.Header.Get("If-None-Match") == "":
		current := ""
		for _, o := range s.o.Overrides.Current().Live(time.Now()) {
			if o.ID == id {
				current = fmt.Sprintf(" (version %d)", o.Version)
			}
		}
		writeProblem(w, http.StatusPreconditionRequired, "Precondition Required",
			fmt.Sprintf("an override %s exists for this rule and key%s: send If-Match with its version to replace it", id, current), "")
	case errors.Is(err, overrides.ErrVersion):
		writeProblem(w, http.StatusPreconditionFailed, "Precondition Failed", "the override changed since the version given: read it again (GET /v1/overrides) and decide", "")
	case errors.Is(err, overrides.ErrFull):
		writeProblem(w, http.StatusConflict, "Conflict", err.Error(), "")
	case errors.Is(err, overrides.ErrNotFound):
		writeProblem(w, http.StatusNotFound, "Not Found", "no override "+id, "id")
	case errors.Is(err, overrides.ErrOutcomeUnknown):
		s.log.Warn("sluice: override change outcome unknown: the store took it and did not answer", "id", id,
			"by", by, "reason", reason, "intended", intended, "error", err)
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable",
			"the overrides' store took the change and did not answer ("+err.Error()+"): it was made in the "+storeWait.String()+
				" allowed or will never be; read GET /v1/overrides/"+id+" before trying again", "")
	default:
		s.log.Warn("sluice: an override change was refused: the store did not answer", "id", id, "intended", intended, "error", err)
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the overrides' store did not answer ("+err.Error()+"): nothing changed, and the overrides in force stay", "")
	}
}

// precondition reads If-Match ("V", the override's version, or *: any
// version, but one) and, for a PUT, If-None-Match: * (it must not exist);
// with neither, a PUT only creates and a DELETE removes whatever version
// there is.
func precondition(w http.ResponseWriter, r *http.Request, put bool) (int64, bool) {
	match, none := r.Header.Get("If-Match"), r.Header.Get("If-None-Match")
	switch {
	case match != "" && none != "":
		writeBad(w, &badRequest{"If-Match", "give If-Match or If-None-Match, not both"})
		return 0, false
	case none != "" && (none != "*" || !put):
		writeBad(w, &badRequest{"If-None-Match", `only If-None-Match: * is understood, on a PUT`})
		return 0, false
	case none != "":
		return 0, true
	case match == "" && put:
		return 0, true
	case match == "":
		return overrides.AnyVersion, true
	case match == "*":
		return overrides.Existing, true
	}
	v, err := strconv.ParseInt(strings.TrimPrefix(strings.Trim(match, `"`), "W/"), 10, 64)
	if err != nil || v < 1 {
		writeBad(w, &badRequest{"If-Match", fmt.Sprintf("%q: want the override's version as its ETag gives it, such as \"7\"", match)})
		return 0, false
	}
	return v, true
}

// storeWait bounds a change's calls to the overrides' store: a store that
// does not take the change within it never makes it (503, nothing
// changed) rather than holding the operator, or making it after the
// operator was told it failed.
const storeWait = 2 * time.Second

func etag(v int64) string { return `"` + strconv.FormatInt(v, 10) + `"` }

// overrideOf reads the request into an override, its key built.
func (s *Server) overrideOf(req *OverrideRequest, now time.Time) (overrides.Override, error) {
	o := overrides.Override{Rule: req.Rule, Key: req.Key, Prefix: req.Prefix, Action: overrides.Action(req.Action),
		Rate: req.Rate, Burst: req.Burst, UntilRemoved: req.UntilRemoved, Reason: req.Reason, By: req.By}
	if req.Per != "" {
		d, err := time.ParseDuration(req.Per)
		if err != nil {
			return o, &badRequest{"per", fmt.Sprintf("%q is not a duration such as 1m", req.Per)}
		}
		o.Per = overrides.Duration(d)
	}
	switch {
	case req.Expires != "" && req.For != "":
		return o, &badRequest{"for", "give expires or for, not both"}
	case req.Expires != "":
		t, err := time.Parse(time.RFC3339, req.Expires)
		if err != nil {
			return o, &badRequest{"expires", fmt.Sprintf("%q is not an RFC 3339 time such as 2026-12-05T18:00:00Z", req.Expires)}
		}
		o.Expires = t
	case req.For != "":
		d, err := time.ParseDuration(req.For)
		if err != nil || d <= 0 {
			return o, &badRequest{"for", fmt.Sprintf("%q is not a positive duration such as 2h", req.For)}
		}
		o.Expires = now.Add(d)
	}
	if len(req.KeyValues) > 0 {
		if req.Key != "" || req.Prefix != "" {
			return o, &badRequest{"keyValues", "give keyValues, key or prefix: one of them"}
		}
		rr := s.e.Config().Rule(req.Rule)
		if rr == nil {
			return o, &badRequest{"rule", fmt.Sprintf("no rule %q is in force", req.Rule)}
		}
		for name := range req.KeyValues {
			if !slices.Contains(sourceNames(rr), name) {
				return o, &badRequest{"keyValues", fmt.Sprintf("rule %s is keyed by %s, not %s", rr.ID, strings.Join(sourceNames(rr), " and "), name)}
			}
		}
		key, err := keyOf(s.e.Config(), rr, func(n string) string { return req.KeyValues[n] }, "key")
		if err != nil {
			return o, err
		}
		o.Key = engine.StoreKey(key)
	} else if o.Key != "" {
		key, err := rawKeyOf(s.e.Config(), req.Rule, req.Key)
		if err != nil {
			return o, err
		}
		o.Key = engine.StoreKey(key)
	}
	return o, nil
}

// rawKeyOf builds the key of a rule keyed by one source from key, that
// source's value, as the rules build it from a request: an address as the
// rule counts it (an IPv6 one by its prefix, also accepted as that
// prefix), a hashed source's value hashed (the secret itself is never
// kept), a normalised one normalised. A key that the rule could never
// build is refused rather than kept as an override that never applies.
func rawKeyOf(cfg *rules.Config, rule, key string) (string, error) {
	rr := cfg.Rule(rule)
	if rr == nil {
		return "", &badRequest{"rule", fmt.Sprintf("no rule %q is in force", rule)}
	}
	if len(rr.Key) != 1 {
		return "", &badRequest{"key", fmt.Sprintf("rule %s is keyed by %s: give keyValues, one value per source", rr.ID, strings.Join(sourceNames(rr), " and "))}
	}
	src := rr.Key[0]
	switch {
	case src.Kind == rules.FromIP && strings.Contains(key, "/"):
		p, err := netip.ParsePrefix(key)
		if err != nil || !p.Addr().Is6() || p.Bits() != cfg.IPv6Prefix {
			return "", &badRequest{"key", fmt.Sprintf("%q: rule %s counts an IPv4 client by its address and an IPv6 one by its /%d: give an address, or that prefix", key, rr.ID, cfg.IPv6Prefix)}
		}
		key = p.Addr().String()
	case src.Kind == rules.FromIP && strings.Contains(key, "%"):
		return "", &badRequest{"key", fmt.Sprintf("%q: a zone names an interface of this host, not a client: give the address alone", key)}
	case src.Scheme != "":
		// The whole header value pasted ("Bearer k-…") means its token,
		// as the rule reads it.
		if scheme, token, ok := strings.Cut(key, " "); ok && strings.EqualFold(scheme, src.Scheme) {
			key = strings.TrimSpace(token)
		}
	}
	built, err := keyOf(cfg, rr, func(string) string { return key }, "key")
	var bad *badRequest
	if errors.As(err, &bad) {
		bad.field = "key"
	}
	return built, err
}

// fieldError turns a validation error into a 400's.
func fieldError(err error) error {
	var fe *overrides.FieldError
	if errors.As(err, &fe) {
		return &badRequest{fe.Field, fe.Problem}
	}
	return err
}
