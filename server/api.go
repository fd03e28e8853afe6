package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/httplimit"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// maxBody bounds a request body of the API; maxBatch the checks in a batch.
const (
	maxBody  = 1 << 20
	maxBatch = 1000
)

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	// Request describes the request to check, for rules to extract keys
	// from (all fields optional).
	Request *RequestInfo `json:"request"`
	// Attributes supply key source values directly, by source name.
	Attributes Names `json:"attributes"`
	// Cost multiplies each rule's cost (default 1).
	Cost *int64 `json:"cost"`
	// DryRun decides without consuming anything.
	DryRun bool `json:"dryRun"`
	// Status, for POST /v1/charge only, is the response status to charge
	// countOn rules for.
	Status int `json:"status"`
	// Estimate is what the rules with a reserve section take (times their
	// cost) instead of their own estimate: for POST /v1/reserve, and for
	// /v1/check, which takes it for good.
	Estimate *int64 `json:"estimate"`
}

// RequestInfo is the request a check is about.
type RequestInfo struct {
	Method  string `json:"method"`
	Path    string `json:"path"` // may carry ?query
	Host    string `json:"host"`
	IP      string `json:"ip"`
	Headers Names  `json:"headers"`
}

// Names maps names to values, as the JSON API's attributes and headers.
// Decoded from JSON, a name given twice is refused, as is the object given
// twice ("attributes" and "Attributes", which Go's decoder reads as one
// field): Go would keep the last, another decoder the first, and the caller
// would not know which one a rule counted.
type Names map[string]string

// UnmarshalJSON decodes a JSON object of strings, refusing repeats.
func (n *Names) UnmarshalJSON(b []byte) error {
	if *n != nil {
		return errGivenTwice{"the object"}
	}
	if string(b) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return &json.UnmarshalTypeError{Value: "non-object", Type: reflect.TypeFor[map[string]string]()}
	}
	m := Names{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		k := t.(string)
		var v string
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if _, ok := m[k]; ok {
			return errGivenTwice{fmt.Sprintf("%q", k)}
		}
		m[k] = v
	}
	*n = m
	return nil
}

// errGivenTwice is a name, or an object, given twice in a request body.
type errGivenTwice struct{ what string }

func (e errGivenTwice) Error() string {
	return e.what + " is given twice: decoders differ on which one they read"
}

// CheckResponse is the answer of POST /v1/check.
type CheckResponse struct {
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule"`
	Reason  string `json:"reason"`
	// Status is the HTTP status the gateway and forward-auth answer for
	// this decision: 200, 429 for a spent quota (or the deciding rule's
	// own status: 503, as nginx answers), 503 when the service's
	// pressure reduced an adaptive rule (reason reduced-capacity) or a
	// fail-closed rule lost its store, 400 for a request that cannot be
	// counted. A caller relaying the decision answers it.
	Status       int               `json:"status"`
	RetryAfterMs int64             `json:"retryAfterMs"`
	DelayMs      int64             `json:"delayMs"`
	Statuses     []StatusJSON      `json:"statuses"`
	Headers      map[string]string `json:"headers"`
	// Detail says why a request refused as bad-request cannot be counted
	// (a path servers read in different ways, a key given twice).
	Detail string `json:"detail,omitempty"`
	// Degraded is true when the store failed and the rules were answered by
	// their fail modes (fail-open rules within their per-gateway share);
	// DegradedReason says why.
	Degraded       bool   `json:"degraded,omitempty"`
	DegradedReason string `json:"degradedReason,omitempty"`
	// ID names the reservations POST /v1/reserve opened (none if the
	// request was refused or no reserve rule applied), for POST
	// /v1/settle; Deadline is when the first of them stands at its
	// estimate if not settled (RFC 3339).
	ID       string `json:"id,omitempty"`
	Deadline string `json:"deadline,omitempty"`
	// Overrides names the operators' overrides that applied to the
	// request: one that exempts a key leaves no status of its rule.
	Overrides []AppliedOverrideJSON `json:"overrides,omitempty"`
}

// AppliedOverrideJSON is an override that applied to a request.
type AppliedOverrideJSON struct {
	Rule   string `json:"rule"`
	ID     string `json:"id"`
	Action string `json:"action"`
}

// StatusJSON is one rule's part of a CheckResponse.
type StatusJSON struct {
	Rule          string  `json:"rule"`
	Allowed       bool    `json:"allowed"`
	Shadow        bool    `json:"shadow"`
	Reason        string  `json:"reason"`
	Limit         int64   `json:"limit"`
	PeriodSeconds float64 `json:"periodSeconds"`
	Burst         int64   `json:"burst"`
	Remaining     int64   `json:"remaining"`
	ResetAfterMs  int64   `json:"resetAfterMs"`
	RetryAfterMs  int64   `json:"retryAfterMs"`
	DelayMs       int64   `json:"delayMs,omitempty"`
	// Override is the id of the operator's override that set this rule's
	// limit for the key, or blocked it.
	Override string `json:"override,omitempty"`
}

