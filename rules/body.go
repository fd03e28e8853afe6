package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A key read from a body or a query is only as good as its agreement with
// the upstream: if sluice counts one value and the upstream acts on
// another, the limit protects nobody. Servers do not agree on how to read a
// body (Go matches JSON names in any case, Python reads NaN, Express
// inflates gzip and reads phone[]=x as phone, PHP and Django take the last
// of a repeated form field, a multipart parser skips the preamble that a
// form parser would read). So sluice reads a body every way a common
// server might, and the invariant is:
//
//	sluice counts a value v only if every reading that finds the field
//	finds v; if two readings could differ, or sluice cannot make one that
//	some server makes, the request is refused; the field is missing only
//	if no reading finds it.
//
// The readings, for a field name:
//
//   - JSON, for a body that is a JSON object after white space and a UTF-8
//     byte order mark, whatever its Content-Type (frameworks can be told to
//     parse JSON regardless): the top-level fields whose names match name in
//     any case (Go's encoding/json; Python and JavaScript take the exact
//     name, a subset), each a string or a number (numbers written as whole
//     numbers in another way, 8.8e12 or 8800000000000.0, read as the whole
//     number). A value that is not a string or a number (null, an array an
//     upstream may join into a string) cannot be counted: refused. A body
//     that starts as an object but that Go does not parse to its end
//     (NaN, which Python reads; nesting deeper than Go's 10,000, which V8
//     reads; data after the object) is unreadable: refused.
//   - A form, unless the Content-Type is JSON or multipart: pairs separated
//     by "&", and also by "&" or ";" (older Python split on both), names
//     and values percent-decoded. The field given twice (qs reads both,
//     joined by a comma; Go the first; PHP and Django the last), with a
//     malformed escape, or written as an array or object (phone[]=,
//     phone[0]=, phone.x=, which qs, PHP and Rails read as the field),
//     cannot be counted: refused. A query string is read the same way.
//   - Multipart (multipart/form-data): the part named name, without
//     preamble or epilogue, as every multipart parser reads it; two such
//     parts, a part with a file name, or a transfer encoding other than
//     7bit, 8bit or binary cannot be counted; a body that does not parse
//     is unreadable.
//
// The query string's field of the same name is one more reading, as
// Flask's request.values, Spring's getParameter and PHP's $_REQUEST merge
// the query and the body (appendValue).
//
// Before any reading, a body that is compressed (a Content-Encoding other
// than identity: Express inflates it), not UTF-8 or holding a NUL (Python
// detects UTF-16 and UTF-32 by their zero bytes), or declared in another
// charset is unreadable; one cut at MaxBodyBytes is too large (another copy
// of the field could lie beyond).
//
// A rule refuses what cannot be counted with 400, a body too large with
// 413 and an unreadable one with 415; a honest client, which sends one
// phone as UTF-8 JSON or a form, meets none of them.
func bodyValue(body []byte, truncated bool, h http.Header, name string) (string, KeyState) {
	if truncated {
		return "", KeyBodyTooLarge
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "", KeyMissing
	}
	for _, enc := range h.Values("Content-Encoding") {
		for e := range strings.SplitSeq(enc, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return "", KeyUnreadable
			}
		}
	}
	mt, params, ok := contentType(h)
	if !ok || bytes.IndexByte(body, 0) >= 0 || !utf8.Valid(body) {
		return "", KeyUnreadable
	}
	if mt == "multipart/form-data" {
		return multipartValue(body, params["boundary"], name)
	}
	var r reading
	trimmed := bytes.TrimLeft(bytes.TrimPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("\xef\xbb\xbf")), " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		r.add(jsonValue(trimmed, name))
	}
	if !isJSONType(mt) && !strings.HasPrefix(mt, "multipart/") {
		// body-parser drops a byte order mark before a form, as before JSON.
		r.add(formValue(string(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))), name))
	}
	return r.result()
}

// reading gathers what several readings of one field find.
type reading struct {
	v     string
	found bool
	state KeyState // KeyFound until a reading refuses
}