// badRequest is a fault in a request to the API, with the field at fault.
type badRequest struct {
	field, msg string
}

func (e *badRequest) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	if !decode(w, r, &req) {
		return
	}
	resp, err := s.decide(r, &req)
	if err != nil {
		writeBad(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) checkBatch(w http.ResponseWriter, r *http.Request) {
	var reqs []CheckRequest
	if !decode(w, r, &reqs) {
		return
	}
	if len(reqs) > maxBatch {
		writeBad(w, &badRequest{"", fmt.Sprintf("a batch holds at most %d checks, got %d", maxBatch, len(reqs))})
		return
	}
	// Validate every check before deciding any: a batch answered 400 has
	// consumed nothing.
	type valid struct {
		req *rules.Request
		opt engine.CheckOptions
	}
	checks := make([]valid, len(reqs))
	for i := range reqs {
		rr, opt, err := toCheck(&reqs[i])
		if err != nil {
			var br *badRequest
			if errors.As(err, &br) {
				br.field = fmt.Sprintf("[%d].%s", i, br.field)
			}
			writeBad(w, err)
			return
		}
		checks[i] = valid{rr, opt}
	}
	out := make([]*CheckResponse, len(reqs))
	for i, c := range checks {
		var res engine.Result
		if err := s.traceCheck(r, c.req, c.opt, &res); err != nil {
			writeBad(w, &badRequest{fmt.Sprintf("[%d]", i), err.Error()})
			return
		}
		out[i] = s.respond(&res)
	}
	writeJSON(w, http.StatusOK, out)
}

// ChargeResponse is the answer of POST /v1/charge.
type ChargeResponse struct {
	Charged []StatusJSON `json:"charged"`
	// Degraded is true when the store did not take the charges: they were
	// counted in this gateway's share and are written back once it
	// answers. DegradedReason says why.
	Degraded       bool   `json:"degraded,omitempty"`
	DegradedReason string `json:"degradedReason,omitempty"`
}

// charge reports a response's status for countOn rules: they were checked by
// /v1/check before the response, and count only responses they list.
func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Status < 100 || req.Status > 599 {
		writeBad(w, &badRequest{"status", fmt.Sprintf("want the response's HTTP status, got %d", req.Status)})
		return
	}
	rr, opt, err := toRequest(&req)
	if err != nil {
		writeBad(w, err)
		return
	}
	var res engine.Result
	if err := s.e.ChargeStatus(r.Context(), rr, opt, req.Status, &res); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the charge could not be counted", "")
		return
	}
	resp := s.respond(&res)
	out := ChargeResponse{Charged: resp.Statuses, Degraded: resp.Degraded, DegradedReason: resp.DegradedReason}
	writeJSON(w, http.StatusOK, out)
}

// traceCheck is the engine's Check of an API request, inside a decision's span
// when tracing is on.
func (s *Server) traceCheck(r *http.Request, req *rules.Request, opt engine.CheckOptions, res *engine.Result) error {
	ctx, span := s.o.Tracer.StartHTTP(r.Context(), "http", r.Header)
	err := s.e.Check(ctx, req, opt, res)
	span.End(res, err)
	return err
}

// decide runs one check of the API.
func (s *Server) decide(r *http.Request, req *CheckRequest) (*CheckResponse, error) {
	rr, opt, err := toCheck(req)
	if err != nil {
		return nil, err
	}
	var res engine.Result
	if err := s.traceCheck(r, rr, opt, &res); err != nil {
		return nil, &badRequest{"", err.Error()}
	}
	return s.respond(&res), nil
}

// toCheck validates a request to /v1/check.
func toCheck(req *CheckRequest) (*rules.Request, engine.CheckOptions, error) {
	if req.Status != 0 {
		return nil, engine.CheckOptions{}, &badRequest{"status", "only /v1/charge takes a status"}
	}
	return toRequest(req)
}

// toRequest validates an API request and turns it into what rules see.
func toRequest(req *CheckRequest) (*rules.Request, engine.CheckOptions, error) {
	rr := rules.Request{Method: "GET", Path: "/", BodyUnseen: true} // body sources come as attributes
	if len(req.Attributes) > 0 {
		// Names are case-insensitive, as header names are: two spellings
		// of one name would let a caller choose which a rule reads.
		rr.Attributes = make(map[string]string, len(req.Attributes))
		spelled := make(map[string]string, len(req.Attributes))
		for k, v := range req.Attributes {
			name := rules.AttributeName(k)
			if other, ok := spelled[name]; ok {
				return nil, engine.CheckOptions{}, &badRequest{"attributes", fmt.Sprintf("%q and %q name one attribute (names are case-insensitive)", min(k, other), max(k, other))}
			}
			spelled[name] = k
			rr.Attributes[name] = v
		}
	}
	if info := req.Request; info != nil {
		if info.Method != "" {
			rr.Method = strings.ToUpper(info.Method)
		}
		if info.Path != "" {
			if !strings.HasPrefix(info.Path, "/") {
				return nil, engine.CheckOptions{}, &badRequest{"request.path", fmt.Sprintf("%q must start with /", info.Path)}
			}
			rr.Path, rr.RawQuery, _ = strings.Cut(info.Path, "?")
		}
		rr.Host = info.Host
		if info.IP != "" {
			ip, err := netip.ParseAddr(info.IP)
			if err != nil {
				return nil, engine.CheckOptions{}, &badRequest{"request.ip", fmt.Sprintf("%q is not an IP address", info.IP)}
			}
			rr.ClientIP = ip.Unmap().WithZone("")
		}
		if len(info.Headers) > 0 {
			rr.Header = make(http.Header, len(info.Headers))
			spelled := make(map[string]string, len(info.Headers))
			for k, v := range info.Headers {
				ck := http.CanonicalHeaderKey(k)
				if other, ok := spelled[ck]; ok {
					return nil, engine.CheckOptions{}, &badRequest{"request.headers", fmt.Sprintf("%q and %q name one header (header names are case-insensitive)", min(k, other), max(k, other))}
				}
				spelled[ck] = k
				rr.Header.Set(k, v)
			}
		}
	}
	opt := engine.CheckOptions{DryRun: req.DryRun}
	if req.Cost != nil {
		if *req.Cost < 1 {
			return nil, opt, &badRequest{"cost", fmt.Sprintf("must be >= 1, got %d", *req.Cost)}
		}
		opt.Cost = *req.Cost
	}
	if req.Estimate != nil {
		if *req.Estimate < 1 {
			return nil, opt, &badRequest{"estimate", fmt.Sprintf("must be >= 1, got %d", *req.Estimate)}
		}
		opt.Estimate = *req.Estimate
	}
	return &rr, opt, nil
}

// degradedReason says why an answer is degraded, in words fit for any
// client: never the store's own error, which may name addresses or, from a
// misconfigured URL, a password. The log and /readyz say more.
func degradedReason(err error) string {
	switch {
	case errors.Is(err, storecall.ErrBreakerOpen):
		return "the store's circuit breaker is open"
	case errors.Is(err, context.DeadlineExceeded):
		return "the store did not answer in time"
	default:
		return "the store could not be reached"
	}
}

// respond turns an engine result into the API's answer, headers included.
func (s *Server) respond(res *engine.Result) *CheckResponse {
	d := &res.Decision
	resp := &CheckResponse{
		Allowed: res.Allowed, Rule: d.Rule, Reason: reasonOf(res.Reason, res.Reduced && !res.Allowed), Status: http.StatusOK,
		RetryAfterMs: ms(d.RetryAfter), DelayMs: ms(res.Delay),
		Statuses: make([]StatusJSON, len(res.Statuses), len(res.Statuses)+len(res.MissingKey)), Headers: map[string]string{},
	}
	if !res.Allowed {
		resp.Status = httplimit.Status(res)
	}
	if res.Degraded() {
		resp.Degraded, resp.DegradedReason = true, degradedReason(res.StoreError)
	}
	resp.Detail = res.Invalid
	for i := range res.Statuses {
		st := &res.Statuses[i]
		resp.Statuses[i] = StatusJSON{
			Rule: st.Rule, Allowed: st.Allowed, Shadow: st.Shadow, Reason: reasonOf(st.Reason, st.Reduced),
			Limit: st.Limit.Rate, PeriodSeconds: st.Limit.Period.Seconds(), Burst: st.Limit.Capacity(),
			Remaining: st.Remaining, ResetAfterMs: ms(st.ResetAfter), RetryAfterMs: ms(st.RetryAfter), DelayMs: ms(st.Delay),
			Override: st.Override,
		}
	}
	for _, o := range res.Overrides {
		resp.Overrides = append(resp.Overrides, AppliedOverrideJSON{Rule: o.Rule, ID: o.ID, Action: string(o.Action)})
	}
	// Rules skipped for a missing key are listed too, so that a request
	// that forgot its API key can see which rules did not apply to it.
	for _, sk := range res.MissingKey {
		resp.Statuses = append(resp.Statuses, StatusJSON{Rule: sk.Rule, Allowed: true, Reason: sluice.ReasonMissingKey.String(),
			Limit: sk.Limit.Rate, PeriodSeconds: sk.Limit.Period.Seconds(), Burst: sk.Limit.Capacity(), Remaining: -1})
	}
	if res.Reservation != "" {
		resp.ID, resp.Deadline = res.Reservation, res.ReservationDeadline.UTC().Format(time.RFC3339Nano)
	}
	h := http.Header{}
	s.limiter.Headers(h, res)
	for k, v := range h {
		resp.Headers[httplimit.DisplayName(k)] = strings.Join(v, ", ")
	}
	return resp
}