func (r *reading) add(v string, state KeyState) {
	switch {
	case r.state != KeyFound:
	case state == KeyFound && r.found && v != r.v:
		r.state = KeyAmbiguous
	case state == KeyFound:
		r.v, r.found = v, true
	case state != KeyMissing:
		r.state = state
	}
}

func (r *reading) result() (string, KeyState) {
	switch {
	case r.state != KeyFound:
		return "", r.state
	case !r.found:
		return "", KeyMissing
	}
	return r.v, KeyFound
}

// contentType is the request's media type, in lower case, and its
// parameters. A type Go's parser refuses is not ok: servers cut a malformed
// type in different places (PHP at ";", "," or a space, others at ";"
// only) and would dispatch it to different parsers. So are lines that
// disagree, and a charset other than UTF-8 (or its subset US-ASCII).
func contentType(h http.Header) (string, map[string]string, bool) {
	lines := h.Values("Content-Type")
	if len(lines) == 0 || len(lines) == 1 && strings.TrimSpace(lines[0]) == "" {
		return "", nil, true
	}
	for _, l := range lines[1:] {
		if l != lines[0] {
			return "", nil, false
		}
	}
	mt, params, err := mime.ParseMediaType(lines[0])
	if err != nil || !utf8Charset(params["charset"]) {
		return "", nil, false
	}
	return mt, params, true
}

// utf8Charset reports whether a charset parameter, if any, names UTF-8.
func utf8Charset(cs string) bool {
	return cs == "" || strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "utf8") || strings.EqualFold(cs, "us-ascii")
}

func isJSONType(mt string) bool {
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// jsonValue reads a top-level field of a JSON object (see bodyValue).
func jsonValue(body []byte, name string) (string, KeyState) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", KeyUnreadable
	}
	var r reading
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", KeyUnreadable
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", KeyUnreadable
		}
		if !strings.EqualFold(key, name) {
			continue
		}
		if v, ok := scalar(raw); ok {
			r.add(v, KeyFound)
		} else {
			r.add("", KeyAmbiguous)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return "", KeyUnreadable
	}
	if _, err := dec.Token(); err != io.EOF { // and nothing after it
		return "", KeyUnreadable
	}
	return r.result()
}

// scalar is a JSON string's text, or a whole number's decimal digits
// (8.8e12 and 8800000000000.0 are 8800000000000, as a server that reads a
// number and prints it as an integer has it). A number with a fraction, or
// too large for a float64 to hold exactly (2^53), is not a value every
// server reads alike (Python's int() drops the fraction, JavaScript keeps
// it and rounds large numbers): not ok, like null, booleans, arrays and
// objects.
func scalar(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	if raw[0] == '"' {
		var s string
		return s, json.Unmarshal(raw, &s) == nil
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return "", false // null, true, false, an array or an object
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) >= 1<<53 {
		return "", false
	}
	return strconv.FormatInt(int64(f), 10), true
}

// formValue reads a field of a form body or a query string (see
// bodyValue): its one value, or values that agree, whether ";" separates
// pairs (older Python) or not (everyone else).
func formValue(raw, name string) (string, KeyState) {
	var r reading
	r.add(formPairs(raw, "&", name))
	if strings.IndexByte(raw, ';') >= 0 {
		r.add(formPairs(raw, "&;", name))
	}
	return r.result()
}

// formPairs reads the field name of a form whose pairs are separated by
// any byte of seps.
func formPairs(raw, seps, name string) (string, KeyState) {
	var r reading
	for raw != "" {
		var pair string
		if i := strings.IndexAny(raw, seps); i >= 0 {
			pair, raw = raw[:i], raw[i+1:]
		} else {
			pair, raw = raw, ""
		}
		k, val, _ := strings.Cut(pair, "=")
		key, err := unescapeForm(k)
		if err != nil {
			key = k // as servers that keep a malformed escape read it
		}
		switch fieldOf(key, name) {
		case fieldNot:
		case fieldArray:
			r.add("", KeyAmbiguous) // phone[]=x: qs and PHP read an array named phone
		case fieldIs:
			if r.found {
				r.add("", KeyAmbiguous) // given twice: qs reads "a,b", Go the first, PHP the last
				break
			}
			v, err := unescapeForm(val)
			if err != nil {
				r.add("", KeyAmbiguous) // Go refuses the form, Python keeps "%zz"
			} else {
				r.add(v, KeyFound)
			}
		}
	}
	return r.result()
}

func unescapeForm(s string) (string, error) {
	if !strings.ContainsAny(s, "%+") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b.WriteByte(' ')
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", errMalformedEscape
			}
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

var errMalformedEscape = errors.New("malformed percent-escape")

// multipartValue reads the parts of a multipart/form-data body named name
// (see bodyValue). Parsers differ on part headers that are not in the
// form a browser writes (Werkzeug keeps the last of two name parameters,
// Go lets name* win, PHP ignores name*, Go skips a disposition it cannot
// parse while others read its name), so any part whose headers are not in
// that form makes the body unreadable: one Content-Disposition, form-data,
// parsed by Go's strict parser, with a name and no name*. The part named
// name must also be text in UTF-8 (busboy decodes a part whose charset is
// base64).
func multipartValue(body []byte, boundary, name string) (string, KeyState) {
	if boundary == "" {
		return "", KeyUnreadable
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var r reading
	for {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			return r.result()
		}
		if err != nil {
			return "", KeyUnreadable
		}
		key, ok := partName(p.Header)
		if !ok {
			return "", KeyUnreadable
		}
		switch fieldOf(key, name) {
		case fieldNot:
		case fieldArray:
			r.add("", KeyAmbiguous)
		case fieldIs:
			_, ctParams, ctErr := mime.ParseMediaType(p.Header.Get("Content-Type"))
			cte := strings.ToLower(p.Header.Get("Content-Transfer-Encoding"))
			switch {
			case r.found:
				r.add("", KeyAmbiguous) // given twice: multer reads both
			case p.FileName() != "" || cte != "" && cte != "7bit" && cte != "8bit" && cte != "binary":
				r.add("", KeyAmbiguous)
			case p.Header.Get("Content-Type") != "" && (ctErr != nil || !utf8Charset(ctParams["charset"])):
				return "", KeyUnreadable
			default:
				v, err := io.ReadAll(p)
				if err != nil {
					return "", KeyUnreadable
				}
				r.add(string(v), KeyFound)
			}
		}
	}
}

// partName is a multipart part's field name, if its Content-Disposition is
// in the one form every parser reads alike (see multipartValue).
func partName(h textproto.MIMEHeader) (string, bool) {
	cd := h.Values("Content-Disposition")
	if len(cd) != 1 {
		return "", false
	}
	disp, params, err := mime.ParseMediaType(cd[0])
	if err != nil || disp != "form-data" || params["name"] == "" {
		return "", false
	}
	for _, p := range strings.Split(cd[0], ";")[1:] {
		k, _, _ := strings.Cut(p, "=")
		if k = strings.ToLower(strings.TrimSpace(k)); strings.HasPrefix(k, "name*") {
			return "", false
		}
	}
	return params["name"], true
}

// How a form or part name relates to a field.
const (
	fieldNot   = iota
	fieldIs    // the field itself
	fieldArray // the field as an array or object: phone[], phone[0], phone.x
)

// fieldOf says whether key, a decoded form or part name, is the field name
// as some server reads it: as it is, or as PHP rewrites names (leading
// spaces dropped, cut at a NUL, " " and "." read as "_").
func fieldOf(key, name string) int {
	for _, k := range [2]string{key, phpName(key)} {
		switch {
		case k == name:
			return fieldIs
		case strings.HasPrefix(k, name) && len(k) > len(name) && (k[len(name)] == '[' || k[len(name)] == '.'):
			return fieldArray
		}
	}
	return fieldNot
}

// phpName is a form name as PHP registers it.
func phpName(k string) string {
	if !strings.ContainsAny(k, " .\x00") {
		return k // the common case, without allocating
	}
	if i := strings.IndexByte(k, 0); i >= 0 {
		k = k[:i]
	}
	k = strings.TrimLeft(k, " ")
	end := len(k)
	if i := strings.IndexByte(k, '['); i >= 0 {
		end = i // what follows a [ is kept as it is
	}
	return strings.NewReplacer(" ", "_", ".", "_").Replace(k[:end]) + k[end:]
}