// reasonOf names a decision's reason for the API: a refusal by an
// adaptive rule that the service's pressure reduced is reduced-capacity
// (answered 503, to retry once the pressure lifts), not limited (a quota
// the client spent, 429).
func reasonOf(r sluice.Reason, reduced bool) string {
	if reduced && r == sluice.ReasonLimited {
		return "reduced-capacity"
	}
	return r.String()
}

func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// decode reads a JSON body strictly: unknown fields, wrong types, trailing
// data and oversized bodies are 400 (or 413) problems naming the field.
//
// A body that is not valid UTF-8 is refused: JSON decoding would turn every
// invalid byte into U+FFFD, so "\xff" and "\xfe" would name one key.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil && !exactText(body) {
		writeBad(w, &badRequest{msg: "the body is not valid UTF-8 or has a lone surrogate escape (\\uD800-\\uDFFF): JSON cannot carry such a key value exactly"})
		return false
	}
	if err == nil {
		if bad, ok := exactNames(body, reflect.TypeOf(v)).(nameError); ok {
			writeBad(w, &badRequest{field: bad.field, msg: bad.msg})
			return false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON value")
	}
	if err == nil {
		return true
	}
	var (
		syntax  *json.SyntaxError
		typ     *json.UnmarshalTypeError
		tooBig  *http.MaxBytesError
		problem = &badRequest{msg: err.Error()}
	)
	switch {
	case errors.As(err, &tooBig):
		writeProblem(w, http.StatusRequestEntityTooLarge, "Content Too Large", fmt.Sprintf("the body is larger than %d bytes", maxBody), "")
		return false
	case errors.As(err, &syntax):
		problem.msg = fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, strings.TrimPrefix(syntax.Error(), "json: "))
	case errors.As(err, &typ):
		problem.field = typ.Field
		problem.msg = fmt.Sprintf("want %s, got a JSON %s", jsonKind(typ.Type), typ.Value)
	case errors.Is(err, io.EOF):
		problem.msg = "empty body: want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		problem.msg = "malformed JSON: the body ends too soon"
	case errors.As(err, new(errGivenTwice)):
		problem.msg = err.Error()
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		problem.field = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		problem.msg = "unknown field"
	}
	writeBad(w, problem)
	return false
}

// exactText reports whether the strings of a JSON body decode to exactly
// what was sent: the body is valid UTF-8 and every \u escape of a surrogate
// is one of a high-low pair. Go's decoder would otherwise replace each
// invalid byte or lone surrogate with U+FFFD, merging distinct keys.
func exactText(body []byte) bool {
	if !utf8.Valid(body) {
		return false
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' || i+1 >= len(body) {
			continue
		}
		i++ // the escaped character
		if body[i] != 'u' {
			continue
		}
		c, ok := hex4(body[i+1:])
		switch {
		case !ok:
			continue // malformed: the decoder refuses it
		case 0xDC00 <= c && c <= 0xDFFF:
			return false // a low surrogate with no high one before it
		case 0xD800 <= c && c <= 0xDBFF:
			rest := body[i+5:]
			if len(rest) < 6 || rest[0] != '\\' || rest[1] != 'u' {
				return false
			}
			if lo, ok := hex4(rest[2:]); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 10 // past the pair
		}
	}
	return true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func writeBad(w http.ResponseWriter, err error) {
	field := ""
	var br *badRequest
	if errors.As(err, &br) {
		field = br.field
	}
	writeProblem(w, http.StatusBadRequest, "Bad Request", err.Error(), field)
}

func writeProblem(w http.ResponseWriter, status int, title, detail, field string) {
	httplimit.WriteProblem(w, &httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail, Field: field})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	encode(w, v)
}

// encode writes v as JSON without HTML escapes: the answers are JSON for
// programs, never embedded in a page, and "<" reads better than "\u003c".
func encode(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// jsonKind names what a Go type is in JSON, for messages: a client sent
// JSON and should not read Go's type names.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another type"
}
